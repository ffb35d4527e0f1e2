"""linrnn: fast, correct kernels for linear attention and the linear RNNs that share its
structure (causal linear attention, retention, simple GLA, GLA, RWKV6, mLSTM) and the delta
rule (DeltaNet, Gated DeltaNet).

Every op takes ``[B, T, H, K]`` inputs and returns ``(o, final_state)``; see docs/DESIGN.md and
each op's docstring. :mod:`linrnn.layers` has the ``nn.Module`` layers built on them and
:mod:`linrnn.models` a small causal language model; ``python -m linrnn.train`` trains one.
"""

from linrnn._runtime import checks, set_checks
from linrnn.ops import (
    delta_rule,
    gated_delta_rule,
    gla,
    linear_attn,
    mamba2,
    mlstm,
    retention,
    rwkv6,
    simple_gla,
)
from linrnn.ops.step import (
    delta_rule_step,
    gated_delta_rule_step,
    gla_step,
    linear_attn_step,
    mamba2_step,
    mlstm_step,
    retention_step,
    rwkv6_step,
    simple_gla_step,
    step,
)

from linrnn import graphs, layers, models  # isort: skip (the layers build on the ops above)

__version__ = "0.1.0"
__all__ = [
    "checks",
    "delta_rule",
    "delta_rule_step",
    "gated_delta_rule",
    "gated_delta_rule_step",
    "gla",
    "gla_step",
    "graphs",
    "layers",
    "linear_attn",
    "linear_attn_step",
    "mamba2",
    "mamba2_step",
    "mlstm",
    "mlstm_step",
    "models",
    "retention",
    "retention_step",
    "rwkv6",
    "rwkv6_step",
    "set_checks",
    "simple_gla",
    "simple_gla_step",
    "step",
]
