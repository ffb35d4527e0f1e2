"""The delta rule's Triton recurrent mode (linrnn.engine.delta_recurrent): outputs, final states
and every gradient (q, k, v, beta, g, the initial state) against the float64 step loop
(linrnn.reference.delta.delta_recurrent), for DeltaNet and Gated DeltaNet; grouped value heads,
odd lengths, K ≠ V, several value tiles, strong decays, beta up to 2, packed sequences, in-place
final states, single decode steps. Without a GPU it runs under TRITON_INTERPRET=1 (conftest)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, assert_decay_grad_close, decay_grad_scale

from linrnn.engine import delta_recurrent as dr
from linrnn.reference.delta import delta_recurrent

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("q", "k", "v", "beta", "g", "S0")


def _inputs(B, T, H, G, K, V, *, gated=True, h0=True, beta_max=1.0, g_min=-1.0, N=None):
    """Random fp32 inputs (the test's seed, conftest): L2-normalized keys, beta in
    [0, beta_max], log decays uniform in [g_min, 0] (None without ``gated``), S0 [N, HV, K, V]
    (None without ``h0``)."""
    rnd = lambda *s: torch.randn(*s, device=DEVICE)  # noqa: E731
    uni = lambda *s: torch.rand(*s, device=DEVICE)  # noqa: E731
    HV, N = H * G, B if N is None else N
    return dict(
        q=rnd(B, T, H, K), k=F.normalize(rnd(B, T, H, K), dim=-1), v=rnd(B, T, HV, V),
        beta=beta_max * uni(B, T, HV), g=g_min * uni(B, T, HV) if gated else None,
        S0=rnd(N, HV, K, V) if h0 else None,
    )  # fmt: skip


def _run(fn, x, do, dS, dtype):
    """o, S_T and the gradients of ⟨o, do⟩ + ⟨S_T, dS⟩ w.r.t. every given input, in ``dtype``."""
    leaves = {n: None if t is None else t.detach().to(dtype).requires_grad_()
              for n, t in x.items()}  # fmt: skip
    o, S = fn(**leaves)
    loss = (o.to(dtype) * do.to(dtype)).sum() + (S.to(dtype) * dS.to(dtype)).sum()
    loss.backward()
    return o.detach(), S.detach(), {n: t.grad for n, t in leaves.items() if t is not None}


def _triton(scale, offsets=None):
    def fn(q, k, v, beta, g, S0):
        return dr.recurrent(q, k, v, beta, g, scale=scale, S0=S0, offsets=offsets)

    return fn


def _reference(scale, offsets=None):
    """The fp64 loop; packed sequences one at a time."""

    def one(q, k, v, beta, g, S0):
        return delta_recurrent(q, k, v, beta, scale=scale, g=g, S0=S0)

    def fn(q, k, v, beta, g, S0):
        if offsets is None:
            return one(q, k, v, beta, g, S0)
        outs, states = [], []
        for i, (a, b) in enumerate(itertools.pairwise(offsets)):
            s0 = None if S0 is None else S0[i : i + 1]
            if b > a:
                q_, k_, v_, b_, g_ = (None if t is None else t[:, a:b] for t in (q, k, v, beta, g))
                o, s = one(q_, k_, v_, b_, g_, s0)
            else:  # an empty sequence keeps its initial state
                K = q.shape[-1]
                o = v[:, a:b]
                s = s0 if s0 is not None else v.new_zeros(1, v.shape[2], K, v.shape[3])
            outs.append(o)
            states.append(s)
        return torch.cat(outs, 1), torch.cat(states, 0)

    return fn


def _check(x, scale=None, offsets=None):
    """Triton (fp32 inputs) against the fp64 loop: o, S_T and every gradient, RMS-relative
    error within RTOL[fp32]."""
    B, T, _H, K = x["q"].shape
    N = B if offsets is None else len(offsets) - 1
    HV, V = x["v"].shape[2:]
    scale = K**-0.5 if scale is None else scale
    do, dS = torch.randn(B, T, HV, V, device=DEVICE), torch.randn(N, HV, K, V, device=DEVICE)
    o, S, grads = _run(_triton(scale, offsets), x, do, dS, torch.float32)
    o_ref, S_ref, g_ref = _run(_reference(scale, offsets), x, do, dS, torch.float64)
    assert o.dtype == torch.float32 and S.dtype == torch.float32
    assert_close("o", o, o_ref, torch.float32)
    assert_close("S_T", S, S_ref, torch.float32)
    assert set(grads) == set(g_ref)
    for n in g_ref:
        assert grads[n].dtype == x[n].dtype, (n, grads[n].dtype)
        if n == "g":  # the identity's absolute part (measured: at most 0.1 of the scale's RMS)
            scale_g = decay_grad_scale(x["q"], g_ref["q"], x["k"], g_ref["k"], HV)
            assert_decay_grad_close("dg", grads[n], g_ref[n], scale_g, torch.float32, 1.0)
        else:
            assert_close(f"d{n}", grads[n], g_ref[n], torch.float32)
    return o, S, grads, (do, dS)


# ---------------------------------------------------------------------------------------------
# Against the reference


@pytest.mark.parametrize("h0", [False, True], ids=["zero", "h0"])
@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
@pytest.mark.parametrize(
    "shape", [(2, 9, 2, 1, 16, 16), (1, 7, 2, 2, 20, 12), (2, 5, 1, 3, 8, 24)],
    ids=["B2-T9-H2-G1-K16-V16", "B1-T7-H2-G2-K20-V12", "B2-T5-H1-G3-K8-V24"],
)  # fmt: skip
def test_matches_reference(shape, gated, h0):
    """DeltaNet and Gated DeltaNet, odd T, K ≠ V, grouped value heads (G value heads per q/k
    head), with and without an initial state."""
    _check(_inputs(*shape, gated=gated, h0=h0))


def test_head_dim_128():
    _check(_inputs(1, 5, 1, 2, 128, 32, beta_max=2.0))


def test_several_value_tiles(monkeypatch):
    """Value tiles of 16 columns (V = 40: three per head, the last one partial): the partials
    of dq, dk, dbeta and the decay term summed over the tiles."""
    monkeypatch.setattr(dr, "TILE", dict(dr.TILE, BV_MAX=16))
    monkeypatch.setattr(dr, "BWD_TILE", dict(dr.BWD_TILE, BV_MAX=16))
    assert dr.value_tile(12, 40, dr.TILE)[1] == dr.value_tile(12, 40, dr.BWD_TILE)[1] == 16
    _check(_inputs(2, 6, 2, 2, 12, 40))


def test_strong_decays_and_beta_two():
    """Log decays down to −30 per step (exp underflows towards 0) and beta in [0, 2] with
    normalized keys, including steps at beta = 1 (the step projects out k: I − k kᵀ is
    singular) and beta = 2 (a reflection): finite and exact."""
    x = _inputs(2, 16, 2, 2, 16, 12, beta_max=2.0, g_min=-30.0)
    x["beta"][:, 3] = 1.0
    x["beta"][:, 8] = 2.0
    x["g"][:, 5] = 0.0
    grads = _check(x)[2]
    assert all(torch.isfinite(t).all() for t in grads.values())


@pytest.mark.parametrize("h0", [False, True], ids=["zero", "h0"])
@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_decay_gradient_restarts(monkeypatch, packed, h0):
    """The decay gradient's reverse sum restarts from the exact value every ANCHOR_EVERY steps
    (here 4, with lengths that are no multiple of it, an empty sequence and two value tiles
    per head: the restart values are sums over the tiles)."""
    monkeypatch.setattr(dr, "ANCHOR_EVERY", 4)
    monkeypatch.setattr(dr, "TILE", dict(dr.TILE, BV_MAX=16))
    if packed:
        lens = [9, 0, 4, 13, 1]
        offsets = [0, *torch.tensor(lens).cumsum(0).tolist()]
        x = _inputs(1, sum(lens), 2, 2, 8, 24, N=len(lens), h0=h0, beta_max=2.0, g_min=-30.0)
        assert len(dr.anchor_slots(1, sum(lens), offsets)[0]) == 2 + 3
    else:
        offsets = None
        x = _inputs(2, 11, 1, 2, 8, 24, h0=h0, beta_max=2.0, g_min=-30.0)
    _check(x, offsets=offsets)


def test_long_sequence_strong_decays():
    """A sequence of several restart segments with decays down to −30 per step."""
    _check(_inputs(1, 150, 1, 1, 8, 8, beta_max=2.0, g_min=-30.0))


def test_scale():
    _check(_inputs(1, 4, 2, 1, 8, 8), scale=0.37)


def test_single_step():
    """T = 1 (one decode step) with gradients."""
    _check(_inputs(3, 1, 2, 2, 16, 8))


# ---------------------------------------------------------------------------------------------
# Packed sequences, in-place states, decoding


def test_packed_sequences_equal_separate_calls():
    """Packed sequences (lengths 1, 0, 6, 3) in one launch: the reference per sequence, and the
    same outputs, states and gradients as separate calls of the kernel."""
    lens = [1, 0, 6, 3]
    offsets = [0, *torch.tensor(lens).cumsum(0).tolist()]
    x = _inputs(1, sum(lens), 2, 2, 12, 10, N=len(lens), beta_max=2.0)
    o, S, grads, (do, dS) = _check(x, offsets=offsets)
    scale = 12**-0.5
    for i, (a, b) in enumerate(itertools.pairwise(offsets)):
        if a == b:
            assert torch.equal(S[i], x["S0"][i])
            assert torch.equal(grads["S0"][i], dS[i])
            continue
        part = {n: t[:, a:b] if n != "S0" else t[i : i + 1] for n, t in x.items()}
        o_i, S_i, g_i = _run(_triton(scale), part, do[:, a:b], dS[i : i + 1], torch.float32)
        torch.testing.assert_close(o[:, a:b], o_i, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(S[i : i + 1], S_i, rtol=1e-6, atol=1e-6)
        for n, t in g_i.items():
            got = grads[n][i : i + 1] if n == "S0" else grads[n][:, a:b]
            torch.testing.assert_close(got, t, rtol=1e-6, atol=1e-6, msg=n)


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_out_state_in_place(monkeypatch, packed):
    """out_state = S0 (an in-place step, two value tiles per head): the same tensor comes back
    holding the final state, and o and S_T equal an out-of-place call."""
    monkeypatch.setattr(dr, "TILE", dict(dr.TILE, BV_MAX=16))
    offsets = [0, 2, 5] if packed else None
    x = _inputs(1 if packed else 2, 5, 2, 2, 8, 24, N=2)
    with torch.no_grad():
        o_ref, S_ref = dr.recurrent(**_args(x), scale=0.5, S0=x["S0"], offsets=offsets)
        S0 = x["S0"].clone()
        o, S = dr.recurrent(**_args(x), scale=0.5, S0=S0, offsets=offsets, out_state=S0)
    assert S is S0
    assert torch.equal(o, o_ref) and torch.equal(S, S_ref)


def _args(x):
    return {n: x[n] for n in ("q", "k", "v", "beta", "g")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_decode_steps_equal_one_call(dtype):
    """Token-by-token forward calls (T = 1, the state written in place) equal one call, and
    the reference; o in q's dtype."""
    B, T, H, G, K, V = 2, 6, 2, 2, 16, 8
    x = _inputs(B, T, H, G, K, V, beta_max=2.0)
    for n in ("q", "k", "v"):
        x[n] = x[n].to(dtype)
    with torch.no_grad():
        o_all, S_all = dr.recurrent(**_args(x), scale=0.25, S0=x["S0"], offsets=None)
        state, outs = x["S0"].clone(), []
        for t in range(T):
            tok = {n: x[n][:, t : t + 1] for n in ("q", "k", "v", "beta", "g")}
            (o_t, S_t), saved = dr.forward(**tok, scale=0.25, S0=state, out_state=state)
            assert S_t is state and saved is None and o_t.dtype == dtype
            outs.append(o_t)
        d = {n: None if t is None else t.double() for n, t in x.items()}
        o_ref, S_ref = delta_recurrent(d["q"], d["k"], d["v"], d["beta"], scale=0.25, g=d["g"],
                                       S0=d["S0"])  # fmt: skip
    assert torch.equal(torch.cat(outs, 1), o_all)
    torch.testing.assert_close(state, S_all, rtol=1e-6, atol=1e-6)
    assert_close("o", o_all, o_ref, dtype)
    assert_close("S_T", S_all, S_ref, dtype)


def test_gradient_of_one_output_only():
    """Only o, or only S_T, enters the loss (the other cotangent is None in the backward)."""
    x = _inputs(2, 5, 1, 2, 8, 8)
    for use in ("o", "S"):
        leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
        ref = {n: t.double().requires_grad_() for n, t in x.items()}
        o, S = _triton(0.5)(**leaves)
        o2, S2 = _reference(0.5)(**ref)
        (o.sum() if use == "o" else S.sum()).backward()
        (o2.sum() if use == "o" else S2.sum()).backward()
        for n in NAMES:  # S_T does not read q: no reference gradient, and zeros here
            want = ref[n].grad if ref[n].grad is not None else torch.zeros_like(ref[n])
            assert_close(f"{use}: d{n}", leaves[n].grad, want, torch.float32)


# ---------------------------------------------------------------------------------------------
# Validation


def test_bad_inputs_raise():
    x = _inputs(2, 3, 2, 2, 8, 8)
    kw = dict(scale=1.0, S0=None, offsets=None)
    with pytest.raises(ValueError, match=r"HV"):
        dr.recurrent(**dict(_args(x), v=x["v"][:, :, :3]), **kw)
    with pytest.raises(ValueError, match=r"beta must be \[B, T, HV\]"):
        dr.recurrent(**dict(_args(x), beta=x["beta"][:, :, :2]), **kw)
    with pytest.raises(ValueError, match=r"S0 must be \[N, HV, K, V\]"):
        dr.recurrent(**_args(x), scale=1.0, S0=x["S0"][:1], offsets=None)
    with pytest.raises(ValueError, match="need B = 1"):
        dr.recurrent(**_args(x), scale=1.0, S0=None, offsets=[0, 1, 3])
    one = {n: t[:1] for n, t in _args(x).items()}
    with pytest.raises(ValueError, match="offsets must rise from 0 to T=3"):
        dr.recurrent(**one, scale=1.0, S0=None, offsets=[0, 2])
    with pytest.raises(TypeError, match="float64"):
        dr.recurrent(**dict(_args(x), q=x["q"].double()), **kw)
    with pytest.raises(ValueError, match="K ≤ 256"):
        big = torch.zeros(1, 1, 1, 512)
        dr.recurrent(big, big, torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1), None, **kw)
    with pytest.raises(ValueError, match="contiguous float32"):
        dr.recurrent(**_args(x), scale=1.0, S0=x["S0"], offsets=None,
                     out_state=x["S0"].double())  # fmt: skip
    q = x["q"].clone().requires_grad_()
    with pytest.raises(ValueError, match="without gradients"):
        dr.recurrent(**dict(_args(x), q=q), scale=1.0, S0=x["S0"], offsets=None,
                     out_state=x["S0"])  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
