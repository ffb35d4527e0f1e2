"""The step API for decoding: advance a state by one token (or a few) with the recurrent form.

``linrnn.step(op, *inputs, state=..., inplace=False)`` runs ``op`` (any family function, e.g.
``linrnn.mlstm``, or its name, ``"mlstm"``) with ``mode="recurrent"`` from ``state`` and
returns ``(o, new_state)``.
``linrnn.<family>_step`` is the same with the op bound. On CUDA tensors without gradients it
runs the Triton recurrent kernel (one launch for the whole batch and all heads, state in
registers); elsewhere the PyTorch recurrence. Prefilling with ``mode="chunk"`` and then
stepping token by token equals one long call (the same recurrence, states in fp32).

With ``inplace=True`` the state tensors are updated in place (they must be the fp32 tensors an
op returned as its final state) and the same objects are returned: the Triton kernel then
writes the new state straight over the old one, so no copy is made.
"""

from __future__ import annotations

import torch

from linrnn import _runtime
from linrnn import _validation as check
from linrnn.ops import _generic
from linrnn.ops.delta_rule import delta_rule, gated_delta_rule
from linrnn.ops.families import resolve_callable
from linrnn.ops.gla import gla
from linrnn.ops.linear_attn import linear_attn
from linrnn.ops.mamba2 import mamba2
from linrnn.ops.mlstm import mlstm
from linrnn.ops.retention import retention
from linrnn.ops.rwkv6 import rwkv6
from linrnn.ops.simple_gla import simple_gla


def _parts(state):
    return list(state) if isinstance(state, (tuple, list)) else [state]


def step(op, *inputs, state, inplace: bool = False, **kwargs):
    """Advance ``state`` over the tokens of ``inputs`` (``[B, T, H, ·]``, usually T = 1) with
    ``op``'s recurrence; returns ``(o, new_state)``. ``kwargs`` go to ``op`` (gates by name,
    ``input_gate``, ``normalize``, ``scale``, ``backend`` …; not ``mode`` or the state
    arguments). ``op`` may be the family's name (``"gla"``), as for
    :func:`linrnn.distributed.context_parallel`. See the module docstring for ``inplace``."""
    op = resolve_callable(op)
    inplace = check.flag("inplace", inplace)
    for key in ("mode", "initial_state", "output_final_state"):
        if key in kwargs:
            raise TypeError(f"step() sets {key!r} itself; got {key}={kwargs[key]!r}")
    if state is None:
        raise ValueError("step() needs a state (e.g. the final_state of a prefill call)")
    parts = _parts(state)
    if inplace:
        for j, p in enumerate(parts):
            if not isinstance(p, torch.Tensor) or p.dtype != torch.float32:
                raise TypeError(
                    f"inplace=True needs the fp32 state tensors an op returned; state part {j} "
                    f"is {type(p).__name__ if not isinstance(p, torch.Tensor) else p.dtype}"
                )
    if _runtime.tracing():  # traced: a functional step; the copies below make it in place
        o, new = op(*inputs, initial_state=state, output_final_state=True, mode="recurrent",
                    **kwargs)  # fmt: skip
    else:
        target = _generic.OUT_STATE.set(parts if inplace else None)
        try:
            o, new = op(*inputs, initial_state=state, output_final_state=True,
                        mode="recurrent", **kwargs)  # fmt: skip
        finally:
            _generic.OUT_STATE.reset(target)
    if not inplace:
        return o, new
    for old, fresh in zip(parts, _parts(new)):
        if fresh is not old:
            old.copy_(fresh)
    return o, state


def _bind(op):
    def bound(*inputs, state, inplace: bool = False, **kwargs):
        return step(op, *inputs, state=state, inplace=inplace, **kwargs)

    bound.__name__ = bound.__qualname__ = f"{op.__name__}_step"
    bound.__doc__ = (
        f"``linrnn.step(linrnn.{op.__name__}, *inputs, state=state, inplace=inplace, ...)``: "
        f"advance a {op.__name__} state by the given tokens (see linrnn.ops.step)."
    )
    return bound


linear_attn_step = _bind(linear_attn)
retention_step = _bind(retention)
simple_gla_step = _bind(simple_gla)
gla_step = _bind(gla)
rwkv6_step = _bind(rwkv6)
mlstm_step = _bind(mlstm)
delta_rule_step = _bind(delta_rule)
gated_delta_rule_step = _bind(gated_delta_rule)
mamba2_step = _bind(mamba2)
