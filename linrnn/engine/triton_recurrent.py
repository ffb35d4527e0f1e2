"""Former name of the recurrent forward; see :mod:`linrnn.engine.recurrent`."""

from __future__ import annotations

from linrnn.engine.recurrent import STEP_TILE, forward
from linrnn.engine.recurrent import value_tile as _value_tile
from linrnn.engine.recurrent_kernels import recurrent_fwd_kernel

__all__ = ["STEP_TILE", "_value_tile", "recurrent", "recurrent_fwd_kernel"]


def recurrent(q, k, v, **kwargs):
    """:func:`linrnn.engine.recurrent.forward` without ``save``: ``(o, S_T, n_T, m_T)``."""
    return forward(q, k, v, **kwargs)[0]
