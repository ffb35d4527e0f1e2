"""linrnn: fast, correct kernels for linear attention and the linear RNNs that share its
structure (causal linear attention, retention, simple GLA, GLA, RWKV6, mLSTM).

Every op takes ``[B, T, H, K]`` inputs and returns ``(o, final_state)``; see DESIGN.md and
each op's docstring.
"""

from linrnn.ops import gla, linear_attn, mlstm, retention, rwkv6, simple_gla
from linrnn.ops.step import (
    gla_step,
    linear_attn_step,
    mlstm_step,
    retention_step,
    rwkv6_step,
    simple_gla_step,
    step,
)

__version__ = "0.1.0"
__all__ = [
    "gla",
    "gla_step",
    "linear_attn",
    "linear_attn_step",
    "mlstm",
    "mlstm_step",
    "retention",
    "retention_step",
    "rwkv6",
    "rwkv6_step",
    "simple_gla",
    "simple_gla_step",
    "step",
]
