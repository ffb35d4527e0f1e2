"""Shared test helpers: the one tolerance rule, and a registry of every family variant with
input builders, so each test runs over all of them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import linrnn

# RMS-relative error ‖a − b‖ / ‖b‖ allowed against the float64 reference, per input dtype.
# fp32: gradients of per-head scalars (log decays, the initial m) are sums of O(T·K·V)
# products, and with a handful of elements their RMS-relative error reaches ~6e-5.
RTOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


# References whose RMS is below this are compared absolutely (e.g. a gradient that is
# mathematically zero, such as d(gk) at T = 1 with no initial state, where 1e-16 is correct).
TINY_RMS = 1e-3


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    floor = TINY_RMS * max(ref.numel(), 1) ** 0.5
    return ((got - ref).norm() / ref.norm().clamp_min(floor)).item()


def assert_close(
    name: str,
    got,
    ref,
    dtype: torch.dtype,
    factor: float = 1.0,
    same_dtype_ref=None,
    same_dtype_factor: float = 2.0,
) -> None:
    """The one tolerance helper: shapes equal, no NaN, infinities exactly where the reference
    has them, and RMS-relative error within ``RTOL[dtype] · factor`` — or, for 16/32-bit
    inputs, within ``same_dtype_factor`` (2) × the error of the step-by-step reference run in
    the same dtype
    (``same_dtype_ref``: flash-attention's rule; rounding the output and its cotangent to
    bf16 alone costs that much on ill-conditioned gradients). The message shows the error and
    the worst element."""
    assert got is not None and ref is not None, f"{name}: missing ({got is None=}, {ref is None=})"
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(got).any(), f"{name}: {int(torch.isnan(got).sum())} NaN"
    # ±inf only where the reference has the same (mLSTM's m = −∞ means "no state yet").
    inf = ~torch.isfinite(ref)
    assert torch.equal(~torch.isfinite(got), inf), f"{name}: non-finite where the ref is finite"
    assert torch.equal(got[inf].double(), ref[inf].double()), f"{name}: infinities differ"
    got, ref = got[~inf], ref[~inf]
    tol = RTOL[dtype] * factor
    if same_dtype_ref is not None:
        tol = max(tol, same_dtype_factor * rel_err(same_dtype_ref[~inf], ref))
    err = rel_err(got, ref)
    if not err <= tol:
        diff = (got.double() - ref.double()).abs()
        idx = int(diff.argmax())
        raise AssertionError(
            f"{name}: rms-rel error {err:.3e} > {tol:.1e} ({dtype}); worst at flat {idx}: "
            f"got {got[idx].item():.6g}, ref {ref[idx].item():.6g}"
        )


# The kernels' log-decay gradients come from the identity Σ_{t≥u} (q_t·dq_t − k_t·dk_t) (and the
# delta rule's own terms), whose terms cancel: their error is absolute, of the order of
# u · Σ_t (‖q_t‖‖dq_t‖ + ‖k_t‖‖dk_t‖) per head (u the fp32 unit roundoff, docs/DESIGN.md §6.5)
# however small the true gradient is, e.g. under decays of −30 per step.
U32 = 2.0**-24


def decay_grad_scale(q, dq, k, dk, value_heads: int) -> torch.Tensor:
    """u · Σ_t (‖q_t‖‖dq_t‖ + ‖k_t‖‖dk_t‖) per value head, [B, HV]: from q, k ``[B, T, H, K]``
    and their reference gradients (value head j reads q/k head j // G)."""
    norm = lambda t: t.double().norm(dim=-1)  # noqa: E731
    per_qk_head = (norm(q) * norm(dq) + norm(k) * norm(dk)).sum(1)  # [B, H]
    G = value_heads // q.shape[2]
    return U32 * per_qk_head.repeat_interleave(G, dim=1)


def assert_decay_grad_close(name: str, got, ref, scale, dtype: torch.dtype, factor: float):
    """A kernel's log-decay gradient ``[B, T, HV]`` (or one derived from it elementwise)
    against the reference: RMS error within ``RTOL[dtype]·‖ref‖`` plus the identity's
    absolute part, ``factor`` times the RMS of ``scale`` over the elements (``[B, HV]``, as
    :func:`decay_grad_scale` gives it, or per element, ``[B, T, HV]``)."""
    assert got.shape == ref.shape and not torch.isnan(got).any(), name
    err = (got.double() - ref.double()).norm().item()
    scale = scale[:, None, :] if scale.dim() == 2 else scale
    absolute = factor * scale.expand(ref.shape).norm().item()
    tol = RTOL[dtype] * ref.double().norm().item() + absolute
    assert err <= tol, (
        f"{name}: RMS error {err:.3e} > {tol:.3e} ({RTOL[dtype]:.0e} of the reference "
        f"+ {absolute:.3e}, {factor} × the identity's absolute scale)"
    )


@dataclass
class Family:
    """One op variant: how to build its inputs, call it, and shape its state."""

    name: str
    fn: object
    tensors: tuple  # names of tensor positional/keyword inputs (all get gradients)
    build: object  # (B, T, H, K, V, extreme) -> dict name -> fp64 tensor
    kwargs: dict = field(default_factory=dict)
    state: str = "S"  # "S", "Sn" (linear_attn normalize) or "Cnm" (mlstm)
    positional: int = 0  # how many of `tensors` are positional

    def call(self, inputs: dict, **kw):
        args = [inputs[n] for n in self.tensors[: self.positional]]
        named = {n: inputs[n] for n in self.tensors[self.positional :] if n in inputs}
        return self.fn(*args, **named, **self.kwargs, **kw)

    def make_state(self, N, H, K, V, dtype=torch.float64):
        S = torch.randn(N, H, K, V, dtype=dtype)
        if self.state == "S":
            return S
        n = torch.rand(N, H, K, dtype=dtype) + 0.5
        if self.state == "Sn":
            return (S, n)
        return (S, n, torch.randn(N, H, dtype=dtype))


def flat_state(state) -> list[torch.Tensor]:
    if state is None:
        return []
    return list(state) if isinstance(state, tuple) else [state]


def _qkv(B, T, H, K, V, positive=False):
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    if positive:  # feature-mapped inputs (elu + 1) keep linear attention's normalizer > 0
        q, k = F.elu(q) + 1, F.elu(k) + 1
    return {"q": q.double(), "k": k.double(), "v": torch.randn(B, T, H, V).double()}


def _log_decay(shape, extreme):
    if extreme:  # strong decays: −30 per step on a random half, the rest mild
        return torch.where(torch.rand(shape) < 0.5, -30.0, -0.05 * torch.rand(shape)).double()
    return F.logsigmoid(torch.randn(shape) + 2.0).double()


def _build_la(B, T, H, K, V, extreme, positive=False):
    return _qkv(B, T, H, K, V, positive)


def _build_retention(B, T, H, K, V, extreme):
    d = _qkv(B, T, H, K, V)
    d["log_decay"] = (
        torch.tensor([-30.0] + [-0.01] * (H - 1))
        if extreme
        else torch.log(1 - 2.0 ** (-2.0 - torch.arange(H, dtype=torch.float64)))
    ).double()[:H]
    return d


def _build_sgla(B, T, H, K, V, extreme):
    return {**_qkv(B, T, H, K, V), "g": _log_decay((B, T, H), extreme)}


def _build_gla(B, T, H, K, V, extreme, with_gv=False):
    d = {**_qkv(B, T, H, K, V), "gk": _log_decay((B, T, H, K), extreme)}
    if with_gv:
        d["gv"] = _log_decay((B, T, H, V), extreme)
    return d


def _build_rwkv6(B, T, H, K, V, extreme):
    d = _qkv(B, T, H, K, V)
    return {
        "r": d["q"],
        "k": d["k"],
        "v": d["v"],
        "w": _log_decay((B, T, H, K), extreme),
        "u": torch.randn(H, K).double(),
    }


def _build_mlstm(B, T, H, K, V, extreme):
    d = _qkv(B, T, H, K, V)
    if extreme:  # input pre-activations at ±20, forget gates saturated either way
        d["i"] = (20.0 * torch.randint(0, 2, (B, T, H)) * 2 - 20.0).double()
        d["f"] = (torch.randn(B, T, H) * 10).double()
    else:
        d["i"] = torch.randn(B, T, H).double() * 2
        d["f"] = (torch.randn(B, T, H) + 3).double()
    return d


QKV = ("q", "k", "v")
FAMILIES = {
    f.name: f
    for f in [
        Family("linear_attn", linrnn.linear_attn, QKV, _build_la, positional=3),
        Family(
            "linear_attn_norm",
            linrnn.linear_attn,
            QKV,
            lambda *a: _build_la(*a, positive=True),
            kwargs={"normalize": True},
            state="Sn",
            positional=3,
        ),
        Family("retention", linrnn.retention, (*QKV, "log_decay"), _build_retention, positional=4),
        Family("simple_gla", linrnn.simple_gla, (*QKV, "g"), _build_sgla, positional=4),
        Family("gla", linrnn.gla, (*QKV, "gk"), _build_gla, positional=4),
        Family(
            "gla_gv",
            linrnn.gla,
            (*QKV, "gk", "gv"),
            lambda *a: _build_gla(*a, with_gv=True),
            positional=4,
        ),
        Family("rwkv6", linrnn.rwkv6, ("r", "k", "v", "w", "u"), _build_rwkv6, positional=5),
        Family(
            "mlstm_exp",
            linrnn.mlstm,
            (*QKV, "i", "f"),
            _build_mlstm,
            kwargs={"input_gate": "exp"},
            state="Cnm",
            positional=5,
        ),
        Family(
            "mlstm_sig",
            linrnn.mlstm,
            (*QKV, "i", "f"),
            _build_mlstm,
            kwargs={"input_gate": "sigmoid"},
            state="Cnm",
            positional=5,
        ),
        Family(
            "mlstm_sig_norm",
            linrnn.mlstm,
            (*QKV, "i", "f"),
            _build_mlstm,
            kwargs={"input_gate": "sigmoid", "normalize": True},
            state="Cnm",
            positional=5,
        ),
    ]
}


def run_with_grads(fam: Family, inputs: dict, initial_state=None, dtype=torch.float64, **kw):
    """Call ``fam`` on ``inputs`` cast to ``dtype`` (gates too, as a user would pass them),
    with gradients on every input and on the initial state. The loss uses fixed random
    cotangents for o and for every final-state tensor.

    Returns ``(o, [final state tensors], {name: grad})``."""
    leaves = {n: t.detach().to(dtype).requires_grad_() for n, t in inputs.items()}
    init = None
    if initial_state is not None:
        init_list = [s.detach().clone().requires_grad_() for s in flat_state(initial_state)]
        init = tuple(init_list) if isinstance(initial_state, tuple) else init_list[0]
        for j, s in enumerate(init_list):
            leaves[f"h0[{j}]"] = s
    before = {n: t.detach().clone() for n, t in leaves.items()}
    o, st = fam.call(leaves, initial_state=init, output_final_state=True, **kw)
    states = flat_state(st)
    cot_o, cot_states = cotangents(o, states)
    loss = (o.double() * cot_o).sum()
    for s, c in zip(states, cot_states):
        loss = loss + (s.double() * c).sum()
    loss.backward()
    for n, t in leaves.items():  # forward and backward leave their inputs alone
        assert torch.equal(t.detach(), before[n]), f"the call wrote its input {n}"
    grads = {n: t.grad for n, t in leaves.items() if t.grad is not None}
    return o.detach(), [s.detach() for s in states], grads


def cotangents(o, states):
    """The fixed random cotangents of :func:`run_with_grads`'s loss: o's, then each final-state
    tensor's (fp64, on their device)."""
    gen = torch.Generator().manual_seed(1234)
    cot = lambda x: torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.device)  # noqa: E731
    return cot(o), [cot(s) for s in states]


