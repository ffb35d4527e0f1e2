"""The Triton chunk engine with per-channel decays — GLA (gk, with and without gv) and RWKV6
(w, exclusive form with the bonus u) — against the float64 references: outputs, final states
and every gradient, both chunk modes, odd T, non-power-of-two and unequal head dims, extreme
decays, state passing and packed sequences. Under TRITON_INTERPRET=1 without a GPU (set in
conftest), on small shapes; bfloat16 only on the GPU machine (see test_triton_engine)."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import torch
from helpers import FAMILIES, assert_close
from test_triton_engine import DEVICE, _check, _on, check_state_passing, check_varlen

import linrnn

pytest.importorskip("triton")

VECTOR = ["gla", "gla_gv", "rwkv6"]
MODES = ["chunk", "fused_chunk"]


@pytest.fixture(autouse=True)
def _fast_forms_in_fp32(monkeypatch):
    """The fast forms (DIAG_SPAN, CHUNK_SPAN) for fp32 inputs too (the engine runs them for
    bf16 alone: vector._fast_forms), so that the fp32 tests here check the bf16 path's
    math against the references at fp32 precision; fp16 keeps the engine's choice (the
    long-sequence decay-gradient test). Tests of the fp32 path undo it (:func:`_log_space`)."""
    from linrnn.engine import vector

    fast = lambda dtype: dtype in (torch.bfloat16, torch.float32)  # noqa: E731
    monkeypatch.setattr(vector, "_fast_forms", fast)


def _log_space(monkeypatch):
    """fp32 inputs as the engine runs them: no fast forms, every diagonal tile in log space and
    every chunk in sub-chunks."""
    from linrnn.engine import vector

    monkeypatch.setattr(vector, "_fast_forms", lambda dtype: dtype == torch.bfloat16)


def _gpu_diagonal(monkeypatch, walk: bool = True):
    """The diagonal in the GPU's form, the walk over the key rows (a loop, unrolled with gv),
    instead of the interpreter's block form (``walk`` False: the block form, as the CPU runs)."""
    from linrnn.engine import vector

    monkeypatch.setattr(vector, "INTERPRETER", not walk)


@pytest.mark.parametrize("init", [False, True], ids=["h0=None", "h0"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", VECTOR)
def test_matches_reference(family, mode, init):
    """fp32, T = 37 with chunks of 32 (two sub-chunks, a partial last chunk), K ≠ V."""
    fam = FAMILIES[family]
    B, T, H, K, V = 2, 37, 2, 20, 12
    h0 = fam.make_state(B, H, K, V, torch.float32) if init else None
    _check(fam, fam.build(B, T, H, K, V, False), h0, torch.float32, mode=mode, chunk_size=32)


@pytest.mark.parametrize("shape", [(1, 70, 1, 60, 100, 64), (1, 50, 1, 100, 60, 24),
                                   (2, 9, 1, 16, 8, 5), (1, 20, 1, 512, 24, 16)],
                         ids=["K60-V100-L64", "K100-V60-L24", "T9-L5", "K512-V24"])  # fmt: skip
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["gla_gv", "rwkv6"])
def test_tiling_shapes(family, mode, shape):
    """Head dims over several depth/output tiles (up to 512, and 60/100), chunks of several
    sub-chunks and not a multiple of one, chunks shorter than a sub-chunk."""
    fam = FAMILIES[family]
    B, T, H, K, V, L = shape
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _check(fam, fam.build(B, T, H, K, V, False), h0, torch.float32, mode=mode, chunk_size=L)


# A batch of one: the walk starts from the tile pointers the kernels' shared prologue forms
# (the block form runs the same prologue over batches of two, test_matches_reference).
@pytest.mark.parametrize("shape", [(1, 37, 2, 20, 12, 32), (1, 9, 1, 40, 24, 5)],
                         ids=["T37-L32", "T9-L5"])  # fmt: skip
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", VECTOR)
def test_diagonal_walk_matches_reference(monkeypatch, family, mode, shape):
    """The diagonal sub-chunk in the GPU's form, a walk over its key rows (a loop for gk
    alone, unrolled with gv), on every tile (fp32: no fast forms): forward (depth gate), dq
    (output gate), dk and dv (transposed pairs), the stored scores, RWKV6's bonus, gv's two
    gates, two heads, a partial tile and depth tiles beyond one (K=40)."""
    _gpu_diagonal(monkeypatch)
    _log_space(monkeypatch)
    fam = FAMILIES[family]
    B, T, H, K, V, L = shape
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _check(fam, fam.build(B, T, H, K, V, False), h0, torch.float32, mode=mode, chunk_size=L)


# (T37-L32 with the walk: test_diagonal_walk_matches_reference's chunk-mode case, the same call
# at a batch of one)
STORED_FORMS = [("T37-L32", False), ("T70-L64-K60-V100", False), ("T70-L64-K60-V100", True),
                ("varlen", False), ("varlen", True)]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "diag_loop"),
    STORED_FORMS,
    ids=[f"{c}-{'walk' if w else 'block'}" for c, w in STORED_FORMS],
)
@pytest.mark.parametrize("family", ["gla", "rwkv6"])
def test_stored_scores_match_reference(monkeypatch, family, case, diag_loop):
    """Chunk mode with gk alone, the intra-chunk scores stored: forward and dv from the scores
    with 64-row tiles (a partial last chunk, head dims over several tiles, packed sequences),
    the log-space diagonal in both forms, every gradient against the fp64 reference."""
    _gpu_diagonal(monkeypatch, walk=diag_loop)
    _log_space(monkeypatch)
    _check_stored(family, case)


