"""``linrnn.mamba2`` (Mamba2's SSD on the scalar-gate engine) against the float64 loop of its
equations (linrnn.reference.mamba2): outputs, final states and the gradients of x, dt, A, B, C,
D, dt_bias and the initial state, in every mode; groups G < H, strong decays (Δ·A down to −40
per step), Δ underflowing to 0, dt_softplus on and off, packed sequences, prefill + steps,
torch.compile and the input checks. The PyTorch path runs broadly; the Triton modes (the
interpreter tier) on a few small cases."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import assert_close, assert_decay_grad_close, decay_grad_scale

import linrnn
from linrnn.ops.mamba2 import log_softplus
from linrnn.reference.mamba2 import mamba2_recurrent

F64 = torch.float64
NAMES = ("x", "dt", "A", "B", "C", "D", "dt_bias")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def build(Bsz, T, H, G, N, P, *, softplus=True, strong=False, underflow=False):
    """Seeded fp64 inputs: A in [−8, −0.5], dt_bias ~ N(0, 1); with ``softplus`` dt ~ N(0, 2)
    (Δ up to ~6), without it dt ≥ 0 and no dt_bias needed. ``strong``: on a random 30% of the
    steps Δ·A = −40 exactly; ``underflow``: dt = −1000 on a random 30% (Δ = 0 in fp64)."""
    d = {
        "x": torch.randn(Bsz, T, H, P, dtype=F64),
        "A": -torch.empty(H, dtype=F64).uniform_(0.5, 8.0),
        "B": torch.randn(Bsz, T, G, N, dtype=F64),
        "C": torch.randn(Bsz, T, G, N, dtype=F64),
        "D": torch.randn(H, dtype=F64),
        "dt_bias": torch.randn(H, dtype=F64) * 0.5,
    }
    if softplus:
        dt = torch.randn(Bsz, T, H, dtype=F64) * 2
    else:
        dt = torch.rand(Bsz, T, H, dtype=F64) * 2
        d["dt_bias"] = torch.rand(H, dtype=F64) * 0.1
    if strong:  # Δ = 40/|A|: the argument of softplus (or Δ itself) that gives Δ·A = −40
        delta = 40 / d["A"].abs()
        z = delta + torch.log(-torch.expm1(-delta)) if softplus else delta
        pick = torch.rand(Bsz, T, H) < 0.3
        dt = torch.where(pick, (z - d["dt_bias"]).expand_as(dt), dt)
    if underflow:
        dt = torch.where(torch.rand(Bsz, T, H) < 0.3, -1000.0, dt)
    d["dt"] = dt
    return d


def loop(inputs, *, initial_state=None, dt_softplus=True, **_):
    i = inputs
    return mamba2_recurrent(
        i["x"], i["dt"], i["A"], i["B"], i["C"], D=i.get("D"), dt_bias=i.get("dt_bias"),
        dt_softplus=dt_softplus, h0=initial_state,
    )  # fmt: skip


def op(inputs, **kw):
    i = inputs
    return linrnn.mamba2(
        i["x"], i["dt"], i["A"], i["B"], i["C"], D=i.get("D"), dt_bias=i.get("dt_bias"),
        output_final_state=True, **kw,
    )  # fmt: skip


def with_grads(fn, inputs, h0, dtype=F64, seed=0, **kw):
    """``fn`` on fresh leaves (in ``dtype``): ``(y, h_T, grads)`` of ``Σ y·dy + Σ h_T·dh``."""
    leaves = {n: x.detach().to(dtype).requires_grad_() for n, x in inputs.items()}
    h0 = None if h0 is None else h0.detach().to(dtype).requires_grad_()
    y, h = fn(leaves, initial_state=h0, **kw)
    gen = torch.Generator().manual_seed(seed)
    dy = torch.randn(y.shape, generator=gen, dtype=F64).to(y.device)
    dh = torch.randn(h.shape, generator=gen, dtype=F64).to(h.device)
    ((y.double() * dy).sum() + (h.double() * dh).sum()).backward()
    grads = {n: x.grad for n, x in leaves.items()}
    if h0 is not None:
        grads["initial_state"] = h0.grad
    return y.detach(), h.detach(), grads


def compare(got, ref, dtype=F64, low=None):
    """Every output and gradient of ``got`` against ``ref`` (fp64); ``low``: the loop run in
    ``dtype`` on the same inputs (fp32 results may be off by 2× its error, helpers.RTOL)."""
    pick = (lambda i: None) if low is None else (lambda i: low[i].cpu())
    assert_close("y", got[0].cpu(), ref[0].cpu(), dtype, same_dtype_ref=pick(0))
    assert_close("final_state", got[1].cpu(), ref[1].cpu(), dtype, same_dtype_ref=pick(1))
    assert got[2].keys() == ref[2].keys()
    for name in ref[2]:
        lo = None if low is None else low[2][name].cpu()
        assert_close(f"d{name}", got[2][name].cpu(), ref[2][name].cpu(), dtype, same_dtype_ref=lo)


# --------------------------------------------------------------------------------------------
# The PyTorch path against the loop


@pytest.mark.parametrize("init", [False, True], ids=["h0=None", "h0"])
@pytest.mark.parametrize(
    "mode,chunk_size",
    [("reference", None), ("recurrent", None), ("parallel", None), ("chunk", 1),
     ("chunk", 16), ("chunk", 64), (None, 7)],
    ids=["reference", "recurrent", "parallel", "chunk1", "chunk16", "chunk64>T", "default7"],
)  # fmt: skip
@pytest.mark.parametrize("G", [1, 2, 4])
def test_modes_match_loop_fp64(G, mode, chunk_size, init):
    """H = 4 heads over G groups, odd T = 37, N ≠ P: every output and gradient to ~1e-9."""
    Bsz, T, H, N, P = 2, 37, 4, 12, 7
    inputs = build(Bsz, T, H, G, N, P)
    h0 = torch.randn(Bsz, H, N, P, dtype=F64) if init else None
    ref = with_grads(loop, inputs, h0)
    got = with_grads(op, inputs, h0, mode=mode, chunk_size=chunk_size, backend="torch",
                     dt_softplus=True)  # fmt: skip
    assert got[0].dtype == F64 and got[1].dtype == F64
    compare(got, ref)


@pytest.mark.parametrize("mode", ["chunk", "recurrent", "parallel"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_without_softplus(mode, bias):
    """dt_softplus=False: Δ = dt + dt_bias ≥ 0 taken as it is (Δ = 0 on some steps)."""
    Bsz, T, H, G, N, P = 1, 30, 2, 1, 8, 6
    inputs = build(Bsz, T, H, G, N, P, softplus=False)
    inputs["dt"][:, ::5] = 0.0
    if not bias:
        del inputs["dt_bias"]
    h0 = torch.randn(Bsz, H, N, P, dtype=F64)
    ref = with_grads(loop, inputs, h0, dt_softplus=False)
    got = with_grads(op, inputs, h0, mode=mode, chunk_size=8, backend="torch", dt_softplus=False)
    compare(got, ref)


def test_optional_parts_absent():
    """No D, no dt_bias, no initial state."""
    Bsz, T, H, G, N, P = 2, 20, 2, 2, 4, 4
    inputs = build(Bsz, T, H, G, N, P)
    del inputs["D"], inputs["dt_bias"]
    ref = with_grads(loop, inputs, None)
    got = with_grads(op, inputs, None, mode="chunk", chunk_size=8, backend="torch",
                     dt_softplus=True)  # fmt: skip
    compare(got, ref)


@pytest.mark.parametrize("mode", ["reference", "recurrent", "parallel", "chunk"])
def test_per_channel_skip(mode):
    """D [H, P] (mamba_ssm's D_has_hdim): y_t += D ⊙ x_t per head and channel, with its
    gradient, in every PyTorch mode."""
    Bsz, T, H, G, N, P = 2, 21, 4, 2, 6, 5
    inputs = build(Bsz, T, H, G, N, P)
    inputs["D"] = torch.randn(H, P, dtype=F64)
    h0 = torch.randn(Bsz, H, N, P, dtype=F64)
    ref = with_grads(loop, inputs, h0)
    got = with_grads(op, inputs, h0, mode=mode, chunk_size=8, backend="torch", dt_softplus=True)
    assert got[2]["D"].shape == (H, P)
    compare(got, ref)


@pytest.mark.parametrize("softplus", [True, False], ids=["softplus", "linear"])
@pytest.mark.parametrize("mode", ["chunk", "parallel", "recurrent"])
def test_strong_decays_fp64(mode, softplus):
    """Δ·A = −40 on 30% of the steps (cumulative decays far below fp64's range in a chunk)."""
    Bsz, T, H, G, N, P = 1, 45, 4, 2, 8, 6
    inputs = build(Bsz, T, H, G, N, P, softplus=softplus, strong=True)
    h0 = torch.randn(Bsz, H, N, P, dtype=F64)
    ref = with_grads(loop, inputs, h0, dt_softplus=softplus)
    got = with_grads(op, inputs, h0, mode=mode, chunk_size=16, backend="torch",
                     dt_softplus=softplus)  # fmt: skip
    compare(got, ref)


@pytest.mark.parametrize("mode", ["chunk", "parallel", "recurrent"])
def test_underflowing_delta(mode):
    """dt = −1000 on 30% of the steps: Δ = softplus(−1000) = 0 in fp64 (log Δ ≈ −1000 stays
    finite), so those steps neither decay nor write; every gradient finite and exact."""
    Bsz, T, H, G, N, P = 1, 33, 2, 1, 6, 5
    inputs = build(Bsz, T, H, G, N, P, underflow=True)
    h0 = torch.randn(Bsz, H, N, P, dtype=F64)
    ref = with_grads(loop, inputs, h0)
    got = with_grads(op, inputs, h0, mode=mode, chunk_size=8, backend="torch", dt_softplus=True)
    compare(got, ref)


def test_chunk_fp32():
    """fp32 inputs on the chunk path against the fp64 loop on the same rounded inputs."""
    Bsz, T, H, G, N, P = 1, 70, 4, 2, 16, 16
    inputs = {n: x.float().double() for n, x in build(Bsz, T, H, G, N, P, strong=True).items()}
    h0 = torch.randn(Bsz, H, N, P, dtype=F64).float().double()
    ref = with_grads(loop, inputs, h0)
    low = with_grads(loop, inputs, h0, torch.float32)
    got = with_grads(op, inputs, h0, torch.float32, mode="chunk", chunk_size=32,
                     backend="torch", dt_softplus=True)  # fmt: skip
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    compare(got, ref, torch.float32, low)


def test_log_softplus():
    """log(softplus(z)) and its gradient σ(z)/softplus(z) against fp64 closed forms: both
    finite down to z = −1e4 (where softplus underflows) and exact across the cut and above
    20 (where torch's default softplus threshold drops e^{−z})."""
    z = torch.tensor([-1e4, -800.0, -40.0, -15.5, -15.0, -14.5, -3.0, 0.0, 2.0, 20.5, 25.0, 30.0,
                      1e4], dtype=F64, requires_grad=True)  # fmt: skip
    out = log_softplus(z)
    out.sum().backward()
    zd = z.detach()
    sp = torch.logaddexp(zd, torch.zeros_like(zd))  # log(1 + e^z), exact
    mid = zd > -700  # where fp64's softplus is representable
    assert torch.isfinite(out).all() and torch.isfinite(z.grad).all()
    assert torch.allclose(out[mid], sp[mid].log(), rtol=1e-13, atol=0)
    assert torch.allclose(out[~mid], zd[~mid], rtol=1e-13, atol=0)
    grad = torch.sigmoid(zd) / sp
    assert torch.allclose(z.grad[mid], grad[mid], rtol=1e-12, atol=0)
    assert torch.allclose(z.grad[~mid], torch.ones_like(zd[~mid]))
    z32 = torch.tensor([-1e4, -120.0, -104.0, -20.0], requires_grad=True)
    log_softplus(z32).sum().backward()
    assert torch.isfinite(z32.grad).all() and torch.equal(z32.grad, torch.ones(4))


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("parts", ["both", "g-only", "no-bias"])
def test_triton_gates(parts, backend):
    """The gate kernels of the Triton chunk path (linrnn.engine.mamba2_gates): g = Δ·A,
    gi = log Δ and the gradients of dt, A, dt_bias against fp64 autograd through the PyTorch
    forms, for z = dt + dt_bias across softplus's and log softplus's branches (underflowing Δ,
    the cut at −15, the linear range above 40)."""
    from linrnn.engine import mamba2_gates
    from linrnn.ops.mamba2 import softplus

    z_edge = [-1e4, -800.0, -40.0, -15.5, -15.0, -14.5, -3.0, -1e-3, 0.0, 2.0, 20.5, 39.0, 45.0]
    Bsz, T, H = 2, 300, 5  # T past one program's time tile (256 steps at H ≤ 16)
    gen = torch.Generator().manual_seed(3)
    dt = torch.randn(Bsz * T * H, generator=gen)
    dt[torch.randperm(dt.numel(), generator=gen)[: len(z_edge)]] = torch.tensor(z_edge)
    dt = (dt * (1 + torch.rand(dt.shape, generator=gen))).view(Bsz, T, H).to(DEVICE)
    A = -torch.rand(H, generator=gen).to(DEVICE) * 8
    bias = None if parts == "no-bias" else torch.randn(H, generator=gen).to(DEVICE)
    wg, wi = (torch.randn(Bsz, T, H, generator=gen, dtype=F64).to(DEVICE) for _ in range(2))

    def run(dt, A, bias, fn):
        leaves = [x if x is None else x.detach().clone().requires_grad_() for x in (dt, A, bias)]
        g, gi = fn(*leaves)
        loss = (g.double() * wg).sum()
        if parts != "g-only":
            loss = loss + (gi.double() * wi).sum()
        loss.backward()
        return [g, gi] + [None if x is None else x.grad for x in leaves]

    def torch_gates(dt, A, bias):
        z = dt if bias is None else dt + bias
        return softplus(z) * A, log_softplus(z)

    f64 = lambda x: None if x is None else x.double()  # noqa: E731
    ref = run(f64(dt), f64(A), f64(bias), torch_gates)
    got = run(dt, A, bias, mamba2_gates.gates)
    for name, a, b in zip(("g", "gi", "ddt", "dA", "ddt_bias"), got, ref):
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == torch.float32, name
        assert_close(name, a.detach().double().cpu(), b.detach().cpu(), torch.float32)
    # Each element across the branches, from z = dt + dt_bias as fp32 forms it: Δ·A to fp32
    # rounding, log Δ to the rounding of Δ. Below 0, Δ ≈ e^z: the GPU's exp forms 2^(z·log₂e)
    # with the product rounded to fp32, a relative error of up to |z|·log₂e·2⁻²⁴ in e^z (the
    # interpreter's NumPy exp has none).
    z = f64(dt if bias is None else dt + bias)
    g_ref, gi_ref = torch_gates(z, f64(A), None)
    g, gi = (x.detach().double() for x in got[:2])
    exp_arg = z.clamp_max(0).abs() * math.log2(math.e) * 2.0**-24
    assert ((g - g_ref).abs() <= (1e-6 + exp_arg) * g_ref.abs()).all()
    assert ((gi - gi_ref).abs() <= 1e-6 * gi_ref.abs().clamp_min(1)).all()


# --------------------------------------------------------------------------------------------
# Packed sequences, prefill + steps


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_packed_equals_separate(mode):
    """Three sequences (one empty) packed along T give each separate call's outputs, states and
    gradients."""
    H, G, N, P = 4, 2, 8, 6
    lengths = [13, 0, 22]
    parts = [build(1, max(n, 1), H, G, N, P) for n in lengths]
    shared = {n: parts[0][n] for n in ("A", "D", "dt_bias")}
    for p, n in zip(parts, lengths):
        p.update(shared)
        for name in ("x", "dt", "B", "C"):
            p[name] = p[name][:, :n]
    packed = dict(shared)
    for name in ("x", "dt", "B", "C"):
        packed[name] = torch.cat([p[name] for p in parts], dim=1)
    h0 = torch.randn(3, H, N, P, dtype=F64)
    cu = [0, 13, 13, 35]
    got = with_grads(op, packed, h0, mode=mode, chunk_size=8, cu_seqlens=cu, backend="torch",
                     dt_softplus=True)  # fmt: skip
    ref = with_grads(loop, packed, h0[:1])  # only for the shapes of the gradients
    ys, hs = [], []
    for i, p in enumerate(parts):
        if lengths[i] == 0:
            hs.append(h0[i : i + 1])
            continue
        y, h = loop(p, initial_state=h0[i : i + 1])
        ys.append(y)
        hs.append(h)
    assert_close("y", got[0], torch.cat(ys, 1), F64)
    assert_close("final_state", got[1], torch.cat(hs, 0), F64)
    # gradients: the packed loop over the sequences, by autograd on the separate loops
    leaves = {n: x.detach().clone().requires_grad_() for n, x in packed.items()}
    h0l = h0.detach().clone().requires_grad_()
    gen = torch.Generator().manual_seed(0)
    dy = torch.randn(got[0].shape, generator=gen, dtype=F64)
    dh = torch.randn(got[1].shape, generator=gen, dtype=F64)
    ys, hs = [], []
    for i in range(3):
        a, b = cu[i], cu[i + 1]
        seq = {n: (x[:, a:b] if n in ("x", "dt", "B", "C") else x) for n, x in leaves.items()}
        if a == b:
            hs.append(h0l[i : i + 1])
            continue
        y, h = loop(seq, initial_state=h0l[i : i + 1])
        ys.append(y)
        hs.append(h)
    ((torch.cat(ys, 1) * dy).sum() + (torch.cat(hs, 0) * dh).sum()).backward()
    for n, x in leaves.items():
        assert_close(f"d{n}", got[2][n], x.grad, F64)
    assert_close("dinitial_state", got[2]["initial_state"], h0l.grad, F64)
    assert ref[0].shape == got[0].shape


@pytest.mark.parametrize("inplace", [False, True], ids=["functional", "inplace"])
def test_prefill_then_steps(inplace):
    """A chunk-mode prefill, then one token at a time with ``linrnn.mamba2_step`` (and
    ``linrnn.step``), equals one call over the whole sequence."""
    Bsz, T, T0, H, G, N, P = 2, 12, 7, 4, 2, 8, 6
    inputs = build(Bsz, T, H, G, N, P)
    y_all, h_all = loop(inputs)
    first = {n: (x[:, :T0] if n in ("x", "dt", "B", "C") else x) for n, x in inputs.items()}
    x_dtype = torch.float32
    first = {n: x.to(x_dtype) for n, x in first.items()}
    y0, state = op(first, mode="chunk", chunk_size=4, backend="torch", dt_softplus=True)
    ys = [y0]
    for t in range(T0, T):
        i = {n: (x[:, t : t + 1] if n in ("x", "dt", "B", "C") else x).to(x_dtype)
             for n, x in inputs.items()}  # fmt: skip
        fn = linrnn.mamba2_step if t % 2 else (lambda *a, **k: linrnn.step(linrnn.mamba2, *a, **k))
        y, new = fn(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"], dt_bias=i["dt_bias"],
                    dt_softplus=True, state=state, inplace=inplace, backend="torch")  # fmt: skip
        assert (new is state) == inplace
        state = new
        ys.append(y)
    assert_close("y", torch.cat(ys, 1).double(), y_all, torch.float32)
    assert_close("state", state.double(), h_all, torch.float32)


def test_final_state_continues():
    """Two calls, the second from the first's final state, equal one call (chunk mode)."""
    Bsz, T, H, G, N, P = 1, 40, 2, 1, 8, 8
    inputs = build(Bsz, T, H, G, N, P)
    y_all, h_all = op(inputs, mode="chunk", chunk_size=16, backend="torch", dt_softplus=True)
    cut = lambda a, b: {n: (x[:, a:b] if x.dim() > 1 else x) for n, x in inputs.items()}  # noqa: E731
    y1, h1 = op(cut(0, 17), mode="chunk", chunk_size=16, backend="torch", dt_softplus=True)
    y2, h2 = linrnn.mamba2(*(cut(17, 40)[n] for n in ("x", "dt", "A", "B", "C")),
                           D=inputs["D"], dt_bias=inputs["dt_bias"], dt_softplus=True,
                           initial_state=h1, output_final_state=True, mode="chunk",
                           backend="torch")  # fmt: skip
    assert_close("y", torch.cat([y1, y2], 1), y_all, F64)
    assert_close("h", h2, h_all, F64)


def test_no_final_state_and_default_mode():
    inputs = build(1, 9, 2, 1, 4, 4)
    y, h = linrnn.mamba2(*(inputs[n] for n in ("x", "dt", "A", "B", "C")), dt_softplus=True)
    assert h is None and y.shape == inputs["x"].shape and y.dtype == F64


# --------------------------------------------------------------------------------------------
# torch.compile


def test_compile_fullgraph_torch():
    """chunk mode under torch.compile(fullgraph=True) (aot_eager): equals eager, gradients
    too."""
    inputs = build(1, 24, 4, 2, 8, 8)
    h0 = torch.randn(1, 4, 8, 8, dtype=F64)

    def fn(leaves, **kw):
        return op(leaves, mode="chunk", chunk_size=8, backend="torch", dt_softplus=True, **kw)

    eager = with_grads(fn, inputs, h0)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    got = with_grads(compiled, inputs, h0)
    compare(got, eager)


# --------------------------------------------------------------------------------------------
# Triton (the interpreter tier without a GPU): a few small cases


TRITON_CASES = [
    # mode, B, T, H, G, N, P, chunk size, packed, strong
    ("chunk", 1, 37, 4, 2, 16, 8, 16, False, True),
    ("chunk", 1, 33, 2, 1, 16, 16, 16, True, False),
    ("fused_chunk", 2, 21, 4, 2, 8, 16, 16, False, True),
    ("fused_chunk", 1, 33, 4, 1, 16, 8, 16, True, False),
    ("recurrent", 1, 19, 4, 1, 16, 8, None, True, True),
    ("recurrent", 2, 13, 4, 2, 8, 8, None, False, False),
]


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: f"{c[0]}-T{c[2]}-G{c[4]}")
def test_triton_modes(case, backend):
    """fp32 on the Triton kernels against the fp64 loop: outputs, states, every gradient."""
    _check_triton(case, backend)


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("hpp", [4, 2], ids=["group-per-program", "half-group-per-program"])
def test_triton_group_sums(hpp, backend, monkeypatch):
    """The chunk path's dq and dk kernels sum a group's value heads themselves (dB, dC): the
    whole group of 4 heads in one program, or two programs of 2 whose partial sums the host
    adds; every output and gradient against the fp64 loop. (The group kernels' threshold is
    set above 4 here, whatever its default.)"""
    from linrnn.engine import scalar

    used = []

    def fixed(G, programs):
        used.append(G)
        return hpp

    monkeypatch.setattr(scalar, "heads_per_program", fixed)
    monkeypatch.setattr(scalar, "GROUP_MIN_HEADS", 5)
    _check_triton(("chunk", 2, 21, 8, 2, 16, 8, 8, False, True), backend)
    assert used == [4, 4]  # dq and dk, each with groups of H / G = 4 heads


LARGE_GROUP_CASES = [
    # B, T, H, G, N, P, packed: chunks of 32 rows in two tiles of 16, some cut short
    (1, 60, 8, 2, 32, 32, True),
    (2, 50, 8, 1, 32, 16, False),
]


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("case", LARGE_GROUP_CASES, ids=lambda c: f"H{c[2]}-G{c[3]}-packed{c[6]}")
def test_triton_large_groups(case, backend, monkeypatch):
    """Groups of 4 and 8 value heads per B/C group take the group kernels (dB and dC through
    one intra-chunk gradient matrix per group and chunk): each launched once per backward, the
    per-head dq/dk kernels never; every output and gradient against the fp64 loop, packed
    sequences and initial states too. Tiles of 16 so that a chunk has several row, column and
    K tiles (the off-diagonal tiles, the sums over tiles)."""
    from linrnn.engine import group_kernels, scalar

    launched = []

    class Counted:
        def __init__(self, name):
            self.name, self.kernel = name, getattr(group_kernels, name)

        def __getitem__(self, grid):
            def launch(**kw):
                launched.append(self.name)
                return self.kernel[grid](**kw)

            return launch

    names = ("dscores_kernel", "dqk_group_kernel")
    monkeypatch.setattr(scalar, "group", type("Group", (), {n: Counted(n) for n in names}))
    monkeypatch.setitem(scalar.GROUP_TILES, "dscores", (16, 16, 16, 4, 2))
    monkeypatch.setitem(scalar.GROUP_TILES, "dq_dk", (16, 16, 16, 8, 2))
    monkeypatch.setattr(scalar, "GROUP_MIN_HEADS", 4)  # (whatever its shipped value)
    monkeypatch.setattr(scalar, "heads_per_program", lambda G, programs: pytest.fail("HPP path"))
    Bsz, T, H, G, N, P, packed = case
    _check_triton(("chunk", Bsz, T, H, G, N, P, 32, packed, True), backend)
    assert launched == ["dscores_kernel", "dqk_group_kernel", "dqk_group_kernel"]  # dq, dk


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize(
    ("tiles", "L"), [((16, 32), 32), ((32, 16), 32), ((16, 32), 48)],
    ids=["dq-tile-larger", "dq-tile-smaller", "dq-tile-past-the-chunk"],
)  # fmt: skip
def test_group_tiles_of_other_heights(tiles, L, backend, monkeypatch):
    """dq and dk read dscores_kernel's gradient matrix and per-tile sums by token, so their
    row tile may differ from its tile: one larger (a dq/dk tile spans several dscores tiles, one
    cut by a short chunk), one smaller, and chunks of 48 rows, whose second dq/dk tile runs past
    the chunk's end; each against the fp64 loop with packed sequences."""
    from linrnn.engine import scalar

    t_scores, t_dq = tiles
    monkeypatch.setitem(scalar.GROUP_TILES, "dscores", (t_scores, 16, 16, 4, 2))
    monkeypatch.setitem(scalar.GROUP_TILES, "dq_dk", (t_dq, 16, 16, 8, 2))
    monkeypatch.setattr(scalar, "GROUP_MIN_HEADS", 4)
    _check_triton(("chunk", 1, 60, 8, 2, 32, 32, L, True, True), backend)


def _check_triton(case, backend, per_channel_skip=False):
    mode, Bsz, T, H, G, N, P, L, packed, strong = case
    inputs = build(Bsz, T, H, G, N, P, strong=strong)
    if per_channel_skip:
        inputs["D"] = torch.randn(H, P, dtype=F64)
    inputs = {n: x.float().double().to(DEVICE) for n, x in inputs.items()}
    cu = [0, T // 3, T] if packed else None
    nseq = 2 if packed else Bsz
    h0 = torch.randn(nseq, H, N, P, dtype=F64).float().double().to(DEVICE)
    if packed:
        ref, low = _packed_loop(inputs, h0, cu, F64), _packed_loop(inputs, h0, cu, torch.float32)
    else:
        ref, low = with_grads(loop, inputs, h0), with_grads(loop, inputs, h0, torch.float32)
    got = with_grads(op, inputs, h0, torch.float32, mode=mode, chunk_size=L, cu_seqlens=cu,
                     backend=backend, dt_softplus=True)  # fmt: skip
    # dA and d(dt_bias) sum per-step gate gradients over every step, and the kernels form the
    # log-decay gradient dg_t by the engine's identity (docs/DESIGN.md §6.5): held to that
    # identity's conditioning bound, not to their own size (per-head scalars whose terms
    # cancel: their fp32 error reaches 1e-3 of their value).
    # d(dt) per step = σ(z)·(A·dg + dgi/Δ) carries dg's absolute floor, the documented
    # 16·u·Σ_t (‖C_t‖‖dC_t‖ + ‖B_t‖‖dB_t‖) per head (§6.5), times |A|·σ(z): a step after a
    # decay of −60 in its chunk has cumulative log decays of that size, whose fp32 differences
    # carry ~u·60 of relative error (measured over 30 seeds: the RMS error at most 1.0 × the
    # floor's RMS, 0.02–0.4 typically).
    bounds = _head_sum_bounds(inputs, h0, cu)
    for name in ("A", "dt_bias"):
        err = (got[2][name].double().cpu() - ref[2][name].cpu()).norm() / bounds[name].norm()
        assert err <= HEAD_SUM_TOL, f"d{name}: {err:.2e} of its summed terms' size"
    assert_decay_grad_close("ddt", got[2]["dt"].cpu(), ref[2]["dt"].cpu(), bounds["dt"],
                            torch.float32, 16.0)  # fmt: skip
    for name in ("A", "dt_bias", "dt"):
        for part in (low, got):
            part[2][name] = ref[2][name]
    compare(got, ref, torch.float32, low)


# ~32 fp32 roundoffs of the summed terms' size. Measured over the four Triton cases at 120
# seeds: typically 1e-9…1e-7 and at most 5.6e-7 (a chunk whose cumulative log decays reach
# ~−60, whose fp32 differences carry that much more rounding); 1e-6 left too thin a margin.
HEAD_SUM_TOL = 2e-6


def _head_sum_bounds(inputs, h0, cu):
    """Size of the terms the Triton engine sums for dA and d(dt_bias). The log-decay gradient
    comes from the identity dg_u = Σ_{t≥u} (q_t·dq_t − k_t·dk_t) + ⟨S_T, dS_T⟩ (q = C, k = B per
    head), the log-input-gate gradient is dgi_t = k_t·dk_t; their fp32 rounding is what the
    results carry. With s_t = Σ_{t'≥t} (|C·dC| + |B·dB|) + Σ_n |⟨h_T, dh_T⟩| (over the whole
    packed T: a bound for each sequence) and z = dt + dt_bias, per head:
    dA: ``Σ_t Δ_t s_t``; d(dt_bias): ``Σ_t |A| σ(z_t) s_t + σ(z_t)/Δ_t |B·dB|_t``. From an
    fp64 run with B and C given per head. Also, under "dt", the per-step scale of d(dt)'s
    floor: ``|A| σ(z_t) · u·Σ_t (‖C_t‖‖dC_t‖ + ‖B_t‖‖dB_t‖)`` (:func:`decay_grad_scale`)."""
    H = inputs["x"].shape[2]
    heads = torch.arange(H, device=inputs["x"].device) // (H // inputs["B"].shape[2])
    per_head = dict(inputs, B=inputs["B"][:, :, heads], C=inputs["C"][:, :, heads])
    if cu is None:
        y, h, grads = with_grads(loop, per_head, h0)
    else:
        y, h, grads = _packed_loop(per_head, h0, cu, F64)
    gen = torch.Generator().manual_seed(0)
    torch.randn(y.shape, generator=gen, dtype=F64)  # dy, as with_grads and _packed_loop draw it
    dh = torch.randn(h.shape, generator=gen, dtype=F64).to(h.device)
    k_dk = (per_head["B"] * grads["B"]).sum(-1).abs()
    terms = (per_head["C"] * grads["C"]).sum(-1).abs() + k_dk  # [B, T, H]
    scale = terms.flip(1).cumsum(1).flip(1) + (h * dh).sum((-2, -1)).abs().sum(0)
    z = inputs["dt"] + inputs["dt_bias"]
    delta, sig = torch.nn.functional.softplus(z), torch.sigmoid(z)
    bias = inputs["A"].abs() * sig * scale + sig / delta * k_dk
    floor = decay_grad_scale(per_head["C"], grads["C"], per_head["B"], grads["B"], H)
    return {
        "A": (delta * scale).sum((0, 1)).cpu(),
        "dt_bias": bias.sum((0, 1)).cpu(),
        "dt": (inputs["A"].abs() * sig * floor[:, None, :]).cpu(),
    }


def _packed_loop(inputs, h0, cu, dtype):
    """The loop over each packed sequence from its own state, in ``dtype``, with autograd
    gradients."""
    leaves = {n: x.detach().to(dtype).requires_grad_() for n, x in inputs.items()}
    h0l = h0.detach().to(dtype).requires_grad_()
    ys, hs = [], []
    for i in range(len(cu) - 1):
        a, b = cu[i], cu[i + 1]
        seq = {n: (x[:, a:b] if n in ("x", "dt", "B", "C") else x) for n, x in leaves.items()}
        y, h = loop(seq, initial_state=h0l[i : i + 1])
        ys.append(y)
        hs.append(h)
    y, h = torch.cat(ys, 1), torch.cat(hs, 0)
    gen = torch.Generator().manual_seed(0)
    dy = torch.randn(y.shape, generator=gen, dtype=F64).to(y.device)
    dh = torch.randn(h.shape, generator=gen, dtype=F64).to(h.device)
    ((y.double() * dy).sum() + (h.double() * dh).sum()).backward()
    grads = {n: x.grad for n, x in leaves.items()}
    grads["initial_state"] = h0l.grad
    return y.detach(), h.detach(), grads


@pytest.mark.parametrize("backend", ["triton"])
def test_triton_reads_groups(backend, monkeypatch):
    """Every Triton mode gets B and C with their G groups (no per-head copy): chunk,
    fused_chunk, recurrent with and without gradients, and the in-place step, whose kernel
    writes the new state over the caller's and adds D·x itself (the skip term)."""
    from linrnn.ops import _generic

    seen = []

    def spy(name, real):
        def fn(q, k, v, **kw):
            out = kw.get("out_state")
            target = out[0].data_ptr() if out else None
            skip = kw.get("skip") is not None
            seen.append((name, q.shape[2], k.shape[2], v.shape[2], target, skip))
            return real(q, k, v, **kw)

        return fn

    monkeypatch.setattr(_generic.scalar, "chunk", spy("chunk", _generic.scalar.chunk))
    monkeypatch.setattr(_generic.triton_rec, "forward", spy("rec", _generic.triton_rec.forward))
    monkeypatch.setattr(_generic.triton_rec, "recurrent",
                        spy("rec_grad", _generic.triton_rec.recurrent))  # fmt: skip
    i = {n: x.float().to(DEVICE) for n, x in build(1, 9, 4, 2, 4, 4).items()}
    args = [i[n] for n in ("x", "dt", "A", "B", "C")]
    for mode in ("chunk", "fused_chunk", "recurrent"):
        linrnn.mamba2(*args, dt_softplus=True, mode=mode, backend=backend)
    x = i["x"].clone().requires_grad_()
    linrnn.mamba2(x, *args[1:], dt_softplus=True, mode="recurrent", backend=backend)
    state = torch.zeros(1, 4, 4, 4, device=DEVICE)
    one = [a[:, :1] if a.dim() > 1 else a for a in args]
    linrnn.mamba2_step(*one, D=i["D"], dt_softplus=True, state=state, inplace=True,
                       backend=backend)  # fmt: skip
    assert seen == [
        ("chunk", 2, 2, 4, None, False), ("chunk", 2, 2, 4, None, False),
        ("rec", 2, 2, 4, None, False), ("rec_grad", 2, 2, 4, None, False),
        ("rec", 2, 2, 4, None, False),  # (the Function's forward)
        ("rec", 2, 2, 4, state.data_ptr(), True),
    ]  # fmt: skip


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_triton_per_channel_skip(mode, backend):
    """D [H, P] on the Triton paths (the chunk engine's skip term is per head: a per-channel
    D is added outside its kernels)."""
    _check_triton((mode, 2, 29, 4, 2, 16, 8, 16, False, False), backend, per_channel_skip=True)


@pytest.mark.parametrize("backend", ["triton"])
def test_triton_steps_and_compile(backend):
    """The Triton recurrent step after a Triton chunk prefill equals the fp64 loop, and so do
    the chunk op and the step (B, C grouped: H = 2, G = 1) under torch.compile(fullgraph=True)
    and eager."""
    Bsz, T, T0, H, G, N, P = 1, 10, 7, 2, 1, 8, 8
    inputs = {n: x.float().to(DEVICE) for n, x in build(Bsz, T, H, G, N, P).items()}
    y_all, h_all = loop({n: x.double() for n, x in inputs.items()})
    first = {n: (x[:, :T0] if x.dim() > 1 else x) for n, x in inputs.items()}
    y0, state = op(first, mode="chunk", backend=backend, dt_softplus=True)
    ys = [y0]
    for t in range(T0, T):
        i = {n: (x[:, t : t + 1] if x.dim() > 1 else x) for n, x in inputs.items()}
        y, state = linrnn.mamba2_step(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"],
                                      dt_bias=i["dt_bias"], dt_softplus=True, state=state,
                                      inplace=True, backend=backend)  # fmt: skip
        ys.append(y)
    assert_close("y", torch.cat(ys, 1).double().cpu(), y_all.cpu(), torch.float32)
    assert_close("state", state.double().cpu(), h_all.cpu(), torch.float32)

    def fn(x, dt, A, B, C, D, dt_bias):
        return linrnn.mamba2(x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=True,
                             mode="chunk", chunk_size=8, backend=backend)[0]  # fmt: skip

    # Eager calls form the gates in a kernel and add D·x inside the engine's output kernel; the
    # traced graph runs the engine's custom ops, which take the gates formed by PyTorch and have
    # no skip term (D·x on the host): two roundings of the same values, each held to the loop.
    args = [inputs[n] for n in NAMES]
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    assert_close("y eager", fn(*args).double().cpu(), y_all.cpu(), torch.float32)
    assert_close("y compiled", compiled.double().cpu(), y_all.cpu(), torch.float32)

    def step(x, dt, A, B, C, state):  # (the view checks the traced state's shape)
        y, new = linrnn.mamba2_step(x, dt, A, B, C, dt_softplus=True, state=state,
                                    backend=backend)  # fmt: skip
        return y, new.view(Bsz, H, N * P)

    # (the step too: eager, its gates come from the gate kernel; traced, from PyTorch)
    one = [inputs[n][:, :1] if inputs[n].dim() > 1 else inputs[n] for n in NAMES[:5]]
    y1, h1 = loop({n: x.double() for n, x in zip(NAMES, one)}, initial_state=h_all)
    eager = step(*one, h_all.float())
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(*one, h_all.float())
    for name, got in (("eager", eager), ("compiled", compiled)):
        assert_close(f"step y {name}", got[0].double().cpu(), y1.cpu(), torch.float32)
        assert_close(f"step state {name}", got[1].double().cpu(), h1.reshape(Bsz, H, N * P).cpu(),
                     torch.float32)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Input checks


def _bad(**change):
    i = build(1, 6, 4, 2, 4, 3)
    i.update(change)
    return i


@pytest.mark.parametrize(
    "inputs,kw,exc,pattern",
    [
        (_bad(B=torch.randn(1, 6, 3, 4, dtype=F64), C=torch.randn(1, 6, 3, 4, dtype=F64)), {},
         ValueError, r"H=4 must be a multiple of the group count G=3"),
        (_bad(C=torch.randn(1, 6, 2, 5, dtype=F64)), {}, ValueError, r"C must have the shape of B"),
        (_bad(B=torch.randn(1, 5, 2, 4, dtype=F64), C=torch.randn(1, 5, 2, 4, dtype=F64)), {},
         ValueError, r"B and C must be \[B, T, G, N\]"),
        (_bad(B=torch.randn(1, 6, 2, 4)), {}, TypeError, r"x, B, C must share one dtype"),
        (_bad(A=torch.tensor([-1.0, 0.5, -1.0, -1.0], dtype=F64)), {}, ValueError,
         r"A must be ≤ 0 .* maximum is 0.5"),
        (_bad(D=torch.randn(3, dtype=F64)), {}, ValueError, r"D must have shape \[H\]"),
        (_bad(D=torch.randn(4, 4, dtype=F64)), {}, ValueError,
         r"D must have shape \[H, P\] = \(4, 3\), got \(4, 4\)"),
        (_bad(dt_bias=torch.randn(1, 4, dtype=F64)), {}, ValueError, r"dt_bias must have shape"),
        (_bad(dt=torch.randn(1, 6, 3, dtype=F64)), {}, ValueError, r"dt must have shape"),
        (_bad(dt=torch.full((1, 6, 4), math.nan, dtype=F64)), {}, ValueError,
         r"dt must be finite"),
        (_bad(dt=-torch.ones(1, 6, 4, dtype=F64)), {"dt_softplus": False}, ValueError,
         r"dt_softplus=False, Δ = dt \+ dt_bias .* must be ≥ 0"),
        (_bad(x=torch.randn(1, 6, 4, dtype=F64)), {}, ValueError, r"x must have 4 dimensions"),
        (_bad(), {"dt_softplus": 1}, TypeError, r"dt_softplus must be a bool"),
        (_bad(), {"initial_state": torch.zeros(1, 4, 3, 4, dtype=F64)}, ValueError,
         r"initial_state must have shape \[N_seq, H, N, P\] = \(1, 4, 4, 3\)"),
        (_bad(), {"mode": "fast"}, ValueError, r"mode must be one of"),
    ],
)  # fmt: skip
def test_bad_inputs(inputs, kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        i = inputs
        linrnn.mamba2(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"], dt_bias=i["dt_bias"],
                      **{"dt_softplus": True, **kw})  # fmt: skip


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("case", ["plain", "extreme", "no_bias_channel_D", "bf16"])
def test_triton_decode_steps(case, backend):
    """Eager Triton steps without gradients, one token at a time from a random state: the
    recurrent kernel forms Δ = softplus(dt + dt_bias), the decay exp(Δ·A), the input weight Δ
    and D·x from the raw inputs (one launch a step). Against the float64 loop over the whole
    sequence, groups G < H; ``extreme``: Δ·A = −40 on some steps, Δ = 0 in fp64 on others
    (dt = −1000), and dt = 60 (softplus linear) on a few; ``no_bias_channel_D``: no dt_bias and
    a per-channel D (added after the kernel); ``bf16``: x, B, C and dt in bf16."""
    Bsz, T, H, G, N, P = 2, 6, 4, 2, 8, 6
    extreme = case == "extreme"
    inputs = build(Bsz, T, H, G, N, P, strong=extreme, underflow=extreme)
    if extreme:
        inputs["dt"][:, 2, 1] = 60.0
    if case == "no_bias_channel_D":
        del inputs["dt_bias"]
        inputs["D"] = torch.randn(H, P, dtype=F64)
    low = torch.bfloat16 if case == "bf16" else torch.float32
    lowered = {n: x.to(low if n in ("x", "B", "C", "dt") else torch.float32)
               for n, x in inputs.items()}  # fmt: skip
    h0 = torch.randn(Bsz, H, N, P, dtype=torch.float32)
    y_ref, h_ref = loop({n: x.double() for n, x in lowered.items()}, initial_state=h0.double())
    dev = {n: x.to(DEVICE) for n, x in lowered.items()}
    state, ys = h0.to(DEVICE), []
    with torch.no_grad():
        for t in range(T):
            i = {n: (x[:, t : t + 1] if n in ("x", "dt", "B", "C") else x) for n, x in dev.items()}
            y, state = linrnn.mamba2_step(
                i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"], dt_bias=i.get("dt_bias"),
                dt_softplus=True, state=state, backend=backend,
            )  # fmt: skip
            ys.append(y)
    y = torch.cat(ys, 1)
    assert y.dtype == low and state.dtype == torch.float32
    assert_close("y", y.cpu(), y_ref, low)
    assert_close("state", state.cpu(), h_ref, torch.float32)