def test_decode_steps_normalize_q_and_k_in_the_kernel(gated, dtype):
    """``use_qk_l2norm=True`` decode steps without gradients normalize q and k inside the
    recurrent kernel (one launch a step), as the op's own normalization does: against the
    float64 loop on q, k normalized in the inputs' dtype, keys of norms 1e-3…30 (and one zero
    row), grouped value heads, token by token from a random state."""
    import linrnn
    from linrnn.ops.delta_rule import l2norm

    B, T, H, G, K, V = 2, 6, 2, 2, 16, 8
    x = _inputs(B, T, H, G, K, V, gated=gated, beta_max=2.0)
    norms = 10.0 ** torch.empty(B, T, H, 1, device=DEVICE).uniform_(-3, 1.5)
    x["k"] = x["k"] * norms
    x["k"][0, 1, 0] = 0.0
    for n in ("q", "k", "v"):
        x[n] = x[n].to(dtype)
    fn = linrnn.gated_delta_rule if gated else linrnn.delta_rule
    gates = (x["g"], x["beta"]) if gated else (x["beta"],)
    state, outs = x["S0"].clone(), []
    with torch.no_grad():
        for t in range(T):
            tok = [a[:, t : t + 1] for a in (x["q"], x["k"], x["v"], *gates)]
            o, state = fn(*tok, initial_state=state, output_final_state=True, mode="recurrent",
                          backend="triton", use_qk_l2norm=True)  # fmt: skip
            outs.append(o)
    d = {n: None if t is None else t.double() for n, t in x.items()}
    qn, kn = (l2norm(x[n]).double() for n in ("q", "k"))  # normalized and rounded as the op
    o_ref, S_ref = delta_recurrent(qn, kn, d["v"], d["beta"], scale=K**-0.5, g=d["g"],
                                   S0=d["S0"])  # fmt: skip
    o = torch.cat(outs, 1)
    assert o.dtype == dtype
    assert_close("o", o, o_ref, dtype)
    assert_close("S_T", state, S_ref, dtype)
