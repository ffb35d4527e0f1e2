"""The Triton chunk engine (scalar gates) against the float64 references: outputs, final states
and every gradient, for each family and mode, odd shapes, extreme gates and state passing.
Without a GPU it runs under TRITON_INTERPRET=1 (set in conftest), on small shapes.

bfloat16 is checked on the GPU only (the GPU correctness matrix): the Triton interpreter
emulates bf16 ``tl.dot`` wrongly (a 5-line bf16 dot kernel is off by ~1e10 there)."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import torch
from helpers import (
    FAMILIES,
    RTOL,
    SENSITIVITY_FACTOR,
    assert_close,
    flat_state,
    rel_err,
    run_with_grads,
    sensitivity,
)

import linrnn

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALAR = ["linear_attn", "linear_attn_norm", "retention", "simple_gla", "mlstm_exp", "mlstm_sig",
          "mlstm_sig_norm"]  # fmt: skip
MODES = ["chunk", "fused_chunk"]


def _on(x):
    if isinstance(x, dict):
        return {n: t.to(DEVICE) for n, t in x.items()}
    if isinstance(x, tuple):
        return tuple(t.to(DEVICE) for t in x)
    return None if x is None else x.to(DEVICE)


def _identity_scale(fam, inputs, grads):
    """Size of the terms the engine sums for a log-decay gradient: dlogα_u = Σ_{t≥u} (q_t·dq_t −
    k_t·dk_t). Their fp32 rounding (and the error of dq, dk) is what the result carries, so an
    error ≤ tol·‖Σ_{t≥u} (|q·dq| + |k·dk|)‖ is the bound the identity can meet. For normalized
    outputs q·dq ≈ 0 and the k·dk sum nearly cancels (a normalized output does not see a common
    scale of the keys), so the result can be far smaller than its terms — mLSTM-exp with input
    gates at ±20 is the case (seed 1603509713: 1.3e-4 absolute on a true 1e-9)."""
    q = inputs[fam.tensors[0]].double()
    terms = (q * grads[fam.tensors[0]]).sum(-1).abs() + (inputs["k"] * grads["k"]).sum(-1).abs()
    scale = terms.flip(1).cumsum(1).flip(1)  # [B, T, H]
    if "f" in inputs:  # d f̃ = dlog σ(f̃) · σ(−f̃)
        scale = scale * torch.sigmoid(-inputs["f"].double())
    return scale


def _m0_identity_scale(h0, grads):
    """Size of the terms of the initial max state's gradient, ∂L/∂m_0 = ⟨dC_0, C_0⟩ +
    ⟨dn_0, n_0⟩ (+ the routed max path): the stored state is C_0·e^{−m_0}. A normalized output
    does not see a common scale of (C, n), so the two products cancel and the true value can be
    ~1e-9 beside terms of ~5 (mLSTM-exp, gates at ±20, seed 11: fp32 error 1.1e-6, i.e. 1e-7
    of the terms). An error ≤ tol·‖|⟨dC_0, C_0⟩| + |⟨dn_0, n_0⟩|‖ is what the identity can meet."""
    S0, n0 = h0[0].double(), h0[1].double()
    return (grads["h0[0]"] * S0).sum((-2, -1)).abs() + (grads["h0[1]"] * n0).sum(-1).abs()


def _check(fam, inputs, h0, dtype, factor=1.0, cu_seqlens=None, decay_by_terms=False, got=None,
           m0_by_terms=False, **kw):  # fmt: skip
    """Triton run vs the fp64 reference loop; the tolerance is the dtype's, or 2× the error
    of the reference loop run in the same dtype (see helpers.assert_close), or
    SENSITIVITY_FACTOR × what rounding the inputs alone costs (:func:`helpers.sensitivity`). With
    ``decay_by_terms`` the [B, T, H] log-decay gradient is held to the conditioning bound of
    :func:`_identity_scale` instead, and mLSTM-exp's ∂L/∂m_0 to :func:`_m0_identity_scale`
    (``m0_by_terms``: that one alone). ``got``: the results of this very Triton call
    (``run_with_grads`` with ``backend="triton"`` and ``kw``) where the test has made it
    already, instead of a second run."""
    inputs, h0 = _on(inputs), _on(h0)
    if cu_seqlens is not None:
        kw["cu_seqlens"] = cu_seqlens
    seq = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
    ref = run_with_grads(fam, inputs, h0, torch.float64, mode="reference", **seq)
    low = run_with_grads(fam, inputs, h0, dtype, mode="reference", **seq)
    if got is None:
        got = run_with_grads(fam, inputs, h0, dtype, backend="triton", **kw)
    sens = sensitivity(fam, inputs, h0, dtype, ref, **seq)
    fac = lambda name: max(factor, SENSITIVITY_FACTOR * sens[name] / RTOL[dtype])  # noqa: E731
    assert got[0].dtype == dtype
    assert_close("o", got[0], ref[0], dtype, fac("o"), low[0])
    assert len(got[1]) == len(ref[1])
    for j, (s, r) in enumerate(zip(got[1], ref[1])):
        assert s.dtype == torch.float32, f"state[{j}] is {s.dtype}"
        assert_close(f"state[{j}]", s, r, dtype, fac(f"state[{j}]"), low[1][j])
    assert got[2].keys() == ref[2].keys(), f"grads {sorted(got[2])} vs {sorted(ref[2])}"
    for name in ref[2]:
        if decay_by_terms and name in ("f", "g"):
            scale = _identity_scale(fam, {n: t.double() for n, t in inputs.items()}, ref[2])
            err = (got[2][name].double() - ref[2][name]).norm() / scale.norm()
            assert err <= RTOL[dtype] * factor, f"d{name}: {err:.2e} of the summed terms' size"
            continue
        if (decay_by_terms or m0_by_terms) and name == "h0[2]":
            scale = _m0_identity_scale(h0, ref[2])
            err = (got[2][name].double() - ref[2][name]).norm() / scale.norm()
            assert err <= RTOL[dtype] * factor, f"dm0: {err:.2e} of its two terms' size"
            continue
        assert_close(f"d{name}", got[2][name], ref[2][name], dtype, fac(f"d{name}"),
                     low[2][name])  # fmt: skip


@pytest.mark.parametrize("init", [False, True], ids=["h0=None", "h0"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", SCALAR)
def test_matches_reference(family, mode, init):
    """fp32, T not a multiple of the chunk, K ≠ V, non-power-of-two head dims."""
    fam = FAMILIES[family]
    B, T, H, K, V = 2, 37, 2, 20, 12
    h0 = fam.make_state(B, H, K, V, torch.float32) if init else None
    _check(fam, fam.build(B, T, H, K, V, False), h0, torch.float32, mode=mode, chunk_size=16)


@pytest.mark.parametrize("shape", [(1, 100, 1, 72, 40, 80), (1, 50, 2, 16, 100, 24),
                                   (2, 9, 1, 8, 8, 5), (1, 21, 1, 512, 60, 16)],
                         ids=["K72-V40-L80", "K16-V100-L24", "T9-L5", "K512-V60"])  # fmt: skip
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["simple_gla", "mlstm_exp", "linear_attn_norm"])
def test_tiling_shapes(family, mode, shape):
    """Head dims above one tile (up to 512), chunks longer than a query tile and not a
    multiple of it, chunks shorter than the smallest tile. mLSTM-exp's ∂L/∂m_0 =
    ⟨dC_0, C_0⟩ + ⟨dn_0, n_0⟩ is held to its terms' size (:func:`_m0_identity_scale`): at
    K = 512, V = 60 each term sums 30,720 products, they cancel to a third of their size or far
    less, and the value inherits dC_0's fp32 error times that (fused_chunk, one seed: 9.4e-4 on
    7.14, 1.3e-4 of the value, 4.2e-5 of the terms; chunk mode's error there 1.9e-6)."""
    fam = FAMILIES[family]
    B, T, H, K, V, L = shape
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _check(fam, fam.build(B, T, H, K, V, False), h0, torch.float32, mode=mode, chunk_size=L,
           m0_by_terms=True)  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", SCALAR)
