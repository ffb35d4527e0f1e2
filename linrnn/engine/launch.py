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
_OPTIONS = ("num_warps", "num_stages")


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


def _plan(kernel) -> _Plan | None:
    entry = _PLANS.get(id(kernel))
    if entry is not None:
        return entry[1]
    if JITFunction is None or not isinstance(kernel, JITFunction):
        return None
    plan = _Plan(kernel)
    _PLANS[id(kernel)] = (kernel, plan)
    return plan


def launch(kernel, grid: tuple, /, **kwargs):
    """``kernel[grid](**kwargs)``, with every parameter given by name and at most the options
    ``num_warps`` and ``num_stages``; from the second call with the same specialization on,
    the compiled kernel's launcher directly (module docstring). Returns nothing."""
    plan = _plan(kernel)
    rt = knobs.runtime
    if plan is None or _hooked(rt.launch_enter_hook) or _hooked(rt.launch_exit_hook) or rt.debug:
        kernel[grid](**kwargs)
        return
    try:
        args = plan.args(kwargs)
    except KeyError:  # a parameter left to its default: Triton binds it
        kernel[grid](**kwargs)
        return
    nopt = len(kwargs) - len(args)
    device = driver.active.get_current_device()
    runtime = [a if a.__class__ in _AS_IS else _spec(a) for a in plan.runtime(kwargs)]
    key = (device, nopt, kwargs.get("num_warps"), kwargs.get("num_stages"),
           *plan.constexprs(kwargs), *runtime)  # fmt: skip
    try:
        compiled = plan.compiled.get(key)
    except TypeError:  # an unhashable argument
        kernel[grid](**kwargs)
        return
    if compiled is None:
        compiled = kernel[grid](**kwargs)
        options = set(kwargs).difference(plan.names)
        if (isinstance(compiled, CompiledKernel) and options.issubset(_OPTIONS)
                and len(plan.compiled) < MAX_ENTRIES):  # fmt: skip
            plan.compiled[key] = compiled
        return
    n = len(grid)
    compiled.run(
        grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
        driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata,
        None, None, None, *args,
    )  # fmt: skip
