"""Launching the decode step's kernels without Triton's per-call binding.

``kernel[grid](**kwargs)`` binds every argument, asks the native specializer about each
(dtype, 16-byte alignment, integer divisibility), builds and hashes a cache key, and only then
calls the compiled launcher: a large share of an eager decode step's host time
(docs/tuning.md, "Host side"). :func:`launch` does that once per specialization: the first call
goes through ``kernel[grid]`` (which compiles, or finds Triton's own cached binary), and the
compiled kernel it returns is kept under a key that is at least as fine as Triton's:

* a tensor: its dtype and its address modulo 16 (Triton specializes on 16-byte alignment);
* a float: its type only (Triton passes floats as fp32 without specializing);
* a bool: the value and its type (Triton compiles a bool apart from the int 1);
* everything else (None, ints, the constexpr values): the value itself (Triton specializes
  ints on ``== 1`` and on divisibility by 16, and constexprs on their value);

with the current device and the launch options (``num_warps``, ``num_stages``). A later call
with the same key calls the compiled launcher directly. The rest of Triton's launch path is
either not needed here or sends the call down that path: launch hooks (a profiler's; the
empty default chain of Triton 3.6+ is not called) and Triton's debug switch go the plain way;
the check that a kernel's global constants are unchanged is left out (linrnn's kernels read
none that change). Under the interpreter, for anything but a Triton ``JITFunction`` (a test's
stand-in), and for a call whose arguments the key cannot hold (unhashable values, options
beyond the two), :func:`launch` is ``kernel[grid](**kwargs)``.
"""

from __future__ import annotations

import contextvars
from operator import itemgetter

import torch

try:
    from triton import knobs
    from triton.compiler import CompiledKernel
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
except ImportError:  # a Triton without these (the package requires 3.6+): the plain path
    JITFunction = None

# Compiled kernels kept per JITFunction at most (a decode step needs one to a few: T, the
# dtypes and the flags vary little between steps; past the cap a call takes the plain path).
MAX_ENTRIES = 64
OPTIONS = ("num_warps", "num_stages")

# A recording of linrnn.engine.replay in progress in this context: launch() hands it the call.
RECORDING: contextvars.ContextVar = contextvars.ContextVar("linrnn_recording", default=None)


def _getter(names: tuple):
    """``kwargs -> tuple`` of the values of ``names`` (in C: itemgetter), KeyError if one is
    missing; a tuple also for one name or none."""
    if len(names) > 1:
        return itemgetter(*names)
    return lambda kwargs: tuple(kwargs[n] for n in names)


class _Plan:
    """One kernel's parameters — getters of their values in launch order, of the constexprs'
    and of the runtime ones' — and its compiled kernels by key."""

    __slots__ = ("args", "compiled", "constexprs", "names", "runtime")

    def __init__(self, kernel):
        self.names = tuple(p.name for p in kernel.params)
        self.args = _getter(self.names)
        self.constexprs = _getter(tuple(p.name for p in kernel.params if p.is_constexpr))
        self.runtime = _getter(tuple(p.name for p in kernel.params if not p.is_constexpr))
        self.compiled: dict = {}


_PLANS: dict = {}  # id(kernel) -> (kernel, _Plan); the kernel kept so its id stays its own


# A runtime argument of these classes goes into the key as it is. A class test first:
# isinstance(x, torch.Tensor) costs about 0.3 µs for a non-tensor, and a decode launch has some
# 40 arguments, most of them None or ints. (Not bool: True == 1, but Triton compiles a bool
# argument and the int 1 differently.)
_AS_IS = frozenset((type(None), int))


def _spec(a):
    """The part of one runtime argument not of an :data:`_AS_IS` class that a compiled kernel
    depends on (module docstring)."""
    cls = a.__class__
    if cls is float:
        return float
    if cls is bool:
        return bool, a
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() & 15
    return a


def _hooked(hook) -> bool:
    """Whether a launch hook is set: a callable, or a chain of hooks (Triton 3.6+'s default
    is an empty ``HookChain``) with calls in it."""
    return hook is not None and bool(getattr(hook, "calls", True))


