"""linrnn.engine.replay on a GPU, where it calls compiled launchers: a recording refuses a call
whose Triton launches did not all go through linrnn.engine.launch (Triton's launch hook counts
them), and a replay declines while a launch hook (a profiler's) is set, so that the hook sees
every launch the ordinary path makes."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import linrnn
from linrnn.engine import launch as launch_mod
from linrnn.engine import replay
from linrnn.ops import step as step_mod

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@triton.jit
def _double_kernel(x, y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y + i, 2 * tl.load(x + i))


def test_a_launch_outside_launch_is_refused():
    x = torch.randn(16, device="cuda")

    def call(through_launch):
        y = torch.empty_like(x)
        if through_launch:
            launch_mod.launch(_double_kernel, (1,), x=x, y=y, N=16)
        else:
            _double_kernel[(1,)](x=x, y=y, N=16)
        return y

    for through in (True, False):
        call(through)  # compiled outside the recording
        y, rep, slot_of, why = replay.record(lambda t=through: call(t), [x])
        assert torch.equal(y, 2 * x)
        if through:
            assert why is None
            x2 = torch.randn(16, device="cuda")
            env = rep.run([x2])
            assert torch.equal(env[slot_of(id(y))], 2 * x2)
        else:
            assert rep is None and "1 Triton launches, 0 of them through launch()" in why


def test_a_launch_hook_sees_every_step():
    """With a hook set after the signature was recorded, the steps take the ordinary path: the
    hook counts one launch per step, and the results are the replay's."""
    step_mod._PLANS.clear()
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(2, 1, 2, 32, device="cuda", generator=gen) for _ in range(3))
    g = -torch.rand(2, 1, 2, device="cuda", generator=gen)
    S0 = torch.randn(2, 2, 32, 32, device="cuda", generator=gen)
    with torch.no_grad():
        for _ in range(3):  # seen, recorded, replayed
            o_fast, S_fast = linrnn.step(linrnn.simple_gla, q, k, v, g, state=S0)
        assert isinstance(next(iter(step_mod._PLANS.values())), tuple)
        seen = []

        def hook(*_):
            seen.append(1)

        launch_mod.add_hook(hook)
        try:
            assert launch_mod.hooked()
            for _ in range(2):
                o, S = linrnn.step(linrnn.simple_gla, q, k, v, g, state=S0)
        finally:
            launch_mod.remove_hook(hook)
    assert len(seen) == 2
    assert torch.equal(o, o_fast) and torch.equal(S, S_fast)
    step_mod._PLANS.clear()


def test_views_only_launches_read_are_left_out():
    """Retention's per-head decay reaches the kernel as an expanded view ([H] → [B, 1, H], the
    same address): the replay hands the launch the decay itself, so its log has no view
    operations, and the steps still equal the ordinary path's."""
    step_mod._PLANS.clear()
    gen = torch.Generator(device="cuda").manual_seed(8)
    q, k, v = (torch.randn(2, 1, 4, 32, device="cuda", generator=gen) for _ in range(3))
    decay = -torch.rand(4, device="cuda", generator=gen)
    S0 = torch.randn(2, 4, 32, 32, device="cuda", generator=gen)
    with torch.no_grad():
        want = step_mod._step(linrnn.retention, (q, k, v, decay), S0.clone(), False, {})
        for _ in range(3):
            o, S = linrnn.step(linrnn.retention, q, k, v, decay, state=S0)
    (entry,) = step_mod._PLANS.values()
    names = [str(getattr(ev, "func", "launch")) for ev in entry[0].events]
    assert not any("view" in n or "expand" in n for n in names), names
    assert torch.equal(o, want[0]) and torch.equal(S, want[1])
    step_mod._PLANS.clear()
