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

Repeated steps skip their host logic: from the third step with the same signature (shapes,
strides, dtypes, devices of the tensors, the other arguments) the step replays the device work
it logged on the second (:mod:`linrnn.engine.replay`; docs/DESIGN.md §8): the same kernels on
the same data, bitwise the same results, at a fraction of the host time. Steps with data checks
on (CPU tensors by default), with gradients, while torch.compile traces, with ``cu_seqlens``,
or through a wrapper of an op take the ordinary path every time.
"""

from __future__ import annotations

import functools
import os

import torch

from linrnn import _runtime
from linrnn import _validation as check
from linrnn.engine.replay import record
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
    if op.__class__ is functools.partial and op.func in _FAMILY_OPS:  # the same call, unfolded
        op, inputs, kwargs = op.func, (*op.args, *inputs), {**op.keywords, **kwargs}
    sig = _signature(op, inputs, state, kwargs, inplace)
    if sig is None:
        return _step(op, inputs, state, inplace, kwargs)
    key, tensors = sig
    try:
        entry = _PLANS.get(key, _NEW)
    except TypeError:  # an unhashable argument
        return _step(op, inputs, state, inplace, kwargs)
    if entry is _NEW:  # the first call fills the lazy caches (compilation, probes) unrecorded
        if len(_PLANS) < MAX_PLANS:
            _PLANS[key] = _SEEN
        return _step(op, inputs, state, inplace, kwargs)
    if entry is _SEEN:
        result, replay, slot_of, _ = record(lambda: _step(op, inputs, state, inplace, kwargs),
                                            tensors)  # fmt: skip
        _PLANS[key] = None if replay is None else _plan(replay, slot_of, result, state, inplace)
        return result
    if entry is not None:
        replay, o_slot, state_slots = entry
        env = replay.run(tensors)
        if env is not None:
            if state_slots is None:  # in place: the caller's state object itself
                return env[o_slot], state
            if state_slots.__class__ is int:
                return env[o_slot], env[state_slots]
            return env[o_slot], tuple(None if s is None else env[s] for s in state_slots)
    return _step(op, inputs, state, inplace, kwargs)


def _step(op, inputs, state, inplace, kwargs):
    """The step's ordinary path: the op's checks, routing and host, then the kernel."""
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


# Replayed steps (linrnn.engine.replay): the second step of a family op with a signature — every
# tensor's shape, strides, dtype, device and 16-byte alignment, the other arguments with their
# types, grad mode and the data-check setting — is recorded, and from the third on the steps of
# that signature replay its logged device work (allocations, casts, kernel launches) without
# its checks, routing and host. A signature whose
# recording was refused (the call read a value, used a cached tensor, …) keeps the ordinary
# path; so do steps with data checks on (always on CPU tensors by default: they read values),
# while torch.compile traces, with gradients, and for ops that are not linrnn's own functions
# (a wrapper may do anything between calls).
MAX_PLANS = 256  # signatures kept (past the cap new ones take the ordinary path)
# signature -> _SEEN (called once), (Replay, o's slot, the new state's slots), None (refused)
_PLANS: dict = {}
_NEW, _SEEN = object(), object()
_TENSORS = (torch.Tensor, torch.nn.Parameter)
_PLAIN = frozenset((type(None), bool, int, float, str))


def _signature(op, inputs, state, kwargs, inplace):
    """``(key, tensors)`` of a step that may replay, or None (see above)."""
    checks = _runtime.get_checks()
    if checks is True or op not in _FAMILY_OPS or torch.compiler.is_compiling():
        return None
    if kwargs.get("cu_seqlens") is not None:  # its values decide the call: read as a list
        return None
    grad = torch.is_grad_enabled()
    parts = state if state.__class__ in (tuple, list) else (state,)
    key = [op, inplace.__class__, inplace, grad, checks, state.__class__, len(inputs)]
    add = key.append
    tensors = []
    for x in (*inputs, *parts, *kwargs.values()):
        cls = x.__class__
        if cls in _TENSORS:
            if grad and x.requires_grad:
                return None
            tensors.append(x)
            add((x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15))
        elif cls not in _PLAIN and isinstance(x, torch.Tensor):  # a subclass: its own dispatch
            return None
        else:
            add((cls, x))
    if not tensors or len(set(map(id, tensors))) != len(tensors):
        return None  # (one tensor in two parts: the log could not tell them apart)
    if not tensors[0].is_cuda:
        if checks is None:
            return None  # CPU tensors: data checks on by default
        add(os.environ.get("TRITON_INTERPRET"))
    key += kwargs  # the names (their values are in order above)
    return tuple(key), tensors  # (hashed once, by the lookup: it may be unhashable)


def _plan(replay, slot_of, result, state, inplace):
    """The entry of a recorded step, or None when its result holds a tensor the log lacks."""
    o, new = result
    o_slot = slot_of(id(o)) if isinstance(o, torch.Tensor) else None
    if o_slot is None:
        return None
    if inplace:
        return replay, o_slot, None
    if isinstance(new, torch.Tensor):
        s = slot_of(id(new))
        return None if s is None else (replay, o_slot, s)
    if not isinstance(new, tuple):
        return None
    slots = tuple(None if x is None else slot_of(id(x)) for x in new)
    if any(s is None for s, x in zip(slots, new) if x is not None):
        return None
    return replay, o_slot, slots


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

_FAMILY_OPS = frozenset((linear_attn, retention, simple_gla, gla, rwkv6, mlstm, delta_rule,
                         gated_delta_rule, mamba2))  # fmt: skip
