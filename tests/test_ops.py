"""Every torch path of every family against the float64 step-by-step reference: outputs, final
states and the gradients of every input (q/r, k, v, gates, u, initial state)."""

from __future__ import annotations

import pytest
import torch
from helpers import FAMILIES, assert_close, flat_state, run_with_grads

FAMS = list(FAMILIES)


def _compare(fam, inputs, init, dtype, factor=1.0, ref_kw=None, **kw):
    ref = run_with_grads(fam, inputs, init, torch.float64, mode="reference", **(ref_kw or {}))
    got = run_with_grads(fam, inputs, init, dtype, **kw)
    # For 16/32-bit inputs, the reference loop in the same dtype calibrates the tolerance.
    low = (
        None
        if dtype == torch.float64
        else run_with_grads(fam, inputs, init, dtype, mode="reference")
    )
    pick = lambda i, j=None: None if low is None else (low[i] if j is None else low[i][j])  # noqa: E731
    assert got[0].dtype == dtype, f"output dtype {got[0].dtype} != input dtype {dtype}"
    assert_close("o", got[0], ref[0], dtype, factor, pick(0))
    assert len(got[1]) == len(ref[1])
    for j, (s, r) in enumerate(zip(got[1], ref[1])):
        want = torch.float64 if dtype == torch.float64 else torch.float32
        assert s.dtype == want, f"state[{j}] dtype {s.dtype}, expected {want}"
        assert_close(f"state[{j}]", s, r, dtype, factor, pick(1, j))
    assert got[2].keys() == ref[2].keys(), f"grads {sorted(got[2])} vs {sorted(ref[2])}"
    for name in ref[2]:
        assert_close(f"d{name}", got[2][name], ref[2][name], dtype, factor, pick(2, name))


@pytest.mark.parametrize("init", [False, True], ids=["h0=None", "h0"])
@pytest.mark.parametrize(
    "mode,chunk_size",
    [("parallel", None), ("recurrent", None), ("chunk", 16), ("chunk", 7), ("chunk", 64)],
    ids=["parallel", "recurrent", "chunk16", "chunk7", "chunk64>T"],
)
@pytest.mark.parametrize("family", FAMS)
def test_matches_reference_fp64(family, mode, chunk_size, init):
    """Exact math: every form in fp64 equals the loop to ~1e-9 (T=37 is no multiple of 16/7)."""
    fam = FAMILIES[family]
    B, T, H, K, V = 2, 37, 3, 12, 7
    inputs = fam.build(B, T, H, K, V, False)
    h0 = fam.make_state(B, H, K, V) if init else None
    _compare(fam, inputs, h0, torch.float64, mode=mode, chunk_size=chunk_size)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
@pytest.mark.parametrize("family", FAMS)
def test_chunk_low_precision(family, dtype):
    """fp32/bf16/fp16 inputs: states and gate math stay fp32, output in the input dtype. The
    reference sees the same rounded inputs, so the error is the path's own."""
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 50, 2, 20, 12
    inputs = {n: t.to(dtype).double() for n, t in fam.build(B, T, H, K, V, False).items()}
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _compare(fam, inputs, h0, dtype, mode="chunk", chunk_size=16)


@pytest.mark.parametrize(
    "mode,dtype",
    [("chunk", torch.float32), ("chunk", torch.float64), ("parallel", torch.float64)],
    ids=["chunk-fp32", "chunk-fp64", "parallel-fp64"],
)
@pytest.mark.parametrize("family", FAMS)
def test_extreme_gates(family, mode, dtype):
    """Log decay −30 per step (cumulative far below fp32's exp range) and mLSTM input
    pre-activations of ±20: finite, and equal to the reference. The chunk engine (the compute
    path) runs in fp32 and fp64, the parallel reference in fp64 (its role). In fp32 the factor 5
    covers the worst case seen over ~300 seeds: sigmoid mLSTM's gradient w.r.t. the initial m
    (a sum of cancelling terms, ~6e-5 in size) off by 3.1e-4 RMS-relative (seed 1055)."""
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 45, 2, 8, 6
    inputs = fam.build(B, T, H, K, V, True)
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _compare(fam, inputs, h0, dtype, factor=5.0, mode=mode, chunk_size=16)


