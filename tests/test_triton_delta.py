"""The delta rule's Triton chunk forward (linrnn.engine.delta) against the float64 step-by-step
loop (linrnn.reference.delta.delta_recurrent): outputs and final states for DeltaNet and Gated
DeltaNet, grouped value heads, odd lengths and chunk sizes, K ≠ V, head dims up to 256, strong
decays, β up to 2, initial states and packed sequences; and the chunk solve and the WY products
on their own against PyTorch. Without a GPU it runs under TRITON_INTERPRET=1 (conftest), on
small shapes."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers import RTOL, assert_close, rel_err

from linrnn.engine import delta
from linrnn.reference.delta import delta_recurrent

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(B, T, H, HV, K, V, *, gated=True, init=False, N=None, g_min=None, dtype=None):
    """Seeded inputs on DEVICE: l2-normalized keys, β in [0, 2), log decays ≤ 0 (uniform in
    [g_min, 0] when given, else logsigmoid of a normal), an initial state of N sequences."""
    dtype = dtype or torch.float32
    q = torch.randn(B, T, H, K)
    k = F.normalize(torch.randn(B, T, H, K), dim=-1)
    v = torch.randn(B, T, HV, V)
    beta = 2 * torch.rand(B, T, HV)
    g = None
    if gated:
        g = F.logsigmoid(torch.randn(B, T, HV)) if g_min is None else g_min * torch.rand(B, T, HV)
    S0 = torch.randn(N or B, HV, K, V) if init else None
    on = lambda x, dt=torch.float32: None if x is None else x.to(DEVICE, dt)  # noqa: E731
    return on(q, dtype), on(k, dtype), on(v, dtype), on(beta), on(g), on(S0)


def _reference(q, k, v, beta, g, S0, scale):
    """The fp64 loop; (o, S_T)."""
    d = lambda x: None if x is None else x.double()  # noqa: E731
    return delta_recurrent(d(q), d(k), d(v), d(beta), scale=scale, g=d(g), S0=d(S0))


def _check(q, k, v, beta, g, S0, chunk_size=None, dtype=torch.float32, offsets=None):
    scale = q.shape[-1] ** -0.5
    o, S_T = delta.chunk(q, k, v, beta, g, scale=scale, S0=S0, chunk_size=chunk_size,
                         offsets=offsets)  # fmt: skip
    assert o.dtype == q.dtype and S_T.dtype == torch.float32
    ro, rS = _reference(q, k, v, beta, g, S0, scale)
    assert_close("o", o, ro, dtype)
    assert_close("S_T", S_T, rS, dtype)
    return o, S_T


# (B, T, H, HV, K, V, gated, chunk_size, initial state)
CASES = [
    (2, 37, 1, 1, 16, 32, False, 16, True),  # DeltaNet, T not a multiple of L
    (2, 100, 2, 2, 32, 16, True, None, False),  # gated, default L (64), K ≠ V
    (1, 37, 1, 4, 16, 16, True, 16, True),  # grouped value heads, G = 4
    (2, 50, 2, 4, 16, 32, False, 32, False),  # G = 2, DeltaNet
    (1, 100, 1, 2, 16, 16, True, 37, True),  # odd chunk length (a 64-row tile, 37 used)
    (1, 40, 1, 2, 64, 64, True, 16, True),  # K = V = 64
    (1, 24, 1, 1, 128, 32, True, 16, True),  # K = 128: two K blocks of the walk
    (1, 20, 1, 1, 256, 16, True, 16, False),  # K = 256: four K blocks
    (1, 150, 1, 1, 16, 16, True, 128, True),  # L = 128: eight 16-row blocks in the solve
    (1, 9, 1, 2, 16, 16, True, 5, True),  # L < 16 (a 16-row tile)
]


def _id(case):
    B, T, H, HV, K, V, gated, L, init = case
    name = "gated" if gated else "delta"
    return f"{name}-B{B}-T{T}-H{H}-HV{HV}-K{K}-V{V}-L{L}" + ("-h0" if init else "")


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_forward_matches_reference(case):
    B, T, H, HV, K, V, gated, L, init = case
    _check(*_inputs(B, T, H, HV, K, V, gated=gated, init=init), chunk_size=L)


def test_float16():
    q, k, v, beta, g, S0 = _inputs(1, 70, 1, 2, 32, 32, init=True, dtype=torch.float16)
    _check(q, k, v, beta, g, S0, chunk_size=32, dtype=torch.float16)


@pytest.mark.parametrize("g_min", [-30.0, -5.0])
def test_strong_decays(g_min):
    """Log decays down to g_min per step: the chunk's exponents underflow to 0, never overflow."""
    q, k, v, beta, g, S0 = _inputs(1, 80, 1, 2, 16, 16, init=True, g_min=g_min)
    g[:, 20:30] = g_min  # a run of the strongest decay
    o, S_T = _check(q, k, v, beta, g, S0, chunk_size=32)
    assert torch.isfinite(o).all() and torch.isfinite(S_T).all()