# Unit roundoff per input dtype: the relative size of the rounding every input carries.
ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11}
# How many times the inputs' own rounding effect a kernel may show. Rounding every input once
# costs that effect; a chunked kernel rounds its intermediates a few more times in the same
# dtype, each adding a comparable amount.
SENSITIVITY_FACTOR = 8.0


def roundoff_moves(inputs, h0, dtype, seed):
    """A function that returns ``(inputs, h0)`` (a dict, and a tensor, tuple or None) with every
    element multiplied by (1 + u·N(0,1)), u the dtype's unit roundoff, fp64, a fresh draw per
    call from a generator seeded with ``seed``."""
    u = ROUNDOFF[dtype]
    device = next(iter(inputs.values())).device
    gen = torch.Generator(device=device).manual_seed(seed)

    def jig(t):
        noise = torch.randn(t.shape, generator=gen, device=device, dtype=torch.float64)
        return t.double() * (1 + u * noise)

    def move():
        h = None
        if h0 is not None:
            h = tuple(jig(x) for x in h0) if isinstance(h0, tuple) else jig(h0)
        return {n: jig(t) for n, t in inputs.items()}, h

    return move


def sensitivity(fam, inputs, h0, dtype, ref, **kw):
    """RMS-relative change of the fp64 results when every input and initial-state element is
    multiplied by (1 + u·N(0,1)), u the dtype's unit roundoff (max over two draws): the error
    any implementation in that dtype inherits from the problem's conditioning. Near-zero
    normalizers (mLSTM-exp with input gates at ±20) make it reach 1e-4..1e-3 in fp32."""
    move = roundoff_moves(inputs, h0, dtype, seed=1)
    worst = {}
    for _ in range(2):
        xs, h = move()
        o, st, grads = run_with_grads(fam, xs, h, torch.float64, mode="reference", **kw)
        errs = {"o": rel_err(o, ref[0])}
        errs.update({f"state[{j}]": rel_err(a, b) for j, (a, b) in enumerate(zip(st, ref[1]))})
        errs.update({f"d{n}": rel_err(g, ref[2][n]) for n, g in grads.items()})
        worst = {n: max(e, worst.get(n, 0.0)) for n, e in errs.items()}
    return worst