STORED_CASES = {  # (B, T, H, K, V, L)
    "T37-L32": (2, 37, 2, 20, 12, 32),
    "T70-L64-K60-V100": (1, 70, 1, 60, 100, 64),
    "T200-L160-K80": (1, 200, 2, 80, 12, 160),
}


def _check_stored(family, case):
    """Chunk mode on the stored-scores path: a dense case of STORED_CASES, or packed sequences."""
    fam = FAMILIES[family]
    if case == "varlen":
        check_varlen(family, "chunk", True, lens=[1, 9, 0, 45, 3, 20], chunk_size=32)
        return
    B, T, H, K, V, L = STORED_CASES[case]
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _check(fam, fam.build(B, T, H, K, V, False), h0, torch.float32, mode="chunk", chunk_size=L)


@pytest.mark.parametrize("family", ["gla", "rwkv6"])
def test_fast_chunks_over_several_row_tiles(family):
    """Fast chunks (the default for these gates) at L = 160: fast_scores_kernel and the fast
    dq/dk of apply_kernel over three row tiles of a chunk (64, 64 and a partial 32), two depth
    and output tiles (K = 80), a partial last chunk; every gradient against the fp64
    reference. The gates are checked to give chunks below the span limit."""
    from linrnn.engine import vector

    fam = FAMILIES[family]
    B, T, H, K, V, L = STORED_CASES["T200-L160-K80"]
    inputs = fam.build(B, T, H, K, V, False)
    g = inputs["gk" if family == "gla" else "w"]
    first = 0 if family == "rwkv6" else 1  # the span: −Σ g after the first G^X value
    spans = [float(-g[:, c0 + first : c0 + L].sum(1).amin()) for c0 in range(0, T, L)]
    assert min(spans) < vector.CHUNK_SPAN, spans
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _check(fam, inputs, h0, torch.float32, mode="chunk", chunk_size=L)


@pytest.mark.parametrize("case", ["T200-L160-K80"])
@pytest.mark.parametrize("family", ["gla", "rwkv6"])
def test_split_inter_matches_reference(monkeypatch, family, case):
    """gk alone in chunk mode: dq's and dk's inter-chunk parts from
    vector_scores_kernels.apply_kernel (``INTER``; three row tiles per chunk at L = 160, a partial
    one included; two output tiles at K = 80), loaded by the 16-row dq/dk programs in every chunk
    (fp32: no fast chunks). Every gradient against the fp64 reference, the intermediate buffers
    NaN-poisoned. (Row tiles of 32 at L = 32 and packed sequences, the same calls in the diagonal's
    form of the device: test_stored_scores_match_reference's T37-L32 and varlen cases,
    test_diagonal_walk_matches_reference's chunk-mode T37-L32 case.)"""
    _log_space(monkeypatch)
    _check_stored(family, case)


