"""Former name of the differentiable recurrence; see :mod:`linrnn.engine.recurrent`."""

from __future__ import annotations

from linrnn.engine.recurrent import fp32_contiguous, prepare_state, recurrent

__all__ = ["fp32_contiguous", "prepare_state", "recurrent"]
