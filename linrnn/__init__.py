"""linrnn: fast, correct kernels for linear attention and the linear RNNs that share its
structure (causal linear attention, retention, simple GLA, GLA, RWKV6, mLSTM).

Every op takes ``[B, T, H, K]`` inputs and returns ``(o, final_state)``; see DESIGN.md and
each op's docstring.
"""

from linrnn.ops import gla, linear_attn, mlstm, retention, rwkv6, simple_gla

__version__ = "0.1.0"
__all__ = ["gla", "linear_attn", "mlstm", "retention", "rwkv6", "simple_gla"]