@pytest.mark.parametrize("family", ["gla", "rwkv6"])
def test_decay_gradient_over_row_tiles(family):
    """Chunks of 160 steps: the log-decay gradient's one-pass kernel (vector_gate_grad_kernels)
    walks each chunk in 64-row tiles from its end, carrying the sum across tiles, with K = 80
    over two channel tiles; here packed sequences across the cases of T = 200 (a full chunk of
    three tiles, a partial one of 40 steps). (T = 200 itself, B1-H2-K80-V12 in chunks of 160:
    test_fast_chunks_over_several_row_tiles, the same call, and on the fp32 path
    test_split_inter_matches_reference.)"""
    check_varlen(family, "chunk", True, lens=[130, 1, 69], chunk_size=160)


def test_stored_scores_are_all_written():
    """Every entry of the stored scores is written (allocations are NaN-poisoned in tests):
    causal scores below and on the diagonal, zeros above, a partial last chunk included."""
    from linrnn.engine import vector

    B, T, H, K, V, L = 1, 37, 2, 20, 12, 16
    q, k, v = (torch.randn(B, T, H, d, device=DEVICE) for d in (K, K, V))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device=DEVICE))
    out = torch.ops.linrnn.chunk_vec_fwd(q, k, v, g, None, None, None, 0.5, L, False, None)
    A = dict(zip(("o", *vector.OUTPUTS, *vector.PRODUCED), out))["A"]
    assert A.shape == (B, T, H, L) and bool(torch.isfinite(A).all())
    t = torch.arange(T, device=DEVICE)
    above = (t % L)[:, None] < torch.arange(L, device=DEVICE)[None, :]  # s − c0 > t − c0
    per_head = A[0].transpose(0, 1)  # [H, T, L]
    assert bool((per_head[:, above] == 0).all()) and bool((per_head[:, ~above] != 0).all())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", VECTOR)