@pytest.mark.parametrize("family", FAMS)
def test_state_passing(family):
    """Two chunked calls carrying the final state equal one call, outputs and state."""
    fam = FAMILIES[family]
    B, T, H, K, V = 2, 41, 2, 9, 5
    inputs = fam.build(B, T, H, K, V, False)
    cut = 17
    o, st = fam.call(inputs, mode="chunk", chunk_size=8, output_final_state=True)
    first = {n: (t[:, :cut] if t.dim() >= 3 else t) for n, t in inputs.items()}
    second = {n: (t[:, cut:] if t.dim() >= 3 else t) for n, t in inputs.items()}
    o1, st1 = fam.call(first, mode="chunk", chunk_size=8, output_final_state=True)
    o2, st2 = fam.call(second, mode="chunk", chunk_size=8, initial_state=st1,
                       output_final_state=True)  # fmt: skip
    assert_close("o", torch.cat([o1, o2], dim=1), o, torch.float64)
    for j, (a, b) in enumerate(zip(flat_state(st2), flat_state(st))):
        assert_close(f"state[{j}]", a, b, torch.float64)


@pytest.mark.parametrize("init", [False, True], ids=["h0=None", "h0"])
@pytest.mark.parametrize("mode", ["reference", "parallel", "chunk"])
@pytest.mark.parametrize("family", FAMS)
def test_varlen_equals_per_sequence(family, mode, init):
    """Packed sequences (lengths 1, 0, shorter and longer than a chunk) equal separate calls,
    outputs, per-sequence final states and gradients."""
    fam = FAMILIES[family]
    lens = [1, 9, 0, 23, 3]
    T, H, K, V = sum(lens), 2, 6, 5
    offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    inputs = fam.build(1, T, H, K, V, False)
    h0 = fam.make_state(len(lens), H, K, V) if init else None
    o, st, grads = run_with_grads(fam, inputs, h0, cu_seqlens=offsets, mode=mode, chunk_size=8)

    # The same computation, one sequence at a time (reference mode, batch of one).
    h0_list = flat_state(h0)
    o_parts, st_parts = [], []
    for i, L in enumerate(lens):
        s, e = offsets[i].item(), offsets[i + 1].item()
        if L == 0:
            if not init:  # the empty state: zeros, and m = −∞ for mLSTM-exp (0 for sigmoid)
                empty = [torch.zeros_like(x[i : i + 1]) for x in st]
                if family == "mlstm_exp":
                    empty[2] = torch.full_like(empty[2], float("-inf"))
                st_parts.append(empty)
            elif family.startswith("mlstm_sig"):  # the sigmoid form folds m into C and n
                C, n, m = (h[i : i + 1] for h in h0_list)
                w = torch.exp(m)
                st_parts.append([C * w[..., None, None], n * w[..., None], torch.zeros_like(m)])
            else:
                st_parts.append([h[i : i + 1] for h in h0_list])
            continue
        seq = {n: (t[:, s:e] if t.dim() >= 3 else t) for n, t in inputs.items()}
        h0_i = None
        if init:
            parts = [h[i : i + 1] for h in h0_list]
            h0_i = tuple(parts) if isinstance(h0, tuple) else parts[0]
        o_i, st_i = fam.call(seq, mode="reference", initial_state=h0_i, output_final_state=True)
        o_parts.append(o_i)
        st_parts.append(flat_state(st_i))
    assert_close("o", o, torch.cat(o_parts, dim=1), torch.float64)
    for j in range(len(st)):
        assert_close(f"state[{j}]", st[j], torch.cat([p[j] for p in st_parts]), torch.float64)
    # Gradients of the packed call equal the reference per-sequence gradients (same loss).
    ref = run_with_grads(fam, inputs, h0, cu_seqlens=offsets, mode="reference")
    for name in ref[2]:
        assert_close(f"d{name}", grads[name], ref[2][name], torch.float64)


