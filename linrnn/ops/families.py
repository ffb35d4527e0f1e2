"""The family ops by name: one resolver for every API that takes "an op" (``linrnn.step``,
``linrnn.distributed.context_parallel``), so each accepts a family's name and its function
alike and refuses anything else with the same message."""

from __future__ import annotations

from linrnn.ops.delta_rule import delta_rule, gated_delta_rule
from linrnn.ops.gla import gla
from linrnn.ops.linear_attn import linear_attn
from linrnn.ops.mamba2 import mamba2
from linrnn.ops.mlstm import mlstm
from linrnn.ops.retention import retention
from linrnn.ops.rwkv6 import rwkv6
from linrnn.ops.simple_gla import simple_gla

OPS = {
    "linear_attn": linear_attn,
    "retention": retention,
    "simple_gla": simple_gla,
    "gla": gla,
    "rwkv6": rwkv6,
    "mlstm": mlstm,
    "delta_rule": delta_rule,
    "gated_delta_rule": gated_delta_rule,
    "mamba2": mamba2,
}


def resolve(op) -> tuple[str, object]:
    """``(name, function)`` of ``op``: a family name (``"gla"``) or its function
    (``linrnn.gla``). ValueError for an unknown name, TypeError for anything else."""
    if isinstance(op, str):
        if op not in OPS:
            raise ValueError(f"op must be one of {list(OPS)} or one of those functions, got {op!r}")
        return op, OPS[op]
    for name, fn in OPS.items():
        if op is fn:
            return name, fn
    raise TypeError(
        f"op must be a family name ({', '.join(OPS)}) or one of the linrnn op functions, got {op!r}"
    )


def resolve_callable(op):
    """The function of ``op`` for APIs that run any op-like callable (``linrnn.step``): a family
    name resolves as in :func:`resolve`, a callable passes as it is (a wrapper of an op)."""
    if isinstance(op, str):
        return resolve(op)[1]
    if not callable(op):
        raise TypeError(
            f"op must be a family name ({', '.join(OPS)}) or an op function, got {op!r}"
        )
    return op
