"""Numerical hardening (docs/DESIGN.md §6): no NaN from finite inputs, causality under
non-finite values at late steps, precision under strong decays, and the accuracy of the decay
gradients. Torch-path cases are in the fast tier; the cases parametrized with ``"triton"`` run
the kernels (in the interpreter without a GPU) and are in the interpreter tier."""

from __future__ import annotations

import pytest
import torch
from helpers import FAMILIES, U32, Family, assert_close, run_with_grads

import linrnn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TORCH_MODES = ["reference", "recurrent", "parallel", "chunk"]
TRITON_MODES = ["chunk", "fused_chunk", "recurrent"]
BACKEND_MODES = [("torch", m) for m in TORCH_MODES] + [("triton", m) for m in TRITON_MODES]
NAN, INF = float("nan"), float("inf")
QKV = ("q", "r", "k", "v")


def _on(inputs: dict) -> dict:
    return {n: t.to(DEVICE) for n, t in inputs.items()}


# ------------------------------------------------------------------------------------------
# mLSTM-exp with input gates below −88: exp(−m) is beyond fp32's range.


@pytest.mark.parametrize(("backend", "mode"), BACKEND_MODES)
def test_mlstm_exp_very_negative_input_gate(backend, mode):
    """Input pre-activations at −90…−100 make the max state m < −88, so the normalizer's
    floor exp(−m) overflows fp32: the output underflows to ≈ 0 correctly, but the gradients
    of i and f were NaN (autograd's 0·inf on the torch path; the kernels formed inf). Every
    gradient must match the fp64 reference; the kernels must not overflow (the interpreter
    turns numpy overflow into an error)."""
    fam = FAMILIES["mlstm_exp"]
    B, T, H, K, V = 1, 24, 2, 8, 8
    inputs = fam.build(B, T, H, K, V, False)
    inputs["i"] = -90.0 - 10.0 * torch.rand(B, T, H, dtype=torch.float64)
    inputs["i"][:, T // 2 :, 1] = torch.randn(B, T - T // 2).double()  # one head recovers
    inputs["f"] = 3.0 + torch.randn(B, T, H, dtype=torch.float64)
    inputs = _on(inputs)
    kw = dict(backend=backend, mode=mode, chunk_size=8)
    o_ref, st_ref, g_ref = run_with_grads(fam, inputs, mode="reference", backend="torch")
    o, st, grads = run_with_grads(fam, inputs, dtype=torch.float32, **kw)
    assert_close("o", o, o_ref, torch.float32)
    for j, (a, b) in enumerate(zip(st, st_ref)):
        assert_close(f"state[{j}]", a, b, torch.float32)
    for n, g in g_ref.items():
        assert_close(f"d{n}", grads[n], g, torch.float32)


# ------------------------------------------------------------------------------------------
# Causality under non-finite values: a NaN or inf at step t0 reaches no output before t0.


def _delta_build(gated):
    def build(B, T, H, K, V, extreme):
        d = {
            "q": torch.randn(B, T, H, K, dtype=torch.float64),
            "k": torch.nn.functional.normalize(
                torch.randn(B, T, H, K, dtype=torch.float64), dim=-1
            ),
            "v": torch.randn(B, T, H, V, dtype=torch.float64),
            "beta": torch.rand(B, T, H, dtype=torch.float64),
        }
        if gated:
            d["g"] = torch.nn.functional.logsigmoid(torch.randn(B, T, H) + 2.0).double()
            if extreme:
                d["g"] = torch.where(torch.rand(B, T, H) < 0.5, -30.0, d["g"]).double()
        return d

    return build


def _delta_family(name):
    gated = name == "gated_delta_rule"
    tensors = ("q", "k", "v", "g", "beta") if gated else ("q", "k", "v", "beta")
    return Family(
        name, getattr(linrnn, name), tensors, _delta_build(gated), positional=len(tensors)
    )


CAUSAL_FAMILIES = ["linear_attn", "linear_attn_norm", "retention", "simple_gla", "gla", "gla_gv",
                   "rwkv6", "mlstm_exp", "mlstm_sig", "mlstm_sig_norm", "delta_rule",
                   "gated_delta_rule"]  # fmt: skip


def _family(name):
    return _delta_family(name) if "delta" in name else FAMILIES[name]


def _gate_names(fam):
    return [n for n in fam.tensors if n not in ("q", "r", "k", "v") and n not in ("log_decay", "u")]


def dirtied(inputs, names, t0, bads=(NAN, INF)):
    """(input name, bad value, a copy of ``inputs`` with that input set to it at step t0) for
    every name and bad value: the calls the causality tests compare with the clean one."""
    for which in names:
        for bad in bads(which) if callable(bads) else bads:
            dirty = dict(inputs)
            dirty[which] = inputs[which].clone()
            dirty[which][:, t0] = bad
            yield which, bad, dirty


def check_causal_non_finite(
    name, backend, mode, extreme, names, t0, T=40, K=8, V=8, bads=(NAN, INF), chunk_size=16
):
    """Outputs before t0 are unchanged when an input of ``names`` is NaN or inf at t0 (value
    checks off, so that non-finite gates get in): bitwise for q, k, v, and for every input in
    the step-by-step modes. In the chunked modes a gate at t0 may also change which exact form
    a chunk takes (the engine picks it from a bound of the gates), so there the earlier outputs
    are held to the fp64 reference, as tightly as the clean run of the same mode meets it (the
    strong mLSTM gates make some outputs ill-conditioned: |n·q| near the floor exp(−m) leaves
    fp32 errors near 1e-3 in any mode, NaN or not)."""
    fam = _family(name)
    B, H = 1, 2
    inputs64 = _on(fam.build(B, T, H, K, V, extreme))
    inputs = {n: t.float() for n, t in inputs64.items()}
    kw = dict(backend=backend, mode=mode, chunk_size=chunk_size)
    with linrnn.checks(False):
        o = fam.call(inputs, **kw)[0]
        for which, bad, dirty in dirtied(inputs, names, t0, bads):
            o_bad = fam.call(dirty, **kw)[0]
            where = f"{name} {backend}/{mode}: {which}[:, {t0}] = {bad}"
            early = ~torch.isfinite(o_bad[:, :t0])
            assert not early.any(), (
                f"{where} made earlier outputs non-finite (first at step "
                f"{int(early.flatten(2).any(-1).any(0).nonzero()[0])})"
            )
            if which in QKV or mode in STEPWISE_MODES:
                assert torch.equal(o_bad[:, :t0], o[:, :t0]), where
            else:  # no less accurate than the clean run of the same mode
                ref = fam.call(inputs64, mode="reference", backend="torch")[0]
                assert_close(where, o_bad[:, :t0], ref[:, :t0], torch.float32, 5.0,
                             same_dtype_ref=o[:, :t0])  # fmt: skip


STEPWISE_MODES = ("reference", "recurrent")  # no chunk form chosen from the gates


def _torch_modes(name):
    return ["reference", "recurrent", "chunk"] + ([] if "delta" in name else ["parallel"])


@pytest.mark.parametrize("extreme", [False, True], ids=["mild", "strong"])
@pytest.mark.parametrize("name", CAUSAL_FAMILIES)
def test_causal_non_finite_torch(name, extreme):
    """Every family and torch mode; the bad step inside a chunk (37: rows 32…36 of its chunk
    must stay clean) and at a chunk's first row (32); q, k, v and the gates."""
    fam = _family(name)
    for mode in _torch_modes(name):
        for t0 in (37, 32):
            names = ["k", "v", fam.tensors[0], *_gate_names(fam)]
            check_causal_non_finite(name, "torch", mode, extreme, names, t0)


def _triton_chunk_modes(name):
    """The chunked Triton modes (the recurrent kernels go step by step: a step reads only the
    state and its own inputs, as the packed-sequence test below checks)."""
    return ["chunk"] + ([] if "delta" in name else ["fused_chunk"])


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("name", CAUSAL_FAMILIES)
def test_causal_non_finite_triton(name, backend):
    """Every family and chunked Triton mode, the kernels' causal products (DESIGN §6.1): the
    bad step inside a chunk (rows 32…36 of its chunk must stay clean), gates strong on a random
    half of the steps (so the gated families take their exact log-space forms as well as the
    fast ones), q, k, v and the gates."""
    fam = _family(name)
    for mode in _triton_chunk_modes(name):
        names = ["k", "v", fam.tensors[0], *_gate_names(fam)]
        check_causal_non_finite(name, backend, mode, True, names, 37)


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("name", ["gla"])
def test_causal_non_finite_triton_clean_form(name, backend, monkeypatch):
    """The other form of ``triton_common._causal_dot_at``: large accumulators clean the value
    tile before every product instead of forming it again when the result is not finite. Its
    caller: GLA's fused forward (per-key gates). The tests' tiles are small, so the threshold
    is lowered to take that form everywhere (in the interpreter, which reads the module's
    globals at each call: a compiled kernel keeps the value it was built with, so on a GPU the
    K = V = 256 shapes of tests/gpu take this form)."""
    if DEVICE == "cuda":
        pytest.skip("the compiled kernels keep the threshold they were built with")
    from linrnn.engine import triton_common  # here: see test_causal_non_finite_triton_fast_forms

    monkeypatch.setattr(triton_common, "RECHECK_MAX", 0)
    fam = _family(name)
    names = ["v", fam.tensors[0], *_gate_names(fam)]
    check_causal_non_finite(name, backend, "fused_chunk", True, names, 37)


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("name", ["gla", "gla_gv", "rwkv6"])
def test_causal_non_finite_triton_fast_forms(name, backend, monkeypatch):
    """The fast single-product forms of §6.4 (bf16 inputs, mild gates), chosen per chunk and
    diagonal tile from the gates' span, which a non-finite gate must turn to the exact form:
    earlier outputs stay bitwise those of the clean call for q, k, v, and as close as the
    dtype allows for a gate (it may change the form its chunk takes), in chunk and fused_chunk
    mode. The interpreter's bf16 dot is wrong, so without a GPU the fast forms run for fp32
    inputs (forced, as in test_triton_vector)."""
    from linrnn.engine import vector  # here: importing Triton code at the top would move the
    # whole module into the interpreter tier

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    if DEVICE != "cuda":
        monkeypatch.setattr(vector, "_fast_forms", lambda dt: True)
    fam = _family(name)
    B, T, H, K, V, t0 = 1, 40, 2, 16, 16, 37
    inputs = {n: t.to(DEVICE, dtype) for n, t in fam.build(B, T, H, K, V, False).items()}
    for mode in ("chunk", "fused_chunk"):
        kw = dict(backend=backend, mode=mode, chunk_size=16)
        with linrnn.checks(False):
            o = fam.call(inputs, **kw)[0]
            names = ["k", "v", fam.tensors[0], *_gate_names(fam)]
            for which, bad, dirty in dirtied(inputs, names, t0):
                o_bad = fam.call(dirty, **kw)[0]
                where = f"{name} {dtype} {mode}: {which}[:, {t0}] = {bad}"
                if which in QKV:
                    assert torch.equal(o_bad[:, :t0], o[:, :t0]), where
                else:
                    assert_close(where, o_bad[:, :t0], o[:, :t0], dtype)


@pytest.mark.parametrize("mode", ["chunk", "fused_chunk"])
def test_non_finite_value_reaches_its_column_later(mode):
    """Where a NaN value goes in the chunked Triton modes (DESIGN §6.1): v[t0, h, c] = NaN
    leaves every earlier output and every other head bitwise as in the clean call; the rows of
    its chunk from t0 on are NaN (in every column: the products flag rows), the later chunks'
    outputs and the final state are NaN in column c of head h only, the rest bitwise clean."""
    T, H, K, V, L, t0, h, c = 48, 2, 8, 8, 16, 21, 1, 3
    gen = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(1, T, H, D, generator=gen).to(DEVICE) for D in (K, K, V))
    kw = dict(backend="triton", mode=mode, chunk_size=L, output_final_state=True)
    o, S = linrnn.linear_attn(q, k, v, **kw)
    v_bad = v.clone()
    v_bad[0, t0, h, c] = NAN
    with linrnn.checks(False):
        o_bad, S_bad = linrnn.linear_attn(q, k, v_bad, **kw)
    end = (t0 // L + 1) * L  # the bad step's chunk ends here
    assert torch.equal(o_bad[:, :t0], o[:, :t0]) and torch.equal(o_bad[:, :, 1 - h], o[:, :, 1 - h])
    assert torch.isnan(o_bad[0, t0:end, h]).all()
    others = [j for j in range(V) if j != c]
    assert torch.isnan(o_bad[0, end:, h, c]).all() and torch.isnan(S_bad[0, h, :, c]).all()
    assert torch.equal(o_bad[0, end:, h][:, others], o[0, end:, h][:, others])
    assert torch.equal(S_bad[0, h][:, others], S[0, h][:, others])
    assert torch.equal(S_bad[0, 1 - h], S[0, 1 - h])


@pytest.mark.parametrize("op", ["linear_attn", "gla"])
def test_fix_pass_finds_every_flagged_tile(op, monkeypatch):
    """The output kernels' second launch (engine/fix_pass.py) scans the first launch's per-tile
    flags with a few programs, a block of flags at a time: with several blocks per program
    (in the interpreter, which reads the modules' globals at each call, blocks of 4 flags for
    48 tiles and 3 programs), NaN values in some heads at steps spread over the chunks each
    leave the earlier outputs of their head and every other head bitwise as in the clean
    call, and make the rest of their chunk NaN (scalar output kernel: linear attention;
    per-channel apply kernel: GLA)."""
    if DEVICE != "cuda":
        import triton.language as tl

        from linrnn.engine import scalar_kernels, triton_common, vector_scores_kernels

        for module in (triton_common, scalar_kernels, vector_scores_kernels):
            monkeypatch.setattr(module, "FLAG_BLOCK", tl.constexpr(4))
    B, T, H, K, V, L = 1, 64, 12, 8, 8, 16
    gen = torch.Generator().manual_seed(23)
    q, k, v = (torch.randn(B, T, H, D, generator=gen).to(DEVICE) for D in (K, K, V))
    args = (q, k)
    if op == "gla":
        gk = -torch.rand(B, T, H, K, generator=gen).to(DEVICE)
        call = lambda vv: linrnn.gla(q, k, vv, gk, backend="triton", mode="chunk",  # noqa: E731
                                     chunk_size=L)[0]  # fmt: skip
    else:
        call = lambda vv: linrnn.linear_attn(*args, vv, backend="triton",  # noqa: E731
                                             mode="chunk", chunk_size=L)[0]  # fmt: skip
    o = call(v)
    bad = {h: L * ((5 * h) % (T // L)) + h % L for h in range(0, H, 3)}  # head: its NaN step
    v_bad = v.clone()
    for h, t in bad.items():
        v_bad[0, t, h, h % V] = NAN
    with linrnn.checks(False):
        o_bad = call(v_bad)
    for h in range(H):
        if h not in bad:
            assert torch.equal(o_bad[:, :, h], o[:, :, h]), f"{op}: head {h}"
            continue
        t = bad[h]
        end = (t // L + 1) * L
        assert torch.equal(o_bad[:, :t, h], o[:, :t, h]), f"{op}: head {h} before step {t}"
        assert torch.isnan(o_bad[0, t:end, h]).all(), f"{op}: head {h}, its chunk from {t}"


PACKED_FAMILIES = ["linear_attn_norm", "simple_gla", "gla", "rwkv6", "mlstm_exp", "delta_rule",
                   "gated_delta_rule"]  # fmt: skip


@pytest.mark.parametrize(
    ("backend", "mode"), [("torch", "chunk"), ("triton", "chunk"), ("triton", "recurrent")]
)
@pytest.mark.parametrize("name", PACKED_FAMILIES)
def test_packed_sequences_independent_under_non_finite(name, backend, mode):
    """Packed sequences (cu_seqlens) are independent: NaN in any input of the first sequence
    at step 5 (or inf in a gate) changes neither its earlier outputs nor any output of the
    second (bitwise), and the second's final state stays bitwise too (the scalar gates' packed
    cumulative sums were once differences of one sum over the pack, which carried a NaN on).
    fused_chunk shares chunk mode's packed gate sums. One exception, by design: the PyTorch
    chunk path chooses its form once per sequence (DESIGN §6.1), and a non-finite gate turns
    that sequence to the log-space form, which moves its earlier rows at rounding level; those
    are held to the fp64 reference as tightly as the clean call meets it (as in
    check_causal_non_finite)."""
    fam = _family(name)
    T, H, K, V, t0 = 40, 2, 8, 8, 5
    inputs64 = _on(fam.build(1, T, H, K, V, True))
    inputs = {n: t.float() for n, t in inputs64.items()}
    cu = torch.tensor([0, 17, T], device=DEVICE)
    kw = dict(backend=backend, mode=mode, chunk_size=16, cu_seqlens=cu, output_final_state=True)
    log_space = backend == "torch" and mode == "chunk"  # the exception above
    with linrnn.checks(False):
        o, st = fam.call(inputs, **kw)
        if log_space:
            ref = fam.call(inputs64, mode="reference", backend="torch", cu_seqlens=cu)[0]
        names = ["k", "v", fam.tensors[0], *_gate_names(fam)]
        bads = lambda which: (NAN,) if which in QKV else (NAN, INF)  # noqa: E731
        for which, bad, dirty in dirtied(inputs, names, t0, bads):
            o_bad, st_bad = fam.call(dirty, **kw)
            where = f"{name} {backend}/{mode}: {which}[:, {t0}] = {bad}"
            if log_space and which not in QKV:
                assert torch.isfinite(o_bad[:, :t0]).all(), where
                assert_close(where, o_bad[:, :t0], ref[:, :t0], torch.float32, 5.0,
                             same_dtype_ref=o[:, :t0])  # fmt: skip
            else:
                assert torch.equal(o_bad[:, :t0], o[:, :t0]), where
            assert torch.equal(o_bad[:, 17:], o[:, 17:]), f"{where}: the second sequence"
            parts = lambda x: x if isinstance(x, tuple) else (x,)  # noqa: E731 (mLSTM: C, n, m)
            for a, b in zip(parts(st_bad), parts(st)):
                assert torch.equal(a[1:], b[1:]), f"{where}: the second final state"


@pytest.mark.parametrize("G", [1, 8], ids=["one-group", "per-head"])
@pytest.mark.parametrize(
    ("backend", "mode"), [*[("torch", m) for m in TORCH_MODES], ("triton", "chunk"),
                          ("triton", "fused_chunk")]
)  # fmt: skip
def test_causal_non_finite_mamba2(backend, mode, G):
    """Mamba2 with B and C shared by all 8 heads (read by each head's output kernel at the
    group's rows) and one group per head: a NaN or inf in x, dt, B or C at step 37 leaves the
    outputs before it bitwise unchanged for x, B and C, and finite and within 5e-4
    RMS-relative of the clean call for dt (it may change the form a chunk takes on the
    PyTorch path)."""
    T, H, N, P, t0 = 40, 8, 16, 16, 37
    inputs = {
        "x": torch.randn(1, T, H, P),
        "dt": torch.randn(1, T, H),
        "A": -torch.empty(H).uniform_(0.5, 8.0),
        "B": torch.randn(1, T, G, N),
        "C": torch.randn(1, T, G, N),
        "D": torch.randn(H),
        "dt_bias": torch.randn(H) * 0.5,
    }
    inputs = _on(inputs)

    def call(i):
        return linrnn.mamba2(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"],
                             dt_bias=i["dt_bias"], dt_softplus=True, backend=backend, mode=mode,
                             chunk_size=16)[0]  # fmt: skip

    with linrnn.checks(False):
        y = call(inputs)
        for which, bad, dirty in dirtied(inputs, ("x", "dt", "B", "C"), t0):
            y_bad = call(dirty)
            where = f"mamba2 G={G} {backend}/{mode}: {which}[:, {t0}] = {bad}"
            assert torch.isfinite(y_bad[:, :t0]).all(), where
            if which != "dt" or mode in STEPWISE_MODES:
                assert torch.equal(y_bad[:, :t0], y[:, :t0]), where
            else:
                assert_close(where, y_bad[:, :t0], y[:, :t0], torch.float32, 5.0)


# ------------------------------------------------------------------------------------------
# Per-channel decays on the torch chunk path: exact under strong decays.


@pytest.mark.parametrize("chunk_size", [64, 128])
@pytest.mark.parametrize("decay", ["rwkv", "strong", "-148"])
@pytest.mark.parametrize("name", ["rwkv6", "gla"])
def test_vector_strong_decay_precision_torch(name, decay, chunk_size):
    """RWKV6 and GLA on the torch chunk path against the fp64 reference, with decays whose
    chunk-local cumulative sums reach −1e3…−2e4: RWKV-like w = −exp(N(3, 1)), −30 on a random
    half of the steps, and −148 on half of the channels. In fp32 such sums carry ulp(1e4) ≈
    1e-3 of absolute error into every weight exp(b_r − b_s) formed from them (RWKV6's
    exclusive b − g also rounded the weight 1 of the previous step): errors reached 1e-4
    relative, where the recurrent mode keeps 1e-7."""
    B, T, H, K, V = 1, 128, 2, 16, 16
    shape = (B, T, H, K)
    if decay == "rwkv":
        w = -torch.exp(torch.randn(shape) + 3.0)
    elif decay == "strong":
        w = torch.where(torch.rand(shape) < 0.5, -30.0, -0.05 * torch.rand(shape))
    else:
        w = torch.where(torch.arange(K) % 2 == 0, -148.0, -0.01 * torch.rand(shape))
    q, k, v = (torch.randn(B, T, H, D, dtype=torch.float64) for D in (K, K, V))
    w = w.double()
    if name == "rwkv6":
        u = torch.randn(H, K, dtype=torch.float64)
        call = lambda *x, **kw: linrnn.rwkv6(*x, u.to(x[0].dtype), scale=1.0, **kw)  # noqa: E731
    else:
        call = linrnn.gla
    ref = call(q, k, v, w, mode="reference", backend="torch")[0]
    got = call(q.float(), k.float(), v.float(), w.float(), mode="chunk", backend="torch",
               chunk_size=chunk_size)[0]  # fmt: skip
    err = ((got.double() - ref).norm() / ref.norm()).item()
    assert err <= 1e-6, f"{name} torch chunk, decay {decay}: rms-relative error {err:.2e}"


# ------------------------------------------------------------------------------------------
# The decay gradients' absolute floor (docs/DESIGN.md §6.5, "Accuracy under strong decays").

DECAY_GRAD_FLOOR = 16.0  # the documented bound, in units of U32 · Σ_t (‖q_t‖‖dq_t‖ + ‖k_t‖‖dk_t‖)


def _decay_grad_errors(name, backend, mode):
    """(the decay gradient's error [B, T, H(, K)], the per-head scale Σ_t (‖q_t‖‖dq_t‖ +
    ‖k_t‖‖dk_t‖) [B, H], where the decay is strong [B, T, H(, K)]) of an fp32 call with
    −30 per step on a random half of the steps, against the fp64 reference."""
    fam = FAMILIES[name]
    gname = {"simple_gla": "g", "gla": "gk", "rwkv6": "w"}[name]
    B, T, H, K, V = 1, 40, 2, 16, 16
    inputs = _on(fam.build(B, T, H, K, V, True))
    _, _, ref = run_with_grads(fam, inputs, mode="reference", backend="torch")
    _, _, got = run_with_grads(fam, inputs, dtype=torch.float32, backend=backend, mode=mode,
                               chunk_size=16)  # fmt: skip
    x = fam.tensors[0]
    norm = lambda t: t.double().norm(dim=-1)  # noqa: E731
    scale = (norm(inputs[x]) * norm(ref[x]) + norm(inputs["k"]) * norm(ref["k"])).sum(1)
    err = (got[gname].double() - ref[gname]).abs()
    return err, scale, inputs[gname] < -29


def _floor_ratio(err, scale):
    """The largest error of a head in units of U32 · its scale."""
    per_head = err.amax(dim=(1, 3)) if err.dim() == 4 else err.amax(1)  # [B, H]
    return (per_head / (U32 * scale)).max().item()


@pytest.mark.parametrize(
    ("name", "mode"),
    [("simple_gla", "chunk"), ("simple_gla", "fused_chunk"), ("simple_gla", "recurrent"),
     ("gla", "chunk"), ("rwkv6", "fused_chunk")],
)  # fmt: skip
@pytest.mark.parametrize("backend", ["triton"])
def test_decay_grad_floor_triton(name, mode, backend):
    """The kernels compute a log decay's gradient by the identity Σ_{t≥u} (q_t·dq_t − k_t·dk_t)
    (restarted at chunk ends), whose terms cancel: its error is absolute, bounded by the terms'
    size — the documented bound — however small the true gradient (≈ 1e-12 at a step
    decaying by −30; the error there is ~1e-6)."""
    err, scale, _strong = _decay_grad_errors(name, backend, mode)
    ratio = _floor_ratio(err, scale)
    assert ratio <= DECAY_GRAD_FLOOR, f"{name} {mode}: error {ratio:.2f} u·Σ > the documented bound"


@pytest.mark.parametrize("name", ["simple_gla", "gla", "rwkv6"])
def test_decay_grad_no_floor_torch(name):
    """The torch chunk path differentiates the exact log-space forms (autograd), so at the
    strong steps its decay gradient has no such floor: the error there stays near the true
    value's own size (≈ 1e-12), 1e5× below the kernels' floor."""
    err, scale, strong = _decay_grad_errors(name, "torch", "chunk")
    assert err[strong].max() <= 1e-10
    assert _floor_ratio(err, scale) <= DECAY_GRAD_FLOOR