def test_beta_two_and_repeated_keys():
    """β = 2 (a reflection per step for unit keys) and runs of one repeated key: I + N then has
    entries 2 in whole triangles, whose inverse a power series of N could not compute in fp32
    (its terms grow like binomials); forward substitution keeps it exact."""
    q, k, v, beta, g, S0 = _inputs(1, 70, 1, 2, 32, 16, init=True)
    beta[:, :40] = 2.0
    k[:, 5:40] = k[:, 5:6]  # one key for 35 steps, across a chunk boundary
    _check(q, k, v, beta, g, S0, chunk_size=64)
    _check(q, k, v, beta, None, S0, chunk_size=32)


def test_packed_equals_separate():
    """Packed sequences (offsets, one shorter than a chunk, one empty, one spanning chunks) give
    what separate calls give, and the reference per sequence."""
    offsets = [0, 17, 17, 60, 100]
    N = len(offsets) - 1
    q, k, v, beta, g, S0 = _inputs(1, 100, 1, 2, 16, 32, init=True, N=N)
    scale = 16**-0.5
    o, S_T = delta.chunk(q, k, v, beta, g, scale=scale, S0=S0, offsets=offsets, chunk_size=16)
    for n in range(N):
        a, e = offsets[n], offsets[n + 1]
        if a == e:
            assert torch.equal(S_T[n], S0[n])
            continue
        part = [x[:, a:e] for x in (q, k, v, beta, g)]
        o_n, S_n = delta.chunk(*part, scale=scale, S0=S0[n : n + 1], chunk_size=16)
        torch.testing.assert_close(o[:, a:e], o_n, rtol=0, atol=1e-5)
        torch.testing.assert_close(S_T[n : n + 1], S_n, rtol=0, atol=1e-5)
        ro, rS = _reference(*part, S0[n : n + 1], scale)
        assert_close(f"o[{n}]", o[:, a:e], ro, torch.float32)
        assert_close(f"S_T[{n}]", S_T[n : n + 1], rS, torch.float32)


def _chunk_blocks(T, L, offsets):
    """The token ranges [c0, c1) of the chunks, in the kernels' order."""
    bounds = [(0, T)] if offsets is None else list(itertools.pairwise(offsets))
    return [(c0, min(c0 + L, e)) for a, e in bounds for c0 in range(a, e, L)]


def _solve_case(offsets, gated, L=32):
    T = 100 if offsets is None else offsets[-1]
    q, k, v, beta, g, _ = _inputs(1, T, 1, 2, 16, 32, gated=gated)
    cfg = delta.config(q, k, v, scale=1.0, g=g, chunk_size=L, offsets=offsets)
    b = delta._chunk_cumsum(g, cfg.L, cfg)[0] if gated else None
    A, w, u = delta.solve_wu(k, v, beta, b, cfg)
    return q, k, v, beta, b, A, w, u, cfg


# Chunk lengths of each block layout of the solve: one, two and four 16-row blocks (37: a
# 64-row tile with 37 rows used), four 32-row blocks (T = 100 has a full chunk of each)
SOLVE_LENGTHS = [16, 32, 37, 64, 128]


