"""linrnn.engine.launch: the decode step's direct launches. The cache logic runs here on a
real ``JITFunction`` whose Triton launch path (``run``) and compiled kernel are recorded
stand-ins, so no GPU is needed; tests/gpu/test_direct_launch.py checks real launches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.compiler import CompiledKernel  # noqa: E402
from triton.knobs import HookChain  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from linrnn.engine import launch as launch_mod  # noqa: E402


def _body(x, y, n, scale, BLOCK: tl.constexpr, HAS_Y: tl.constexpr):
    pass


class _Compiled(CompiledKernel):
    """A compiled kernel whose launcher records its calls."""

    def __init__(self, calls):
        self.calls = calls
        self.function = "function"
        self.packed_metadata = "metadata"
        self.module = None  # nothing loaded: CompiledKernel.__del__ unloads nothing

    @property
    def run(self):
        return lambda *a: self.calls.append(("direct", a))


class _Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1234


@pytest.fixture
def kernel(monkeypatch):
    """A JITFunction whose Triton path records ("triton", kwargs) and returns one _Compiled."""
    fn = JITFunction(_body)
    calls = []
    compiled = _Compiled(calls)

    def run(*args, grid, warmup, **kwargs):
        calls.append(("triton", grid, kwargs))
        return compiled

    fn.run = run
    fn.calls = calls
    monkeypatch.setattr(launch_mod, "driver", SimpleNamespace(active=_Driver()))
    monkeypatch.setattr(launch_mod.knobs.runtime, "launch_enter_hook", HookChain())
    monkeypatch.setattr(launch_mod.knobs.runtime, "launch_exit_hook", HookChain(reversed=True))
    monkeypatch.setattr(launch_mod.knobs.runtime, "debug", False)
    yield fn
    launch_mod._PLANS.pop(id(fn), None)


def _args(x, y=None, n=64, scale=0.5, BLOCK=32):
    return dict(x=x, y=y, n=n, scale=scale, BLOCK=BLOCK, HAS_Y=y is not None, num_warps=4)


def test_second_call_launches_the_compiled_kernel_directly(kernel):
    x = torch.zeros(64)
    launch_mod.launch(kernel, (3, 2), **_args(x))
    launch_mod.launch(kernel, (3, 2), **_args(x))
    assert [c[0] for c in kernel.calls] == ["triton", "direct"]
    # grid padded to 3 dims, the stream, the compiled function and metadata, no launch
    # metadata or hooks, then every parameter in the kernel's order, constexprs included
    g0, g1, g2, stream, function, meta, launch_meta, enter, exit_, *args = kernel.calls[1][1]
    assert (g0, g1, g2, stream, function, meta, launch_meta, enter, exit_) == (
        3, 2, 1, 1234, "function", "metadata", None, None, None,
    )  # fmt: skip
    assert args == [x, None, 64, 0.5, 32, False]


def test_what_specializes_goes_back_through_triton(kernel):
    x = torch.zeros(64)
    launch_mod.launch(kernel, (1,), **_args(x))
    cases = [
        _args(torch.zeros(64, dtype=torch.float16)),  # dtype
        _args(torch.zeros(65)[1:]),  # a 4-byte offset: not 16-byte aligned
        _args(x, n=True),  # a bool, then the int 1 (equal in Python, two kernels in Triton)
        _args(x, n=1),  # Triton specializes ints on == 1 and % 16
        _args(x, n=72),
        _args(x, BLOCK=64),  # a constexpr
        _args(x, y=x),  # None or a tensor
        {**_args(x), "num_warps": 8},
        {**_args(x), "num_stages": 3},
    ]
    for kwargs in cases:
        before = len(kernel.calls)
        launch_mod.launch(kernel, (1,), **kwargs)
        assert kernel.calls[before][0] == "triton", kwargs
        launch_mod.launch(kernel, (1,), **kwargs)
        assert kernel.calls[before + 1][0] == "direct", kwargs


def test_a_float_or_another_aligned_tensor_reuses_the_kernel(kernel):
    launch_mod.launch(kernel, (1,), **_args(torch.zeros(64)))
    launch_mod.launch(kernel, (1,), **_args(torch.zeros(64), scale=0.25))
    launch_mod.launch(kernel, (1,), **_args(torch.zeros(80)[16:]))  # 64-byte offset: aligned
    assert [c[0] for c in kernel.calls] == ["triton", "direct", "direct"]


def test_plain_path_for_hooks_debug_defaults_and_other_options(kernel, monkeypatch):
    x = torch.zeros(64)
    full = _args(x)
    partial = {k: v for k, v in full.items() if k != "HAS_Y"}  # a parameter left out
    with_reg = {**full, "maxnreg": 128}  # an option outside the key
    for kwargs in (partial, with_reg):
        for _ in range(3):
            launch_mod.launch(kernel, (1,), **kwargs)
    assert [c[0] for c in kernel.calls] == ["triton"] * 6
    launch_mod.launch(kernel, (1,), **full)
    rt = launch_mod.knobs.runtime
    chain = HookChain()
    chain.add(lambda *a: None)
    for name, hook in [("launch_enter_hook", chain), ("launch_exit_hook", chain),
                       ("launch_enter_hook", lambda *a: None)]:  # fmt: skip
        with monkeypatch.context() as m:
            m.setattr(rt, name, hook)
            launch_mod.launch(kernel, (1,), **full)
    monkeypatch.setattr(rt, "debug", True)
    launch_mod.launch(kernel, (1,), **full)
    assert [c[0] for c in kernel.calls[6:]] == ["triton"] * 5


def test_the_cache_is_bounded(kernel, monkeypatch):
    monkeypatch.setattr(launch_mod, "MAX_ENTRIES", 2)
    x = torch.zeros(64)
    for n in (16, 32, 48, 48):
        launch_mod.launch(kernel, (1,), **_args(x, n=n))
    assert [c[0] for c in kernel.calls] == ["triton"] * 4


def test_anything_but_a_jit_function_is_launched_as_given():
    seen = []

    class StandIn:
        def __getitem__(self, grid):
            return lambda **kwargs: seen.append((grid, kwargs))

    launch_mod.launch(StandIn(), (2,), a=1)
    launch_mod.launch(StandIn(), (2,), a=1)
    assert seen == [((2,), {"a": 1})] * 2