def test_float16(family, mode):
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 33, 2, 16, 24
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _check(fam, fam.build(B, T, H, K, V, False), h0, torch.float16, mode=mode, chunk_size=16)


@pytest.mark.parametrize("family", ["linear_attn_norm", "simple_gla", "mlstm_exp", "mlstm_sig"])
def test_chunk_states_stored_in_16_bit(family, monkeypatch):
    """The chunk states and their gradients are stored in the inputs' 16-bit dtype
    (``config.chunk_state_dtype``; docs/DESIGN.md §6.2): every reader casts them to that dtype
    for its products, so the output, the final state and the gradients of q, k, v and the
    initial state are bitwise those of fp32 storage; the gate gradients, whose chunk-end value
    ⟨dC, C⟩ then reads C rounded, stay within 1.5× fp32 storage's error against fp64."""
    import linrnn.engine.scalar as scalar

    fam = FAMILIES[family]
    B, T, H, K, V = 1, 80, 2, 32, 32
    inputs = fam.build(B, T, H, K, V, False)
    h0 = fam.make_state(B, H, K, V, torch.float32)
    _, _, ref = run_with_grads(fam, _on(inputs), _on(h0), torch.float64, backend="torch",
                               mode="reference")  # fmt: skip
    runs = {}
    for store in ("16-bit", "fp32"):
        if store == "fp32":
            monkeypatch.setattr(scalar, "chunk_state_dtype", lambda dtype: torch.float32)
        runs[store] = run_with_grads(fam, _on(inputs), _on(h0), torch.float16, backend="triton",
                                     mode="chunk", chunk_size=16)  # fmt: skip
    (o16, s16, g16), (o32, s32, g32) = runs["16-bit"], runs["fp32"]
    assert torch.equal(o16, o32)
    assert all(torch.equal(a, b) for a, b in zip(s16, s32))
    assert set(g16) == set(g32)
    for n in g16:
        if n in ("q", "k", "v") or n.startswith("h0"):
            assert torch.equal(g16[n], g32[n]), n
        else:  # a gate
            err16, err32 = rel_err(g16[n], ref[n]), rel_err(g32[n], ref[n])
            assert err16 <= 1.5 * err32 + 1e-6, (n, err16, err32)


