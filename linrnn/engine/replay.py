"""Recording one eager call's device work once and replaying it without the host logic.

A decode step's host time is spent deciding things that depend only on its inputs' metadata
(shapes, strides, dtypes, devices) and its non-tensor arguments: the op's checks, the routing,
the host's tiles and flags, the launch's arguments. For a repeated call with the same metadata
the decisions come out the same, and what reaches the device is the same sequence of tensor
operations and kernel launches on tensors that play the same parts. :func:`record` runs a call
once and logs that sequence, every tensor named by its part (a *slot*): an input of the call,
or the output of an earlier operation in it; :meth:`Replay.run` performs the sequence again on
new inputs, with fresh outputs where the call made fresh tensors, and nothing else.

What the log holds:

* every ATen operation the call dispatches (a ``TorchDispatchMode``; allocations, casts, copies,
  views), its tensor arguments as slots and the rest as values;
* every kernel launched through :func:`linrnn.engine.launch.launch`, with the compiled kernel
  Triton returned for it (the replay calls its launcher directly, as ``launch`` does from the
  second call on) or, under the interpreter, the kernel to call again.

A recording is refused — the caller then keeps its ordinary path for that signature — when the
call's device work is not a function of the metadata alone, or when the log cannot show it all:

* the host reads a tensor value (``.item()``, ``.tolist()``, ``bool(t)``, ``.numpy()``, a value
  check — a ``TorchFunctionMode`` sees those methods), or an operation returns a Python number:
  the call may have decided on the value;
* an operation takes a tensor that is neither an input nor made within the call (a cached
  tensor the replay could not know is still the same);
* a Triton kernel is launched other than through ``launch`` (Triton's launch hook counts every
  launch while recording), or with options besides ``num_warps`` and ``num_stages``;
* a launch hook (a profiler's) is already set, or Triton's debug switch is on.

The caller owns the key: it must hold everything the call's host logic reads — each input
tensor's shape, strides, dtype, device and 16-byte alignment (the compiled kernels specialize on
it), the non-tensor arguments with their types, and the global state the path depends on (grad
mode, the data-check setting). Tensors the call allocates come from PyTorch's allocator, whose
blocks are aligned far beyond 16 bytes, so their alignment is the recording's. A replay also
declines (returns None) while a launch hook or Triton's debug switch is set, so that profilers
see the launches the ordinary path makes.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from linrnn.engine import launch as _launch

_DETACH = torch.ops.aten.detach.default
# ATen operations replayed through their public functions (the same arguments and kernels; half
# the time of an OpOverload call from Python or less).
_aten = torch.ops.aten
_PUBLIC = {
    _aten.empty_like.default: torch.empty_like,
    _aten.empty.memory_format: torch.empty,
    _aten.view.default: torch.Tensor.view,
    _aten.expand.default: torch.Tensor.expand,  # (only without keywords: no implicit=)
    _aten.transpose.int: torch.transpose,
}
_TO_KWARGS = frozenset(("dtype", "device", "non_blocking", "memory_format"))
# Operations of two outputs whose second (a buffer for the backward) nothing reads in the log:
# the public function of the first alone.
_FIRST_OUTPUT = {_aten.log_sigmoid_forward.default: torch.nn.functional.logsigmoid}


def _public(func, kwargs: dict):
    """The public function replaying ``func`` with these keyword arguments (or ``func``)."""
    if func is _aten._to_copy.default and _TO_KWARGS.issuperset(kwargs):
        return _copy_to
    if func is _aten.expand.default and kwargs:
        return func
    return _PUBLIC.get(func, func)


def _copy_to(x, **kwargs):
    return x.to(copy=True, **kwargs)


class Refused(Exception):
    """Raised while logging an event the replay could not perform (the message says why); the
    recording stops logging, the call itself goes on."""


class _Op:
    """One logged ATen operation: ``func(*args, **kwargs)`` with the tensors substituted, its
    tensor outputs stored into slots ``outs`` (None: the output is not a tensor structure the
    replay needs); ``view_of``: for a view at its input's own address, that input's slot."""

    __slots__ = ("args", "func", "kw_subs", "kwargs", "outs", "subs", "view_of")

    def __init__(self, func, args, kwargs, subs, kw_subs, outs, view_of=None):
        self.func, self.args, self.kwargs = func, args, kwargs
        self.subs, self.kw_subs, self.outs, self.view_of = subs, kw_subs, outs, view_of

    def slots_read(self):
        for _, s in (*self.subs, *self.kw_subs):
            yield from (s,) if s.__class__ is int else s[1]


class _Launch:
    """One logged kernel launch: its parameters' values in launch order with the tensors
    substituted; ``compiled`` the kernel Triton compiled for them (``call``, its launcher with
    the grid bound, is called directly), or None to call ``kernel[grid](**kwargs)`` again (the
    interpreter, stand-ins)."""

    __slots__ = ("args", "call", "compiled", "grid", "kernel", "names", "subs")

    def __init__(self, kernel, compiled, grid, names, args, subs):
        self.kernel, self.compiled, self.grid = kernel, compiled, grid
        self.names, self.args, self.subs = names, args, subs
        self.call = None if compiled is None else _launch.launcher(compiled, grid)

    def slots_read(self):
        for _, s in self.subs:
            yield from (s,) if s.__class__ is int else s[1]


class Replay:
    """The logged device work of one call (:func:`record`); :meth:`run` performs it again."""

    __slots__ = ("events", "n_inputs", "n_slots")

    def __init__(self, events, n_inputs: int, n_slots: int):
        self.events, self.n_inputs, self.n_slots = events, n_inputs, n_slots

    def run(self, inputs: list) -> list | None:
        """Perform the logged work on ``inputs`` (the same parts, in the same order, as the
        recording's); returns every slot's tensor (inputs first), or None when a launch hook or
        Triton's debug switch is set now (the caller takes its ordinary path)."""
        if _launch.hooked():
            return None
        env = inputs + [None] * (self.n_slots - self.n_inputs)
        for ev in self.events:
            args = list(ev.args)
            for p, s in ev.subs:
                args[p] = env[s] if s.__class__ is int else s[0](env[i] for i in s[1])
            if ev.__class__ is _Launch:
                if ev.call is not None:
                    ev.call(args)
                else:
                    ev.kernel[ev.grid](**dict(zip(ev.names, args)))
                continue
            kwargs = ev.kwargs
            if ev.kw_subs:
                kwargs = dict(kwargs)
                for name, s in ev.kw_subs:
                    kwargs[name] = env[s]
            out = ev.func(*args, **kwargs)
            outs = ev.outs
            if outs.__class__ is int:
                env[outs] = out
            elif outs is not None:
                for j, s in enumerate(outs):
                    env[s] = out[j]
        return env


class _Recording:
    """The log under construction: tensors by identity → slot, the events, the JIT launches
    that went through :func:`launch.launch` and those Triton's hook saw."""

    def __init__(self, inputs: list):
        self.slots = {}
        for i, t in enumerate(inputs):
            self.slots.setdefault(id(t), i)
        self.keep = list(inputs)  # the tensors seen stay alive: their ids stay theirs
        self.events: list = []
        self.paused = False
        self.why: str | None = None  # why the recording was refused (it logs nothing more)
        self.logged = 0  # JIT launches logged
        self.seen = 0  # JIT launches Triton's launch hook saw

    def slot(self, t) -> int:
        i = self.slots.get(id(t))
        if i is None:
            raise Refused(
                f"a tensor that is neither an input nor made within the call ({t.dtype} "
                f"{tuple(t.shape)})"
            )
        return i

    def _template(self, values):
        """(values with the tensors blanked, [(position, slot or (type, slots))])."""
        out, subs = list(values), []
        for p, a in enumerate(values):
            if isinstance(a, torch.Tensor):
                subs.append((p, self.slot(a)))
                out[p] = None
            elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
                if not all(isinstance(x, torch.Tensor) for x in a):
                    raise Refused("a sequence mixing tensors and other values")
                subs.append((p, (type(a), tuple(self.slot(x) for x in a))))
                out[p] = None
        return tuple(out), subs

    def _bind(self, t) -> int:
        i = self.slots.get(id(t))
        if i is None:
            i = self.slots[id(t)] = len(self.keep)
            self.keep.append(t)
        return i

    def refuse(self, why: str) -> None:
        self.why, self.paused = why, True

    def op(self, func, args, kwargs, out) -> None:
        try:
            self._op(func, args, kwargs, out)
        except Refused as e:
            self.refuse(str(e))

    def _op(self, func, args, kwargs, out) -> None:
        if func is _DETACH and not args[0].requires_grad:
            # (PyTorch detaches new tensors under a mode: the same data, nothing to perform)
            self.slots[id(out)] = self.slot(args[0])
            self.keep.append(out)
            return
        targs, subs = self._template(args)
        kw_subs = []
        for name, a in kwargs.items():
            if isinstance(a, torch.Tensor):
                kw_subs.append((name, self.slot(a)))
            elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
                raise Refused(f"{func}: a tensor sequence as keyword argument {name!r}")
        if isinstance(out, torch.Tensor):
            outs = self._bind(out)
        elif isinstance(out, (list, tuple)) and all(isinstance(x, torch.Tensor) for x in out):
            outs = tuple(self._bind(x) for x in out)
        elif out is None:
            outs = None
        else:
            raise Refused(f"{func} returned {type(out).__name__}: the host read a value")
        view_of = None
        if outs.__class__ is int and subs and _is_view(func):
            base = args[subs[0][0]]
            if isinstance(base, torch.Tensor) and out.data_ptr() == base.data_ptr():
                view_of = subs[0][1]
        func = _public(func, kwargs)
        self.events.append(_Op(func, targs, dict(kwargs), subs, kw_subs, outs, view_of))

    def launch(self, kernel, grid, kwargs) -> None:
        """Run ``kernel[grid](**kwargs)`` (not logged as ATen work) and log it."""
        paused, self.paused = self.paused, True  # the interpreter's own tensor copies are not
        try:  # the call's work
            compiled = kernel[grid](**kwargs)
        finally:
            self.paused = paused
        if self.why is None:
            try:
                self._launch(kernel, grid, kwargs, compiled)
            except Refused as e:
                self.refuse(str(e))

    def _launch(self, kernel, grid, kwargs, compiled) -> None:
        plan = _launch.plan(kernel)
        if plan is None:  # the interpreter or a stand-in: called again by name, options too
            names, compiled = tuple(kwargs), None
        else:  # the compiled launcher: every parameter in order (the options are compiled in)
            names, extra = plan.names, set(kwargs).difference(plan.names)
            if not extra.issubset(_launch.OPTIONS) or not _launch.is_compiled(compiled):
                raise Refused(f"{kernel}: options {sorted(extra)} or no compiled kernel")
            if not set(names).issubset(kwargs):
                raise Refused(f"{kernel}: parameters left to their defaults")
            self.logged += 1
        args, subs = self._template([kwargs[n] for n in names])
        self.events.append(_Launch(kernel, compiled, tuple(grid), names, args, subs))


def _is_view(func) -> bool:
    """Whether the ATen operation returns a view of an input (its schema's alias annotation
    on the output, without a write: ``Tensor(a)``, not ``Tensor(a!)``)."""
    returns = func._schema.returns
    alias = returns[0].alias_info if len(returns) == 1 else None
    return alias is not None and not alias.is_write


def _slimmed(events: list, keep: set) -> list:
    """The events without the views at their input's address that only kernel launches read,
    directly or through further such views (a compiled launcher takes a tensor's address
    alone, so those launches get the input itself: a view costs a dispatch per step), and with
    :data:`_FIRST_OUTPUT`'s operations through their public functions where nothing reads the
    second output. ``keep``: slots the caller returns."""
    read = set(keep).union(*(ev.slots_read() for ev in events))
    for ev in events:
        if ev.__class__ is _Op and ev.func in _FIRST_OUTPUT and ev.outs[1] not in read:
            ev.func, ev.outs = _FIRST_OUTPUT[ev.func], ev.outs[0]
    # readers of each slot that need a tensor there: operations, launches called by name (the
    # interpreter's take views), the caller
    readers = Counter(keep)
    for ev in events:
        if ev.__class__ is _Op or ev.compiled is None:
            readers.update(ev.slots_read())
    left_out = set()
    for n in reversed(range(len(events))):  # a view read only by left-out views goes too
        ev = events[n]
        if ev.__class__ is _Op and ev.view_of is not None and readers[ev.outs] == 0:
            left_out.add(n)
            readers.subtract(ev.slots_read())
    same, out = {}, []
    for n, ev in enumerate(events):
        if n in left_out:
            same[ev.outs] = same.get(ev.view_of, ev.view_of)
            continue
        if ev.__class__ is _Launch and same:
            ev.subs = [(p, same.get(s, s) if s.__class__ is int else s) for p, s in ev.subs]
        out.append(ev)
    return out


def _tensors(obj):
    """The tensors in a call's result (nested tuples and lists)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _tensors(x)


class _Log(TorchDispatchMode):
    """Logs every ATen operation into the recording (except while it is paused)."""

    def __init__(self, rec: _Recording):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.rec.paused:
            self.rec.op(func, args, kwargs, out)
        return out


_READ_NAMES = ("tolist", "numpy", "item", "__bool__", "__int__", "__float__", "__index__",
               "__complex__", "__array__")  # fmt: skip
_READS = frozenset(getattr(torch.Tensor, name) for name in _READ_NAMES)


class _Reads(TorchFunctionMode):
    """Refuses the recording when the host reads a tensor value (except while it is paused)."""

    def __init__(self, rec: _Recording):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _READS and not self.rec.paused:
            self.rec.refuse(f"the host read a value ({func.__name__})")
        return func(*args, **(kwargs or {}))


def record(call, inputs: list):
    """Run ``call()`` once, logging its device work with ``inputs`` (tensors) as the first
    slots. Returns ``(result, replay, slot_of, why)``: the call's result, the :class:`Replay`
    (None when refused, module docstring, and ``why`` says why), and a function giving the slot
    of a tensor of the result (None for one the log does not hold)."""
    if _launch.hooked():
        return call(), None, None, "a launch hook or Triton's debug switch is set"
    rec = _Recording(inputs)

    def seen(*_):
        rec.seen += 1

    token = _launch.RECORDING.set(rec)
    _launch.add_hook(seen)
    try:
        with _Reads(rec), _Log(rec):
            result = call()
    finally:
        _launch.RECORDING.reset(token)
        _launch.remove_hook(seen)
    if rec.why is None and rec.seen != rec.logged:
        rec.why = f"{rec.seen} Triton launches, {rec.logged} of them through launch()"
    if rec.why is not None:
        return result, None, None, rec.why
    keep = {rec.slots[id(t)] for t in _tensors(result) if id(t) in rec.slots}
    events = _slimmed(rec.events, keep)
    return result, Replay(events, len(inputs), len(rec.keep)), rec.slots.get, None
