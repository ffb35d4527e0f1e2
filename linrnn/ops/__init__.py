"""Public functional ops, one thin front end per family over the shared generic engine."""

from linrnn.ops.delta_rule import delta_rule, gated_delta_rule
from linrnn.ops.gla import gla
from linrnn.ops.linear_attn import linear_attn
from linrnn.ops.mamba2 import mamba2
from linrnn.ops.mlstm import mlstm
from linrnn.ops.retention import retention
from linrnn.ops.rwkv6 import rwkv6
from linrnn.ops.simple_gla import simple_gla

__all__ = [
    "delta_rule",
    "gated_delta_rule",
    "gla",
    "linear_attn",
    "mamba2",
    "mlstm",
    "retention",
    "rwkv6",
    "simple_gla",
]