@pytest.mark.parametrize("family", SCALAR)
def test_single_tile_chunks_match_the_tiled_path_bitwise(family, monkeypatch):
    """A chunk that is one tile (L ≤ the kernels' time tile) takes the single-tile path (the
    diagonal tile alone, its intra-chunk part formed apart from the inter-chunk product; dq and
    dk by one kernel from one weighted matrix, docs/tuning.md): the same operations in the same
    order as the tiled path, so the output, final state and every gradient are bitwise the
    tiled path's. On a GPU the compiler contracts multiply-adds into FMAs kernel by kernel
    (the normalizer families' paths differed in the last bits there): both paths must agree
    to within bf16 rounding of a few elements instead."""
    import linrnn.engine.scalar as scalar

    fam = FAMILIES[family]
    inputs = _on(fam.build(1, 80, 2, 32, 24, False))
    h0 = _on(fam.make_state(1, 2, 32, 24, torch.float32))
    runs = []
    for tiled in (False, True):
        if tiled:
            monkeypatch.setattr(scalar, "one_tile", lambda L, BT: False)
        runs.append(run_with_grads(fam, inputs, h0, torch.bfloat16, backend="triton",
                                   mode="chunk", chunk_size=16))  # fmt: skip
    (o1, s1, g1), (o0, s0, g0) = runs
    assert set(g1) == set(g0)
    pairs = [("o", o1, o0), *((f"state{i}", a, b) for i, (a, b) in enumerate(zip(s1, s0)))]
    pairs += [(n, g1[n], g0[n]) for n in g1]
    for name, a, b in pairs:
        if DEVICE == "cuda":
            assert rel_err(a, b) <= 4e-3, (family, name, rel_err(a, b))
        else:
            assert torch.equal(a, b), (family, name)