def same_dtype_runs(fam, inputs, h0, dtype, ref_grads, draws=3, **kw):
    """The gradients of the step-by-step PyTorch loop run in ``dtype`` (``assert_close``'s
    ``same_dtype_ref``), the worst of the run at the inputs themselves and ``draws`` runs at
    inputs moved by one unit roundoff (as :func:`sensitivity` moves them), per gradient
    against ``ref_grads``. Where two large terms cancel inside the algorithm (mLSTM-exp's dq
    = scale·(Cᵀ do/P − (do·h)/P · n) when q is nearly orthogonal to n and one k vᵀ dominates
    C), the error of any fp32 implementation at one draw is a sample of a wide spread (from
    0.5 % to 85 % at one such token, loop and kernel alike, under one-roundoff moves of q and
    k): one run of the loop is no yardstick, the worst of a few is."""
    move = roundoff_moves(inputs, h0, dtype, seed=2)
    worst, errs = {}, {}
    for d in range(draws + 1):
        xs, h = move() if d else (inputs, h0)
        if h is not None:
            h = tuple(x.to(dtype) for x in h) if isinstance(h, tuple) else h.to(dtype)
        grads = run_with_grads(fam, xs, h, dtype, backend="torch", mode="recurrent", **kw)[2]
        for n, g in grads.items():
            e = rel_err(g, ref_grads[n])
            if e >= errs.get(n, -1.0):
                worst[n], errs[n] = g, e
    return worst


def layer_grads(layer, x, y) -> dict:
    """The gradients of x and of every parameter of ``layer`` (on the CPU) for the loss
    ``(y·dy).sum()`` with a fixed fp64 dy (the same in every dtype); clears them after."""
    gen = torch.Generator().manual_seed(7)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    (y * dy.to(y.device, y.dtype)).sum().backward()
    out = {"x": x.grad.cpu()}
    out.update({n: p.grad.cpu() for n, p in layer.named_parameters()})
    layer.zero_grad()
    x.grad = None
    return out


def benchmark_script(name: str):
    """The module of ``benchmarks/<name>.py`` (that folder is not a package), loaded anew."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"linrnn_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
