"""The decode step's direct launches (linrnn.engine.launch) on a GPU: after the first step
Triton's launch path is not entered again, and the steps give bitwise what ``kernel[grid]``
gives, for every recurrent host that launches that way, with unaligned inputs and inside a
CUDA graph. linrnn.step's replay (tests/test_step_replay.py) is kept off here, but in the
graph case that captures a replayed step: a replay calls the compiled launchers itself."""

from __future__ import annotations

import functools

import pytest
import torch

import linrnn
from linrnn.engine import delta_recurrent, l2norm, mamba2_gates, recurrent
from linrnn.engine import launch as launch_mod
from linrnn.ops import step as step_mod

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HOSTS = (recurrent, delta_recurrent, mamba2_gates, l2norm)
B, H, K, V = 4, 3, 64, 48


def _plain(kernel, grid, **kwargs):
    kernel[grid](**kwargs)


def _case(op, dtype, gen):
    """(fn, inputs, state) of one step of ``op`` (fresh random inputs from ``gen``)."""
    x = lambda *s: torch.randn(*s, device="cuda", generator=gen).to(dtype)  # noqa: E731
    f32 = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q, k, v = x(B, 1, H, K), x(B, 1, H, K), x(B, 1, H, V)
    S = f32(B, H, K, V)
    if op == "linear_attn":
        return linrnn.linear_attn, (q, k, v), S
    if op == "gla":
        return linrnn.gla, (q, k, v, -f32(B, 1, H, K).exp()), S
    if op == "mlstm":
        n, m = f32(B, H, K).abs(), f32(B, H)
        return linrnn.mlstm, (q, k, v, f32(B, 1, H), f32(B, 1, H)), (S, n, m)
    if op == "gated_delta_rule":
        fn = functools.partial(linrnn.gated_delta_rule, use_qk_l2norm=True)
        return fn, (q, k, v, -f32(B, 1, H).exp(), f32(B, 1, H).sigmoid()), S
    if op == "mamba2":
        fn = functools.partial(linrnn.mamba2, D=f32(H), dt_bias=f32(H), dt_softplus=True)
        return fn, (v, f32(B, 1, H), -f32(H).exp(), x(B, 1, 1, K), x(B, 1, 1, K)), S
    raise ValueError(op)


def _clone(state):
    return tuple(s.clone() for s in state) if isinstance(state, tuple) else state.clone()


def _steps(op, dtype, seed, n=4, shift=0):
    """Outputs and final state of ``n`` in-place steps; ``shift`` elements of offset in every
    16-bit input (an unaligned view of a larger buffer)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    outs, state = [], None
    for _ in range(n):
        fn, inputs, S = _case(op, dtype, gen)
        state = _clone(S) if state is None else state
        if shift:
            inputs = tuple(_shifted(t, shift) for t in inputs)
        o, _ = linrnn.step(fn, *inputs, state=state, inplace=True)
        outs.append(o.clone())
    return outs, state


def _shifted(t, shift):
    if t.dtype == torch.float32:
        return t
    buf = torch.empty(t.numel() + shift, device=t.device, dtype=t.dtype)
    view = buf[shift:].view(t.shape)
    view.copy_(t)
    return view


OPS = ("linear_attn", "gla", "mlstm", "gated_delta_rule", "mamba2")


# 16-bit inputs aligned and one element off; fp32 inputs aligned
CASES = [(torch.bfloat16, 0), (torch.bfloat16, 1), (torch.float32, 0)]


@pytest.mark.parametrize(("dtype", "shift"), CASES)
@pytest.mark.parametrize("op", OPS)
def test_direct_steps_match_triton_launches_bitwise(op, dtype, shift, monkeypatch):
    monkeypatch.setattr(step_mod, "MAX_PLANS", 0)  # every step through the hosts
    with torch.no_grad():
        _steps(op, dtype, seed=1, shift=shift)  # the first launches: compiled and cached
        fast = _steps(op, dtype, seed=2, shift=shift)
        for host in HOSTS:
            monkeypatch.setattr(host, "launch", _plain)
        plain = _steps(op, dtype, seed=2, shift=shift)
    for a, b in zip(fast[0], plain[0]):
        assert torch.equal(a, b)
    for a, b in zip(_parts(fast[1]), _parts(plain[1])):
        assert torch.equal(a, b)


def _parts(state):
    return state if isinstance(state, tuple) else (state,)


def test_triton_launch_path_runs_once_per_specialization(monkeypatch):
    kernel = recurrent.kern.recurrent_fwd_kernel
    runs = []
    real = kernel.run

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(kernel, "run", counted, raising=False)
    monkeypatch.setattr(launch_mod, "_PLANS", {})  # no compiled kernel kept by earlier tests
    monkeypatch.setattr(step_mod, "MAX_PLANS", 0)  # every step through the hosts
    with torch.no_grad():
        _steps("linear_attn", torch.float16, seed=3, n=5)
        assert len(runs) == 1  # the first step only
        _steps("linear_attn", torch.float16, seed=4, n=5, shift=1)  # unaligned: a new entry
        assert len(runs) == 2


@pytest.mark.parametrize("replayed", [False, True], ids=["hosts", "replayed"])
def test_direct_launch_inside_a_cuda_graph(replayed, monkeypatch):
    monkeypatch.setattr(step_mod, "_PLANS", {})
    if not replayed:
        monkeypatch.setattr(step_mod, "MAX_PLANS", 0)
    gen = torch.Generator(device="cuda").manual_seed(5)
    fn, inputs, S = _case("mlstm", torch.bfloat16, gen)
    state, ref_state = _clone(S), _clone(S)
    with torch.no_grad():
        o_ref, _ = linrnn.step(fn, *inputs, state=ref_state, inplace=True)
        warm = _clone(S)
        linrnn.step(fn, *inputs, state=warm, inplace=True)  # kept, recorded: before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o, _ = linrnn.step(fn, *inputs, state=state, inplace=True)
        for part, start in zip(state, S):
            part.copy_(start)
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, o_ref)
    for a, b in zip(state, ref_state):
        assert torch.equal(a, b)