@pytest.mark.parametrize("mode", MODES)
def test_decay_gradient_long_sequence_fp16(mode):
    """The log-decay gradient sums q·dq − k·dk over the sequence, terms that largely cancel, so
    16-bit rounding inside the kernels must not pile up along it. Over T=1024 in fp16 it stays
    within 3× the same-dtype PyTorch engine's error (measured 1.8–2.1× in chunk mode, which
    restarts the sum from the exact ⟨dC, C⟩ at every chunk end, and 1.4–1.7× in fused_chunk,
    whose inter-chunk terms cancel exactly; a plain whole-sequence sum measured 4.2×)."""
    B, T, H, K, V = 1, 1024, 2, 32, 32
    q, k = torch.randn(B, T, H, K, device=DEVICE), torch.randn(B, T, H, K, device=DEVICE)
    v, do = torch.randn(B, T, H, V, device=DEVICE), torch.randn(B, T, H, V, device=DEVICE)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=DEVICE) + 4)
    grads = {}
    runs = {
        "ref": (torch.float64, dict(backend="torch", mode="reference")),
        "torch": (torch.float16, dict(backend="torch", mode="chunk")),
        "triton": (torch.float16, dict(backend="triton", mode=mode)),
    }
    for name, (dtype, opts) in runs.items():
        x = [t.to(torch.float16).to(dtype).requires_grad_() for t in (q, k, v)]
        gg = g.clone().requires_grad_()
        o, _ = linrnn.simple_gla(*x, gg, chunk_size=64, **opts)
        (o.double() * do.double()).sum().backward()
        grads[name] = gg.grad.double()
    err = {n: rel_err(grads[n], grads["ref"]) for n in ("torch", "triton")}
    assert err["triton"] <= 3 * err["torch"], err


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["retention", "simple_gla", "mlstm_exp", "mlstm_sig",
                                    "mlstm_sig_norm"])  # fmt: skip
def test_extreme_gates(family, mode):
    """Log decay −30 per step, mLSTM input pre-activations ±20 and saturated forget gates:
    finite, and equal to the reference. Factor 5 as in test_ops.test_extreme_gates. The fp32
    gradient w.r.t. an initial m is a sum of cancelling terms and is held to their size (see
    _m0_identity_scale; seed 11 failed the plain bound in fused_chunk). The log-decay
    gradient is held to the conditioning of the identity that computes it (see
    _identity_scale): with the chunk-end restart it meets the plain bound in most seeds, but
    not all (3 of 31), against the PyTorch engine, which differentiates chunk-locally.
    Under the interpreter, any overflowing exp or inf·0 inside a kernel — even in a masked-off
    lane — is an error."""
    fam = FAMILIES[family]
    B, T, H, K, V = 1, 45, 2, 8, 6
    h0 = fam.make_state(B, H, K, V, torch.float32)
    strict = np.errstate(over="raise", invalid="raise") if DEVICE == "cpu" else nullcontext()
    with strict:
        _check(fam, fam.build(B, T, H, K, V, True), h0, torch.float32, factor=5.0, mode=mode,
               chunk_size=16, decay_by_terms=True)  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", SCALAR)
def test_state_passing(family, mode):
    """Two Triton calls carrying the final state equal one call."""
    check_state_passing(family, mode, cut=17)


def check_state_passing(family, mode, cut):
    """Calls on [:cut] then [cut:] from its final state ≡ one call (fp32, chunks of 16)."""
    fam = FAMILIES[family]
    B, T, H, K, V = 2, 41, 2, 9, 5
    inputs = {n: t.float() for n, t in _on(fam.build(B, T, H, K, V, False)).items()}
    kw = dict(backend="triton", mode=mode, chunk_size=16, output_final_state=True)
    o, st = fam.call(inputs, **kw)
    first = {n: (t[:, :cut] if t.dim() >= 3 else t) for n, t in inputs.items()}
    second = {n: (t[:, cut:] if t.dim() >= 3 else t) for n, t in inputs.items()}
    o1, st1 = fam.call(first, **kw)
    o2, st2 = fam.call(second, initial_state=st1, **kw)
    assert_close("o", torch.cat([o1, o2], dim=1), o, torch.float32)
    for j, (a, b) in enumerate(zip(flat_state(st2), flat_state(st))):
        assert_close(f"state[{j}]", a, b, torch.float32)