@pytest.mark.parametrize("family", FAMS)
@pytest.mark.parametrize("mode", ["reference", "parallel", "chunk"])
def test_single_step_and_odd_dims(family, mode):
    """T = 1, B·H = 1, and head dims that are no power of two (K=60, V=100)."""
    fam = FAMILIES[family]
    for B, T, H, K, V in [(1, 1, 1, 60, 100), (3, 1, 2, 5, 3), (1, 19, 1, 60, 100)]:
        inputs = fam.build(B, T, H, K, V, False)
        _compare(fam, inputs, None, torch.float64, mode=mode, chunk_size=16)


@pytest.mark.parametrize("per_step", [0.05, 2.0, 30.0], ids=["mild", "strong", "extreme"])
@pytest.mark.parametrize("family", ["simple_gla", "gla", "gla_gv", "rwkv6", "mlstm_sig"])
def test_chunk_decay_regimes(family, per_step):
    """Each intra-chunk path of the engine at L=64: the decay folded into the matmul operands
    (chunk decay ≤ e^-60: mild), sub-chunk factorization (strong: 128 per chunk, 32 per
    sub-chunk), and exact log space (extreme). fp32 against the fp64 reference."""
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 150, 2, 8, 6
    inputs = fam.build(B, T, H, K, V, False)
    for name in ("g", "gk", "gv", "w"):
        if name in inputs:
            inputs[name] = -2 * per_step * torch.rand_like(inputs[name])
    if family == "mlstm_sig":  # log σ(f̃) ≈ −per_step
        inputs["f"] = torch.full_like(inputs["f"], -per_step) + 0.1 * torch.randn_like(inputs["f"])
    _compare(fam, inputs, fam.make_state(B, H, K, V, torch.float32), torch.float32, factor=2.0,
             mode="chunk", chunk_size=64)  # fmt: skip


@pytest.mark.parametrize("family", ["simple_gla", "mlstm_sig"])
def test_chunk_strong_decay_at_chunk_start(family):
    """A strong decay at the first step of each chunk and none after it: the chunk's later key
    weights then sit ~100 above its query weights in log space, so the decay folds into the
    operands only as one bounded product (apart, exp(b_r) underflows and the key maximum's
    exp overflows fp32: 0·inf gave NaN). fp32 on the torch chunk path against fp64."""
    fam = FAMILIES[family]
    B, T, H, K, V, L = 1, 24, 2, 8, 6, 8
    inputs = fam.build(B, T, H, K, V, False)
    start = torch.arange(T) % L == 0
    name, low, high = ("g", -100.0, -0.01) if family == "simple_gla" else ("f", -100.0, 6.0)
    inputs[name] = torch.where(start[None, :, None], low, high).expand_as(inputs[name]).clone()
    _compare(fam, inputs, fam.make_state(B, H, K, V, torch.float32), torch.float32,
             mode="chunk", chunk_size=L)  # fmt: skip


@pytest.mark.parametrize("scale", [-0.7, 0.0], ids=["negative", "zero"])
@pytest.mark.parametrize("family", ["linear_attn_norm", "simple_gla", "gla", "rwkv6", "mlstm_exp"])
def test_any_finite_scale(family, scale):
    """The scale is folded into decay factors inside the engine (as exp(b + log scale) when it
    is positive); negative and zero scales take the other branch and must agree too."""
    fam = FAMILIES[family]
    inputs = fam.build(1, 21, 2, 6, 5, False)
    _compare(fam, inputs, fam.make_state(1, 2, 6, 5), torch.float64, mode="chunk", chunk_size=8,
             ref_kw={"scale": scale}, scale=scale)  # fmt: skip
