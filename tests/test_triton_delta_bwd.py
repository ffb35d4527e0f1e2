"""The delta rule's Triton chunk backward (linrnn.engine.delta.backward) against autograd through
the float64 step-by-step loop (linrnn.reference.delta.delta_recurrent): the gradients of q, k,
v, β, g and the initial state, for DeltaNet and Gated DeltaNet, grouped value heads, odd lengths
and chunk sizes, K ≠ V, K = 128, strong decays, β up to 2 with normalized keys, with and without
the final state's cotangent, and packed sequences. Without a GPU it runs under TRITON_INTERPRET=1
(conftest), on small shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import RTOL, assert_close

from linrnn.engine import delta
from linrnn.reference.delta import delta_recurrent

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("q", "k", "v", "beta", "g", "S0")


def _inputs(B, T, H, HV, K, V, *, gated=True, init=False, N=None, g_min=None):
    """Seeded fp32 inputs on DEVICE: l2-normalized keys, β in [0, 2), log decays ≤ 0 (uniform
    in [g_min, 0] when given, else logsigmoid of a normal), an initial state of N sequences."""
    q = torch.randn(B, T, H, K)
    k = F.normalize(torch.randn(B, T, H, K), dim=-1)
    v = torch.randn(B, T, HV, V)
    beta = 2 * torch.rand(B, T, HV)
    g = None
    if gated:
        g = F.logsigmoid(torch.randn(B, T, HV)) if g_min is None else g_min * torch.rand(B, T, HV)
    S0 = torch.randn(N or B, HV, K, V) if init else None
    on = lambda x: None if x is None else x.to(DEVICE)  # noqa: E731
    return dict(q=on(q), k=on(k), v=on(v), beta=on(beta), g=on(g), S0=on(S0))


def _cotangents(x, N, final):
    """Seeded cotangents of o and (``final``) of the final state."""
    B, T, HV, V = x["v"].shape
    do = torch.randn(B, T, HV, V).to(DEVICE)
    dS_T = torch.randn(N, HV, x["q"].shape[3], V).to(DEVICE) if final else None
    return do, dS_T


def _loss(o, S_T, do, dS_T):
    loss = (o * do.to(o.dtype)).sum()
    return loss if dS_T is None else loss + (S_T * dS_T.to(S_T.dtype)).sum()


def _leaves(x, dtype):
    return {n: None if t is None else t.to(dtype, copy=True).requires_grad_() for n, t in x.items()}


def _chunk_grads(x, do, dS_T, *, chunk_size, offsets=None, dtype=torch.float32):
    """The gradients of the Triton chunk path (q, k, v in ``dtype``, the rest fp32)."""
    y = _leaves(x, torch.float32)
    y.update(_leaves({n: x[n] for n in ("q", "k", "v")}, dtype))
    o, S_T = delta.chunk(y["q"], y["k"], y["v"], y["beta"], y["g"], scale=x["q"].shape[3] ** -0.5,
                         S0=y["S0"], offsets=offsets, chunk_size=chunk_size)  # fmt: skip
    _loss(o, S_T, do, dS_T).backward()
    return {n: None if t is None else t.grad for n, t in y.items()}


def _reference_grads(x, do, dS_T, offsets=None):
    """The gradients of the fp64 loop (each packed sequence its own call)."""
    y = _leaves(x, torch.float64)
    scale = x["q"].shape[3] ** -0.5
    bounds = offsets or [0, x["q"].shape[1]]
    outs, states = [], []
    for n in range(len(bounds) - 1):
        t = slice(bounds[n], bounds[n + 1])
        sl = lambda z, t=t: None if z is None else z[:, t]  # noqa: E731
        S0 = None
        if y["S0"] is not None:
            S0 = y["S0"][n : n + 1] if offsets else y["S0"]
        if bounds[n] == bounds[n + 1]:  # an empty sequence: its final state is its initial one
            HV, K, V = x["v"].shape[2], x["q"].shape[3], x["v"].shape[3]
            states.append(S0 if S0 is not None else torch.zeros(1, HV, K, V, dtype=torch.float64))
            continue
        o, S_T = delta_recurrent(sl(y["q"]), sl(y["k"]), sl(y["v"]), sl(y["beta"]), scale=scale,
                                 g=sl(y["g"]), S0=S0)  # fmt: skip
        outs.append(o)
        states.append(S_T)
    _loss(torch.cat(outs, 1), torch.cat(states, 0), do, dS_T).backward()
    return {n: None if t is None else t.grad for n, t in y.items()}


def _check(x, *, chunk_size, final=True, offsets=None, dtype=torch.float32):
    N = x["q"].shape[0] if offsets is None else len(offsets) - 1
    do, dS_T = _cotangents(x, N, final)
    got = _chunk_grads(x, do, dS_T, chunk_size=chunk_size, offsets=offsets, dtype=dtype)
    ref = _reference_grads(x, do, dS_T, offsets)
    for name in NAMES:
        if x[name] is None:
            assert got[name] is None, name
            continue
        assert got[name].dtype == (dtype if name in ("q", "k", "v") else torch.float32), name
        assert_close(f"d{name}", got[name], ref[name], dtype)
    assert RTOL[torch.float32] <= 1e-4  # the fp32 bound these gradients meet


# (B, T, H, HV, K, V, gated, chunk_size, initial state, final state's cotangent)
CASES = [
    (2, 37, 1, 1, 16, 32, False, 16, True, True),  # DeltaNet, T not a multiple of L, K ≠ V
    (2, 70, 2, 2, 32, 16, True, None, False, False),  # gated, default L (64), o only
    (1, 37, 1, 4, 16, 16, True, 16, True, True),  # grouped value heads, G = 4
    (2, 50, 2, 4, 16, 32, False, 32, False, True),  # G = 2, DeltaNet
    (1, 60, 1, 2, 16, 16, True, 37, True, True),  # odd chunk length (a 64-row tile, 37 used)
    (1, 20, 1, 1, 128, 16, True, 16, True, True),  # K = 128: two K blocks of the walk
    (1, 9, 1, 2, 16, 16, True, 5, True, False),  # L < 16 (a 16-row tile)
    (1, 140, 1, 1, 16, 16, True, 128, True, True),  # L = 128
    (2, 45, 2, 4, 16, 16, True, 16, True, True),  # gated, B = 2, G = 2
    (1, 1, 1, 1, 16, 16, True, 16, True, True),  # T = 1
]


def _id(case):
    B, T, H, HV, K, V, gated, L, init, final = case
    name = "gated" if gated else "delta"
    tail = ("-h0" if init else "") + ("-dhT" if final else "")
    return f"{name}-B{B}-T{T}-H{H}-HV{HV}-K{K}-V{V}-L{L}{tail}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_gradients_match_reference(case):
    B, T, H, HV, K, V, gated, L, init, final = case
    _check(_inputs(B, T, H, HV, K, V, gated=gated, init=init), chunk_size=L, final=final)


@pytest.mark.parametrize("HV", [1, 2])
def test_float16(HV):
    """fp16 q, k, v (β, g, the state fp32): the fp16 tolerance; dq and dk come straight in
    fp16 with HV = H, through an fp32 group sum with HV = 2H. (bf16 is checked on the GPU: the
    interpreter's bf16 dot is wrong.)"""
    _check(_inputs(1, 70, 1, HV, 32, 32, init=True), chunk_size=32, dtype=torch.float16)


@pytest.mark.parametrize("g_min", [-30.0, -5.0])
def test_strong_decays(g_min):
    """Log decays down to g_min per step (a run of the strongest one across a chunk boundary):
    every gradient stays finite and exact."""
    x = _inputs(1, 80, 1, 2, 16, 16, init=True, g_min=g_min)
    x["g"][:, 20:40] = g_min
    _check(x, chunk_size=32)


def test_beta_two_and_repeated_keys():
    """β = 2 and runs of one repeated unit key across a chunk boundary, gated and not."""
    x = _inputs(1, 70, 1, 2, 32, 16, init=True)
    x["beta"][:, :40] = 2.0
    x["k"][:, 5:40] = x["k"][:, 5:6]
    _check(x, chunk_size=32)
    x["g"] = None
    _check(x, chunk_size=16)


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "delta"])
def test_packed_sequences(gated):
    """Packed sequences (an empty one first and in the middle, one shorter than a chunk, one
    spanning chunks) against the loop per sequence, grouped value heads."""
    offsets = [0, 0, 11, 11, 45, 70]
    x = _inputs(1, 70, 1, 2, 16, 24, gated=gated, init=True, N=len(offsets) - 1)
    _check(x, chunk_size=16, offsets=offsets)


def test_final_state_only():
    """A loss on the final state alone (the outputs unused): the walk carries every gradient."""
    x = _inputs(1, 40, 1, 2, 16, 16, init=True)
    y = _leaves(x, torch.float32)
    _o, S_T = delta.chunk(y["q"], y["k"], y["v"], y["beta"], y["g"], scale=0.25, S0=y["S0"],
                          chunk_size=16)  # fmt: skip
    dS_T = torch.randn_like(S_T)
    (S_T * dS_T).sum().backward()
    r = _leaves(x, torch.float64)
    _ro, rS = delta_recurrent(r["q"], r["k"], r["v"], r["beta"], scale=0.25, g=r["g"], S0=r["S0"])
    (rS * dS_T.double()).sum().backward()
    assert r["q"].grad is None  # the final state does not read q
    r["q"].grad = torch.zeros_like(r["q"])
    for name in NAMES:
        assert_close(f"d{name}", y[name].grad, r[name].grad, torch.float32)
