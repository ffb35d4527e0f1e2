"""Compatibility names for the modules that still import the scalar host's helpers from here
(the vector host and the recurrent backward). The scalar host is :mod:`linrnn.engine.scalar`,
the shared gate-gradient helpers :mod:`linrnn.engine.gate_grads`, the call config
:mod:`linrnn.engine.config`; new code imports from those."""

from __future__ import annotations

from linrnn.engine import config
from linrnn.engine.config import FUSED_MAX_CHUNK, TILES  # noqa: F401
from linrnn.engine.config import ChunkConfig as Config  # noqa: F401
from linrnn.engine.gate_grads import Seqs as _Seqs  # noqa: F401
from linrnn.engine.gate_grads import chunk_local as _chunk_local  # noqa: F401
from linrnn.engine.gate_grads import final_grads as _final_grads  # noqa: F401
from linrnn.engine.gate_grads import gate_grads as _gate_grads  # noqa: F401
from linrnn.engine.gate_grads import route_argmax as _route  # noqa: F401
from linrnn.engine.gate_grads import rows as _rows  # noqa: F401
from linrnn.engine.scalar import _chunk_cumsum, _norm_rows  # noqa: F401


def default_chunk_size(K: int, V: int, fused: bool, vector: bool = False) -> int:
    """:func:`linrnn.engine.config.default_chunk_size` of the Triton path."""
    return config.default_chunk_size(K, V, fused=fused, vector=vector)
