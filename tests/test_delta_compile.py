"""The delta-rule ops under ``torch.compile(fullgraph=True)`` on the PyTorch path: outputs,
final states and every gradient equal eager's; T marked dynamic compiles once per chunk count
(the state walk over chunks is a loop, see linrnn/engine/torch_delta.py); mode "recurrent"
(T = 1: the step loop, T > 1: the chunk engine); an in-place step inside a compiled function;
strong decays; one inductor compilation; the Triton path through its custom ops (the
interpreter without a GPU) and their opcheck. Tiny shapes, ``aot_eager`` mostly."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from helpers import RTOL, assert_close, rel_err

import linrnn

B, H, HV, K, V = 2, 1, 2, 8, 6
L = 4


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _inputs(T, gated, strong=False, dtype=torch.float32):
    d = {
        "q": torch.randn(B, T, H, K),
        "k": F.normalize(torch.randn(B, T, H, K), dim=-1),
        "v": torch.randn(B, T, HV, V),
        "beta": torch.rand(B, T, HV) * 2,
    }
    if gated:
        g = F.logsigmoid(torch.randn(B, T, HV) + 2)
        d["g"] = torch.where(torch.rand(B, T, HV) < 0.5, -30.0, g) if strong else g
    d["S0"] = torch.randn(B, HV, K, V)
    return {n: x.to(dtype) for n, x in d.items()}


def _op(mode, backend="torch", **kw):
    def f(x):
        if "g" in x:
            args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
            fn = linrnn.gated_delta_rule
        else:
            args, fn = (x["q"], x["k"], x["v"], x["beta"]), linrnn.delta_rule
        return fn(*args, initial_state=x["S0"], output_final_state=True, mode=mode,
                  backend=backend, **kw)  # fmt: skip

    return f


def _run(fn, inputs, dynamic=False):
    leaves = {n: x.detach().clone().requires_grad_() for n, x in inputs.items()}
    if dynamic:
        for n, x in leaves.items():
            if n != "S0":
                torch._dynamo.mark_dynamic(x, 1)
    o, S = fn(leaves)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen, dtype=o.dtype)
    dS = torch.randn(S.shape, generator=gen, dtype=S.dtype)
    names = list(leaves)
    grads = torch.autograd.grad((o * do).sum() + (S * dS).sum(), [leaves[n] for n in names])
    return o.detach(), S.detach(), dict(zip(names, grads))


def _compare(got, ref, tag):
    assert_close(f"{tag} o", got[0], ref[0], torch.float32)
    assert_close(f"{tag} final_state", got[1], ref[1], torch.float32)
    for n in ref[2]:
        assert_close(f"{tag} d{n}", got[2][n], ref[2][n], torch.float32)


@pytest.mark.parametrize("gated", [False, True], ids=["delta", "gated"])
def test_chunk_fullgraph_dynamic_T(gated):
    """chunk mode, fullgraph, T dynamic: two lengths with the same chunk count share one
    compilation; a new chunk count compiles once more (the walk's loop length)."""
    eager = _op("chunk", chunk_size=L)
    cnt = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(eager, backend=cnt, fullgraph=True)
    for T, frames in ((7, 1), (6, 1), (10, 2)):
        inputs = _inputs(T, gated)
        _compare(_run(compiled, inputs, dynamic=True), _run(eager, inputs), f"T={T}")
        assert cnt.frame_count == frames, f"T={T}: {cnt.frame_count} compilations"


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("gated", [False, True], ids=["delta", "gated"])
def test_triton_fullgraph_one_graph(gated, mode, backend):
    """backend="triton" (the interpreter without a GPU): the chunk kernels as custom ops, one
    compilation for every T of one chunk and one for every T of more chunks (Dynamo
    specializes a size of 1: the chunk count of T ≤ 64), the recurrent mode traced the same
    way; outputs and gradients equal to the eager Triton call's."""
    eager = _op(mode, backend=backend, use_qk_l2norm=True)
    cnt = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(eager, backend=cnt, fullgraph=True)
    lengths = ((5, 1), (40, 1), (70, 2), (150, 2))
    if mode == "recurrent":
        # Traced, the recurrent mode is the chunk mode's graph (the same custom op, the engine's
        # chunk length): a length of each compilation, against the eager recurrent kernel; the
        # reuse of each graph for a second length (and a third chunk) is the chunk case's.
        lengths = lengths[::2]
    for T, frames in lengths:
        inputs = _inputs(T, gated, strong=T == lengths[-1][0])  # strong gates: the last length
        _compare(_run(compiled, inputs, dynamic=True), _run(eager, inputs), f"{mode} T={T}")
        assert cnt.frame_count == frames, f"T={T}: {cnt.frame_count} compilations"


def test_triton_custom_op_check():
    """torch.library.opcheck of the delta chunk op pair: schema, fake shapes, autograd."""
    pytest.importorskip("triton")
    ops = torch.ops.linrnn
    x = _inputs(9, gated=True)
    args = [x[n].clone().requires_grad_() for n in ("q", "k", "v", "beta", "g", "S0")]
    torch.library.opcheck(ops.delta_chunk_fwd, (*args, 0.5, 4, None))
    torch.library.opcheck(ops.delta_chunk_fwd, (*args[:4], None, None, 0.5, 4, None))


@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("gated", [False, True], ids=["delta", "gated"])
def test_recurrent_mode(gated, T):
    """mode="recurrent": T = 1 traces the step loop, T > 1 the chunk engine; both equal
    eager's loop."""
    eager = _op("recurrent")
    compiled = torch.compile(eager, backend="aot_eager", fullgraph=True)
    inputs = _inputs(T, gated)
    _compare(_run(compiled, inputs), _run(eager, inputs), f"recurrent T={T}")


def test_strong_decays_and_l2norm():
    """g = −30 on half the steps, q/k normalized in the op: the compiled fp32 result is as
    accurate as eager fp32 against fp64 (within twice its error, or fp32's tolerance)."""
    eager = _op("chunk", chunk_size=L, use_qk_l2norm=True)
    compiled = torch.compile(eager, backend="aot_eager", fullgraph=True)
    inputs = _inputs(9, True, strong=True)
    got, low = _run(compiled, inputs), _run(eager, inputs)
    ref = _run(eager, {n: x.double() for n, x in inputs.items()})
    pairs = [("o", got[0], low[0], ref[0]), ("state", got[1], low[1], ref[1])]
    pairs += [(f"d{n}", got[2][n], low[2][n], r) for n, r in ref[2].items()]
    for what, g, e, r in pairs:
        assert bool(torch.isfinite(g).all()), f"{what}: not finite"
        err, base = rel_err(g, r), rel_err(e, r)
        assert err <= max(2.0 * base, RTOL[torch.float32]), (
            f"{what}: compiled {err:.2e} off fp64, eager fp32 {base:.2e}"
        )


def test_step_inplace_compiles():
    """linrnn.gated_delta_rule_step(inplace=True) in a compiled function: the state is
    updated in place and equals eager's."""
    x = _inputs(1, True)
    state, ref_state = x["S0"].clone(), x["S0"].clone()

    def step(q, k, v, g, beta, state):
        return linrnn.gated_delta_rule_step(q, k, v, g, beta, state=state, inplace=True,
                                            backend="torch")[0]  # fmt: skip

    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o = torch.compile(step, backend="aot_eager", fullgraph=True)(*args, state)
    o_ref = step(*args, ref_state)
    assert_close("o", o, o_ref, torch.float32)
    assert_close("state", state, ref_state, torch.float32)
    assert not torch.equal(state, x["S0"])


def test_inductor():
    """One real inductor compilation (static shapes): Gated DeltaNet forward and backward."""
    eager = _op("chunk", chunk_size=L)
    compiled = torch.compile(eager, backend="inductor", fullgraph=True)
    inputs = _inputs(5, True)
    _compare(_run(compiled, inputs), _run(eager, inputs), "inductor")