@pytest.mark.parametrize("L", SOLVE_LENGTHS)
@pytest.mark.parametrize("offsets", [None, [0, 30, 100]], ids=["dense", "packed"])
@pytest.mark.parametrize("gated", [True, False], ids=["gated", "delta"])
def test_solve(gated, offsets, L):
    """A (I + N) = I per chunk, N_rs = β_r exp(b_r − b_s) (k_r·k_s) (s < r) in fp64; A unit lower
    triangular with zeros in the columns past the chunk."""
    _q, k, _v, beta, b, A, _w, _u, cfg = _solve_case(offsets, gated, L)
    HV, L = beta.shape[2], cfg.L
    for c0, c1 in _chunk_blocks(k.shape[1], L, offsets):
        n = c1 - c0
        for j in range(HV):
            kk = k[0, c0:c1, j // cfg.G].double()
            f64 = dict(dtype=torch.float64, device=k.device)
            bb = b[j, c0:c1].double() if b is not None else torch.zeros(n, **f64)
            decay = torch.exp((bb[:, None] - bb[None, :]).tril(-1)).tril(-1)
            N = beta[0, c0:c1, j].double()[:, None] * decay * (kk @ kk.T)
            a = A[j, c0:c1].double()
            assert torch.equal(a[:, n:], torch.zeros_like(a[:, n:]))
            assert torch.equal(a[:, :n].triu(1), torch.zeros(n, n, **f64))
            assert torch.equal(a[:, :n].diagonal(), torch.ones(n, **f64))
            eye = torch.eye(n, **f64)
            err = (a[:, :n] @ (eye + N) - eye).abs().max().item()
            assert err < 1e-5, f"chunk [{c0}, {c1}) head {j}: |A (I + N) − I| = {err:.2e}"


@pytest.mark.parametrize("L", [64, 128])
def test_solve_unnormalized_keys(L):
    """Keys with β|k|² up to ~4.5 (an expanding recurrence; A's entries reach ~10³): the solve
    stays backward stable, |A (I + N) − I| ≤ 1e-5 · max(|A| |I + N|), which a power series of
    N would miss by orders of magnitude."""
    T, K = 128, 16
    q, _k, v, beta, _g, _ = _inputs(1, T, 1, 1, K, 16, gated=False)
    k = (1.5 * torch.randn(1, T, 1, K) / K**0.5).to(DEVICE)  # the same keys on every device
    cfg = delta.config(q, k, v, scale=1.0, chunk_size=L)
    A = delta.solve_wu(k, v, beta, None, cfg)[0]
    f64 = dict(dtype=torch.float64, device=k.device)
    largest = 0.0
    for c0, c1 in _chunk_blocks(T, cfg.L, None):
        kk = k[0, c0:c1, 0].double()
        eye = torch.eye(c1 - c0, **f64)
        m = eye + (beta[0, c0:c1, 0].double()[:, None] * (kk @ kk.T)).tril(-1)
        a = A[0, c0:c1, : c1 - c0].double()
        largest = max(largest, a.abs().max().item())
        err = (a @ m - eye).abs().max() / (a.abs() @ m.abs()).max()
        assert err < 1e-5, f"chunk [{c0}, {c1}): relative residual {err:.2e}"
    assert largest > 10  # the case is not well conditioned (a single chunk may be milder)


@pytest.mark.parametrize("L", SOLVE_LENGTHS)
@pytest.mark.parametrize("gated", [True, False], ids=["gated", "delta"])
def test_wu(gated, L):
    """W = A diag(β exp(b)) K and U = A diag(β) V per chunk, against PyTorch on the kernel's A
    (test_solve checks that A)."""
    _q, k, v, beta, b, A, w, u, cfg = _solve_case([0, 30, 100], gated, L)
    assert w.shape == (*v.shape[:3], k.shape[3]) and u.shape == v.shape
    rw, ru = torch.empty_like(w, dtype=torch.float64), torch.empty_like(u, dtype=torch.float64)
    for c0, c1 in _chunk_blocks(k.shape[1], cfg.L, [0, 30, 100]):
        n = c1 - c0
        for j in range(v.shape[2]):
            a = A[j, c0:c1, :n].double()
            bt = beta[0, c0:c1, j].double()
            e = torch.exp(b[j, c0:c1].double()) if b is not None else 1.0
            rw[0, c0:c1, j] = a @ ((bt * e)[:, None] * k[0, c0:c1, j // cfg.G].double())
            ru[0, c0:c1, j] = a @ (bt[:, None] * v[0, c0:c1, j].double())
    assert rel_err(w, rw) < RTOL[torch.float32] and rel_err(u, ru) < RTOL[torch.float32]


def test_rejects_what_it_cannot_run():
    q, k, v, beta, g, _ = _inputs(1, 8, 1, 2, 16, 16)
    with pytest.raises(ValueError, match="chunk_size must be ≤ 128"):
        delta.chunk(q, k, v, beta, g, scale=1.0, chunk_size=256)
    with pytest.raises(ValueError, match="multiple of H"):
        two = q.expand(-1, -1, 2, -1)
        delta.chunk(two, two, v[:, :, :1].expand(-1, -1, 3, -1), beta, g, scale=1.0)
    with pytest.raises(ValueError, match="K ≤ 256"):
        big = torch.randn(1, 8, 1, 272, device=DEVICE)
        delta.chunk(big, big, v, beta, g, scale=1.0)
    with pytest.raises(ValueError, match="beta must be"):
        delta.chunk(q, k, v, beta[:, :, :1], g, scale=1.0)
    with pytest.raises(TypeError, match="share a dtype"):
        delta.chunk(q, k, v.half(), beta, g, scale=1.0)