def hooked() -> bool:
    """Whether a launch hook (a profiler's) or Triton's debug switch is set: launches then go
    through ``kernel[grid]``, which calls the hooks and checks."""
    if JITFunction is None:
        return False
    rt = knobs.runtime
    return _hooked(rt.launch_enter_hook) or _hooked(rt.launch_exit_hook) or rt.debug


def add_hook(fn) -> None:
    """Add ``fn`` to Triton's launch-enter hooks (called with each launch's metadata)."""
    _edit_hooks(fn, add=True)


def remove_hook(fn) -> None:
    """Undo :func:`add_hook`."""
    _edit_hooks(fn, add=False)


def _edit_hooks(fn, add: bool) -> None:
    """Add ``fn`` to, or remove it from, Triton's launch-enter hooks: a chain (Triton 3.6+'s
    ``HookChain``) or a single slot."""
    if JITFunction is None:
        return
    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):
        chain.add(fn) if add else chain.remove(fn)
    elif add and chain is None:
        knobs.runtime.launch_enter_hook = fn
    elif not add and chain is fn:
        knobs.runtime.launch_enter_hook = None


def is_compiled(obj) -> bool:
    """Whether ``obj`` is a compiled Triton kernel (what ``kernel[grid](...)`` returns)."""
    return JITFunction is not None and isinstance(obj, CompiledKernel)


def run_compiled(compiled, grid: tuple, args, device=None) -> None:
    """Call ``compiled``'s launcher on the current stream of ``device`` (default: the current
    device), no hooks, with ``args`` every parameter's value in launch order."""
    n = len(grid)
    if device is None:
        device = driver.active.get_current_device()
    compiled.run(
        grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
        driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata,
        None, None, None, *args,
    )  # fmt: skip


def launcher(compiled, grid: tuple):
    """``run_compiled(compiled, grid, args)`` as a function of ``args`` alone, with the
    launcher, the kernel's handles and the grid bound once (a replayed step calls it every
    step): the current device's current stream is looked up at each call, as there."""
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    gx, gy, gz = (*grid, 1, 1)[:3]
    current_device, current_stream = (
        driver.active.get_current_device,
        driver.active.get_current_stream,
    )

    def go(args) -> None:
        run(gx, gy, gz, current_stream(current_device()), function, metadata, None, None, None,
            *args)  # fmt: skip

    return go


def plan(kernel) -> _Plan | None:
    """The parameters and compiled kernels kept for ``kernel`` (None: not a JITFunction)."""
    entry = _PLANS.get(id(kernel))
    if entry is not None:
        return entry[1]
    if JITFunction is None or not isinstance(kernel, JITFunction):
        return None
    made = _Plan(kernel)
    _PLANS[id(kernel)] = (kernel, made)
    return made


def launch(kernel, grid: tuple, /, **kwargs):
    """``kernel[grid](**kwargs)``, with every parameter given by name and at most the options
    ``num_warps`` and ``num_stages``; from the second call with the same specialization on,
    the compiled kernel's launcher directly (module docstring). Returns nothing."""
    rec = RECORDING.get()
    if rec is not None:  # it runs the kernel and logs the launch
        rec.launch(kernel, grid, kwargs)
        return
    p = plan(kernel)
    if p is None or hooked():
        kernel[grid](**kwargs)
        return
    try:
        args = p.args(kwargs)
    except KeyError:  # a parameter left to its default: Triton binds it
        kernel[grid](**kwargs)
        return
    nopt = len(kwargs) - len(args)
    device = driver.active.get_current_device()
    runtime = [a if a.__class__ in _AS_IS else _spec(a) for a in p.runtime(kwargs)]
    key = (device, nopt, kwargs.get("num_warps"), kwargs.get("num_stages"),
           *p.constexprs(kwargs), *runtime)  # fmt: skip
    try:
        compiled = p.compiled.get(key)
    except TypeError:  # an unhashable argument
        kernel[grid](**kwargs)
        return
    if compiled is None:
        compiled = kernel[grid](**kwargs)
        options = set(kwargs).difference(p.names)
        if (isinstance(compiled, CompiledKernel) and options.issubset(OPTIONS)
                and len(p.compiled) < MAX_ENTRIES):  # fmt: skip
            p.compiled[key] = compiled
        return
    run_compiled(compiled, grid, args, device)