def test_wider_sub_chunk_matches_reference(monkeypatch, family, mode):
    """A 32-step sub-chunk (the first entry of the rows/cols/fused tiles), walked: the tile
    choice a tuning run may pick to get 32-row products; T = 45 leaves a partial one."""
    from linrnn.engine import vector

    tiles = {name: (32, *t[1:]) if not name.startswith("states") else t
             for name, t in vector.VEC_TILES.items()}  # fmt: skip
    monkeypatch.setattr(vector, "VEC_TILES", tiles)
    _gpu_diagonal(monkeypatch)
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 45, 2, 24, 20
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _check(fam, fam.build(B, T, H, K, V, False), h0, torch.float32, mode=mode, chunk_size=64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", VECTOR)
def test_float16(family, mode):
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 33, 2, 16, 24
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _check(fam, fam.build(B, T, H, K, V, False), h0, torch.float16, mode=mode, chunk_size=32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", VECTOR)
def test_extreme_decays(family, mode):
    """Log decay −30 per step on a random half of the channels and steps (cumulative sums far
    below exp's fp32 range inside a chunk of 64): finite, and equal to the reference, gate
    gradients included. Under the interpreter any overflowing exp or inf·0 inside a kernel —
    even in a masked-off lane — raises."""
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 75, 2, 8, 6
    h0 = fam.make_state(B, H, K, V, torch.float32)
    strict = np.errstate(over="raise", invalid="raise") if DEVICE == "cpu" else nullcontext()
    with strict:
        _check(fam, fam.build(B, T, H, K, V, True), h0, torch.float32, factor=5.0, mode=mode,
               chunk_size=64)  # fmt: skip


def _mixed_spans(d: dict, strong: float) -> dict:
    """Mild gates, with a decay of ``strong`` per step on the channels past 32 (the second
    depth/output tile of K = V = 40) over steps 0–25 and 32–41."""
    for name in ("gk", "gv", "w"):
        if name in d:
            g = d[name].clone()
            g[:, :26, :, 32:] = strong
            g[:, 32:42, :, 32:] = strong
            d[name] = g
    return d


@pytest.mark.parametrize("diag_loop", [False, True], ids=["block", "walk"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", VECTOR)
def test_fast_forms_mixed_spans(monkeypatch, family, mode, diag_loop):
    """The fast forms beside the log-space one in one call, chunks of 32: decays of −5 per
    step on the second depth/output tile's channels give chunk 0 a span of ≈ 130 (sub-chunks:
    the first, ≈ 80, in log space, the second, ≈ 50, in the diagonal's fast form, factors up
    to e^25) and chunk 1 one of ≈ 50 (a fast chunk in chunk mode for gk-only calls, factors
    up to e^25). Every kernel that has a diagonal (forward, dq, dk, dv, gv's output gate,
    RWKV6's bonus). Any overflowing exp or inf·0, even in a masked lane, raises under the
    interpreter."""
    from linrnn.engine import vector

    _gpu_diagonal(monkeypatch, walk=diag_loop)
    assert vector.DIAG_SPAN == 60.0 and vector.CHUNK_SPAN == 60.0
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 45, 1, 40, 40
    h0 = fam.make_state(B, H, K, V, torch.float32)
    strict = np.errstate(over="raise", invalid="raise") if DEVICE == "cpu" else nullcontext()
    with strict:
        _check(fam, _mixed_spans(fam.build(B, T, H, K, V, False), -5.0), h0, torch.float32,
               mode=mode, chunk_size=32)  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", VECTOR)
def test_state_passing(family, mode):
    """Two Triton calls carrying the final state equal one call."""
    check_state_passing(family, mode, cut=19)


@pytest.mark.parametrize("init", [False, True], ids=["h0=None", "h0"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", VECTOR)
def test_varlen_matches_reference(family, mode, init):
    """Packed sequences natively (lengths 1, 0, shorter and longer than a chunk, ending
    mid-chunk and mid-sub-chunk): outputs, per-sequence final states and every gradient."""
    check_varlen(family, mode, init, lens=[1, 9, 0, 45, 3, 20], chunk_size=32)


@pytest.mark.parametrize("mode", MODES)
def test_rwkv6_matches_naive_loop(mode):
    """RWKV6's naive loop ([B, H, T, D] layout, no scale, fp64): o_t = Σ_k r_k (h + u k v)_k,
    then h = h·exp(w_t) + k v — the Triton kernels in fp32 against it."""
    B, H, T, K, V = 2, 3, 29, 10, 6
    f64 = dict(dtype=torch.float64, device=DEVICE)
    r, k = torch.randn(B, H, T, K, **f64), torch.randn(B, H, T, K, **f64)
    v = torch.randn(B, H, T, V, **f64)
    w = -torch.exp(torch.randn(B, H, T, K, **f64))
    u = torch.randn(H, K, **f64)
    h0 = torch.randn(B, H, K, V, **f64)
    h = h0.clone()
    o = torch.zeros(B, H, T, V, **f64)
    for i in range(T):
        kv = k[:, :, i, :, None] * v[:, :, i, None, :]
        o[:, :, i] = ((h + u[None, :, :, None] * kv) * r[:, :, i, :, None]).sum(-2)
        h = h * w[:, :, i].exp()[..., None] + kv
    bthk = lambda x: x.transpose(1, 2).float()  # noqa: E731
    got, hT = linrnn.rwkv6(
        bthk(r), bthk(k), bthk(v), bthk(w), u.float(), scale=1.0, initial_state=h0.float(),
        output_final_state=True, mode=mode, chunk_size=16, backend="triton",
    )  # fmt: skip
    assert_close("o", got, o.transpose(1, 2), torch.float32)
    assert_close("h_T", hT, h, torch.float32)


def test_backend_none_routes_vector_gates(monkeypatch):
    """backend=None on CUDA serves GLA (with gv) and RWKV6 with the Triton engine in both chunk
    modes (the one routing decision, _generic.route, on a device faked as CUDA); the result is
    the reference's."""
    from linrnn.ops import _generic

    q = torch.randn(1, 6, 1, 8, device=DEVICE)
    gk = torch.nn.functional.logsigmoid(torch.randn(1, 6, 1, 8, device=DEVICE))
    d = lambda x: x.double()  # noqa: E731
    ref_gla, _ = linrnn.gla(d(q), d(q), d(q), d(gk), gv=d(gk), mode="reference")
    ref_rwkv, _ = linrnn.rwkv6(d(q), d(q), d(q), d(gk), d(gk[0, 0]), mode="reference")
    routes = []
    real = _generic.route

    def spy(*args, **kw):
        r = real(*args, **kw)
        routes.append((r.mode, r.backend))
        return r

    monkeypatch.setattr(_generic, "_gpu", lambda device: True)
    monkeypatch.setattr(_generic, "route", spy)
    for mode in MODES:
        o, _ = linrnn.gla(q, q, q, gk, gv=gk, mode=mode)
        assert_close("o", o, ref_gla, torch.float32)
        o, _ = linrnn.rwkv6(q, q, q, gk, gk[0, 0], mode=mode)
        assert_close("o", o, ref_rwkv, torch.float32)
    assert routes == [(mode, "triton") for mode in MODES for _ in range(2)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["gla", "gla_gv"])
def test_long_sequence_decay_gradient_float16(family, mode):
    """The per-channel log-decay gradients are reverse sums over the sequence of terms that
    largely cancel (q ⊙ dq − k ⊙ dk, o ⊙ do − v ⊙ dv), so 16-bit rounding inside the kernels
    must not pile up along it: over T = 1024 (16 chunks) in fp16 they stay within 2× the error
    of the PyTorch loop in fp16. Both modes restart the sum at every chunk end: chunk mode from
    the exact Σ dS ⊙ S of the stored states, fused_chunk from the later chunks' inter-chunk
    terms alone (whose cross-chunk pairs cancel exactly); a whole-sequence sum's error would
    grow as √T."""
    from helpers import rel_err, run_with_grads

    fam = FAMILIES[family]
    inputs = _on(fam.build(1, 1024, 1, 16, 16, False))
    names = ["gk", "gv"] if family == "gla_gv" else ["gk"]
    ref = run_with_grads(fam, inputs, None, torch.float64, mode="reference")[2]
    low = run_with_grads(fam, inputs, None, torch.float16, mode="reference")[2]
    got = run_with_grads(fam, inputs, None, torch.float16, backend="triton", mode=mode,
                         chunk_size=64)[2]  # fmt: skip
    for n in names:
        err, base = rel_err(got[n], ref[n]), rel_err(low[n], ref[n])
        assert err <= 2.0 * base, f"d{n}: {err:.2e} vs the fp16 loop's {base:.2e}"


@pytest.mark.parametrize("K, L", [(64, 64), (128, 64), (256, 128)])
def test_default_chunk_size_of_vector_gates(K, L):
    """Without a chunk size, per-channel decays take 64 below head dims of 256 and 128 from
    there (the measured optima for GLA, config.default_chunk_size), the scalar engine 128 from
    head dims of 128."""
    from linrnn.engine import config, vector

    q = torch.randn(1, 4, 1, K, device=DEVICE)
    c = vector.config(q, q, q, scale=1.0, exclusive=False, chunk_size=None,
                                fused=False, offsets=None)  # fmt: skip
    assert c.L == L
    assert config.default_chunk_size(K, K) == (128 if K >= 128 else 64)


@pytest.mark.parametrize("slow", [False, True], ids=["all-fast", "one-slow-chunk"])
@pytest.mark.parametrize("family", ["gla", "rwkv6"])
def test_sub_chunk_launches_only_with_slow_chunks(monkeypatch, family, slow):
    """Chunk mode's backward leaves out dq's and dk's 16-row launches (vector_kernels'
    dq_bwd_kernel, dk_bwd_kernel) when every chunk is fast (vector._SlowChunks), and
    makes them when one is slow
    (decays of −5 per step on half the channels: chunk 0's span ≈ 130). Either way every
    gradient matches the fp64 reference; allocations are NaN-poisoned (conftest), so a row
    that only those launches would write fails."""
    from linrnn.engine import vector_kernels

    launched = []
    for name in ("dq_bwd_kernel", "dk_bwd_kernel"):
        real = getattr(vector_kernels, name)

        class Spy:
            def __getitem__(self, grid, real=real, name=name):
                def run(*args, **kw):
                    launched.append(name)
                    return real[grid](*args, **kw)

                return run

        monkeypatch.setattr(vector_kernels, name, Spy())
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 45, 1, 40, 40
    inputs = fam.build(B, T, H, K, V, False)
    if slow:
        inputs = _mixed_spans(inputs, -5.0)
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _check(fam, inputs, h0, torch.float32, mode="chunk", chunk_size=32)
    assert sorted(set(launched)) == (["dk_bwd_kernel", "dq_bwd_kernel"] if slow else [])


@pytest.mark.parametrize("case", ["T70-L32-K60-V100", "T150-L96", "varlen"])
@pytest.mark.parametrize("family", ["gla", "rwkv6"])
def test_pre_gated_queries_and_keys_are_exact(monkeypatch, family, case):
    """The cumulative-sum pass's gated q and k (vector_cumsum_kernels' GATE_QK), which the state
    kernels and the forward's and dv's apply kernels then take as they are, are the values
    those kernels form themselves: output, final state and every gradient equal bit for bit
    with the in-kernel gating of calls whose V fits one output tile, run on the same inputs
    (several chunks and tiles, an initial state, packed sequences; chunks of one row tile and
    of two, L = 96; V over more than one output tile of the apply kernels, where the engine
    pre-gates, and checked that it did); and both match the fp64 reference."""
    from helpers import run_with_grads

    from linrnn.engine import vector, vector_cumsum_kernels

    fam = FAMILIES[family]
    seq = {}
    if case == "varlen":
        lens = [1, 40, 0, 77, 9]
        B, T, H, K, V, L = 1, sum(lens), 2, 24, 72, 32
        seq["cu_seqlens"] = torch.tensor([0, *np.cumsum(lens)], device=DEVICE)
        h0 = fam.make_state(len(lens), H, K, V, torch.float32)
    else:
        B, T, H, K, V, L = (2, 70, 1, 60, 100, 32) if case[:3] == "T70" else (1, 150, 1, 20, 80, 96)
        h0 = fam.make_state(B, H, K, V, torch.float32)
    inputs, h0 = _on(fam.build(B, T, H, K, V, False)), _on(h0)
    kw = dict(backend="triton", mode="chunk", chunk_size=L, **seq)
    gating = []
    real = vector_cumsum_kernels.chunk_cumsum_kernel

    class Spy:
        def __getitem__(self, grid):
            def run(*args, **kw):
                gating.append(kw["GATE_QK"])
                return real[grid](*args, **kw)

            return run

    monkeypatch.setattr(vector_cumsum_kernels, "chunk_cumsum_kernel", Spy())
    on = run_with_grads(fam, inputs, h0, torch.float32, **kw)
    assert gating == [True], gating
    monkeypatch.setattr(vector, "_pre_gate", lambda *args: False)
    off = run_with_grads(fam, inputs, h0, torch.float32, **kw)
    assert torch.equal(on[0], off[0])
    for s, t in zip(on[1], off[1]):
        assert torch.equal(s, t)
    assert on[2].keys() == off[2].keys()
    for name in on[2]:
        assert torch.equal(on[2][name], off[2][name]), f"d{name}"
    # against the fp64 reference: the call just made (in-kernel gating, equal to the pre-gated)
    _check(fam, inputs, h0, torch.float32, cu_seqlens=seq.get("cu_seqlens"), got=off,
           mode="chunk", chunk_size=L)  # fmt: skip