@pytest.mark.parametrize("init", [False, True], ids=["h0=None", "h0"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", SCALAR)
def test_varlen_matches_reference(family, mode, init):
    """Packed sequences natively (lengths 1, 0, shorter and longer than a chunk, one ending
    mid-chunk): outputs, per-sequence final states and every gradient equal the fp64
    reference run on the same packed batch (which runs each sequence on its own)."""
    check_varlen(family, mode, init, lens=[1, 9, 0, 23, 3, 16], chunk_size=8)


def check_varlen(family, mode, init, lens, chunk_size):
    """Sequences of ``lens`` packed in one row (fp32, H=2, K=12, V=10) against the reference."""
    fam = FAMILIES[family]
    T, H, K, V = sum(lens), 2, 12, 10
    offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    h0 = fam.make_state(len(lens), H, K, V, torch.float32) if init else None
    _check(fam, fam.build(1, T, H, K, V, False), h0, torch.float32, mode=mode,
           chunk_size=chunk_size, cu_seqlens=offsets)  # fmt: skip


def test_rejects_what_it_cannot_run():
    q = torch.randn(1, 8, 1, 4, device=DEVICE)
    with pytest.raises(TypeError, match="float64"):
        linrnn.linear_attn(q.double(), q.double(), q.double(), backend="triton")
    with pytest.raises(ValueError, match=r"chunk_size must be ≤ 128, got 256"):
        linrnn.linear_attn(q, q, q, backend="triton", mode="fused_chunk", chunk_size=256)


def test_backend_none_falls_back_where_triton_cannot(monkeypatch):
    """backend=None takes the PyTorch path for inputs the Triton kernels don't serve (fp64)
    instead of raising, and fp32 inputs to the Triton kernels."""
    from linrnn.ops import _generic

    monkeypatch.setattr(_generic, "_gpu", lambda device: True)  # as on a CUDA device
    q = torch.randn(1, 6, 1, 8, device=DEVICE, dtype=torch.float64)
    gk = torch.nn.functional.logsigmoid(torch.randn(1, 6, 1, 8, device=DEVICE)).double()
    picked = []
    real = _generic.route
    monkeypatch.setattr(
        _generic, "route", lambda *a, **k: picked.append(real(*a, **k)) or picked[-1]
    )
    ref, _ = linrnn.gla(q, q, q, gk, mode="reference")
    o, _ = linrnn.gla(q, q, q, gk, mode="chunk")
    assert picked[-1] == _generic.Route("chunk", "torch", 64)
    assert_close("o", o, ref, torch.float64)
    o, _ = linrnn.gla(q.float(), q.float(), q.float(), gk.float(), mode="chunk")
    assert picked[-1] == _generic.Route("chunk", "triton", 64)
    assert_close("o", o, ref, torch.float32)


@pytest.mark.parametrize("rows,L,targets", [(4, 64, 3), (3, 300, 301), (2, 1, 2), (5, 33, 8)])
def test_max_state_routing_sums_each_run(rows, L, targets):
    """mLSTM-exp's max-state gradient routing (``gate_grads.route_argmax``): dz[p] =
    Σ_{t: idx_t = p} dm_t for a running argmax idx, against a plain loop; targets that no step
    points at get exactly 0."""
    from linrnn.engine.gate_grads import route_argmax

    dm = torch.randn(rows, L, dtype=torch.float32)
    idx = torch.randint(0, targets, (rows, L)).cummax(1).values
    want = torch.zeros(rows, L + 1, dtype=torch.float64)
    hit = torch.zeros(rows, L + 1, dtype=torch.bool)
    for r in range(rows):
        for t in range(L):
            want[r, int(idx[r, t])] += float(dm[r, t])
            hit[r, int(idx[r, t])] = True
    got = route_argmax(dm, idx, L + 1)
    assert got.dtype == torch.float32 and got.shape == (rows, L + 1)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert torch.all(got[~hit] == 0)


class _Launches:
    """Records the keyword arguments of every launch of a Triton kernel, then launches it."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def launch(**kw):
            self.calls.append(kw)
            return self.kernel[grid](**kw)

        return launch


@pytest.mark.parametrize("mode", ["chunk", "chunk-tiled", "fused_chunk", "recurrent"])
@pytest.mark.parametrize("family", ["retention", "simple_gla"])
def test_gates_without_gradient_skip_its_work(family, mode, monkeypatch):
    """A decay that wants no gradient (retention's fixed γ, a frozen gate): no dg, and none of
    the work only it needs (the kernels' q·dq, k·dk and chunk-end ⟨dC, C⟩ terms, the gate
    gradient kernel, the reductions), while dq, dk, dv and the initial state's gradient are
    those of the same call with the gate's gradient: bitwise in chunk mode (the same kernels,
    less stored; one-tile chunks and, "chunk-tiled", the tiled dq and dk kernels), in the
    recurrent kernels' backward and in fused_chunk with fp32 inputs; with bf16 inputs
    fused_chunk rounds the state's products as the forward does once no decay gradient needs
    them exact, so there the two agree to bf16 rounding."""
    import linrnn.engine.recurrent as rec
    import linrnn.engine.scalar as scalar

    B, T, H, K, V = 1, 37, 2, 16, 8
    fn = linrnn.retention if family == "retention" else linrnn.simple_gla
    opts = dict(output_final_state=True, mode=mode.split("-")[0], backend="triton", chunk_size=16)
    kernels = [(scalar.walk, "states_bwd_kernel"), (scalar.fused, "fused_dq_kernel"),
               (scalar.fused, "fused_dk_kernel")]  # fmt: skip
    kernels += [(scalar.kern, n) for n in ("dqk_bwd_kernel", "dq_bwd_kernel", "dk_bwd_kernel")]
    kernels += [(rec.kern, f"recurrent_bwd_kernel_{x}") for x in ("dq", "dk", "dv")]
    dtypes = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
    for dtype in dtypes:
        q, k, v = (torch.randn(B, T, H, d, device=DEVICE).to(dtype) for d in (K, K, V))
        S0 = torch.randn(B, H, K, V, device=DEVICE)
        if family == "retention":
            g = torch.log1p(-torch.exp2(-2.0 - torch.rand(H, device=DEVICE) * 4))
        else:
            g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=DEVICE) + 2)
        do = torch.randn(B, T, H, V, device=DEVICE).to(dtype)
        grads, spies = {}, []
        for wants in (True, False):
            if mode == "chunk-tiled":
                monkeypatch.setattr(scalar, "one_tile", lambda L, BT: False)
            if not wants:  # the gate gradients' host code must not run
                fail = lambda *a, **kw: pytest.fail("gate gradients formed")  # noqa: E731
                monkeypatch.setattr(scalar, "chunk_gate_grads", fail)
                monkeypatch.setattr(scalar, "gate_grads", fail)
                monkeypatch.setattr(rec, "_gate_grads", fail)
                spies = [_Launches(getattr(mod, n)) for mod, n in kernels]
                for (mod, n), spy in zip(kernels, spies):
                    monkeypatch.setattr(mod, n, spy)
            leaves = [x.clone().requires_grad_() for x in (q, k, v, S0)]
            gg = g.clone().requires_grad_(wants)
            o, S_T = fn(*leaves[:3], gg, initial_state=leaves[3], **opts)
            ins = leaves + [gg] * wants
            grads[wants] = torch.autograd.grad((o, S_T), ins, (do, torch.ones_like(S_T)))
            monkeypatch.undo()
        launches = [kw for spy in spies for kw in spy.calls]
        assert launches
        for kw in launches:
            for flag in ("STORE_QDQ", "STORE_KDK", "STORE_VDV", "HAS_BND", "SPLIT"):
                assert not kw.get(flag, False), (flag, sorted(kw))
            assert all(kw.get(n) is None for n in ("qdq", "kdk", "vdv", "bnd")), sorted(kw)
        bitwise = mode != "fused_chunk" or dtype == torch.float32
        for name, a, b in zip(("dq", "dk", "dv", "dS0"), grads[False], grads[True]):
            if bitwise:
                assert torch.equal(a, b), (name, dtype)
            else:
                assert rel_err(a.double().cpu(), b.double().cpu()) < 1e-2, (name, dtype)
