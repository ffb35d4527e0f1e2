"""The delta-rule ops (``linrnn.delta_rule``, ``linrnn.gated_delta_rule``) on the PyTorch
path: every mode against the fp64 step-by-step loop (outputs, final states and the gradients
of q, k, v, β, g and the initial state), grouped value heads, chunk sizes, strong decays,
β up to 2, the in-op L2 norm, packed sequences, prefill + steps, causality, the loop itself
against an explicit-matrix form, and the input checks."""

from __future__ import annotations

import importlib
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close

import linrnn
from linrnn.ops import _generic
from linrnn.reference import delta_recurrent

F64 = torch.float64
GATED = [False, True]
GATED_IDS = ["delta", "gated"]


def build(B, T, H, HV, K, V, *, gated, dtype=F64, strong=False, beta_max=1.0, normalize=True):
    """Seeded inputs: unit-norm keys (``normalize``), β uniform in [0, beta_max], log decays
    mild or (``strong``) −30 on a random half of the steps."""
    k = torch.randn(B, T, H, K, dtype=F64)
    d = {
        "q": torch.randn(B, T, H, K, dtype=F64),
        "k": F.normalize(k, dim=-1) if normalize else k,
        "v": torch.randn(B, T, HV, V, dtype=F64),
        "beta": torch.rand(B, T, HV, dtype=F64) * beta_max,
    }
    if gated:
        mild = F.logsigmoid(torch.randn(B, T, HV, dtype=F64) + 2.0)
        d["g"] = torch.where(torch.rand(B, T, HV) < 0.5, -30.0, mild) if strong else mild
    return {n: x.to(dtype) for n, x in d.items()}


def call(inputs, **kw):
    """The op of these inputs (gated when they hold g), with the positional order of each."""
    if "g" in inputs:
        args = (inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"])
        return linrnn.gated_delta_rule(*args, **kw)
    return linrnn.delta_rule(inputs["q"], inputs["k"], inputs["v"], inputs["beta"], **kw)


def loop(inputs, *, scale=None, initial_state=None, **_):
    """The ground truth: :func:`delta_recurrent` called directly (fp64)."""
    K = inputs["q"].shape[-1]
    return delta_recurrent(
        inputs["q"], inputs["k"], inputs["v"], inputs["beta"],
        scale=K**-0.5 if scale is None else scale, g=inputs.get("g"), S0=initial_state,
    )  # fmt: skip


def with_grads(fn, inputs, S0, seed=0, **kw):
    """Run ``fn`` on fresh leaves; returns ``(o, S_T, grads)`` of the loss
    ``Σ o·do + Σ S_T·dS`` with fixed random cotangents."""
    leaves = {n: x.detach().clone().requires_grad_() for n, x in inputs.items()}
    S0 = None if S0 is None else S0.detach().clone().requires_grad_()
    o, S = fn(leaves, initial_state=S0, **kw)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen, dtype=F64).to(o.dtype)
    dS = torch.randn(S.shape, generator=gen, dtype=F64).to(S.dtype)
    ((o * do).sum() + (S * dS).sum()).backward()
    grads = {n: x.grad for n, x in leaves.items()}
    if S0 is not None:
        grads["initial_state"] = S0.grad
    return o.detach(), S.detach(), grads


def op(inputs, **kw):
    return call(inputs, output_final_state=True, **kw)


def compare(got, ref, dtype=F64, low=None, factor=1.0):
    pick = (lambda i: None) if low is None else (lambda i: low[i])
    assert_close("o", got[0], ref[0], dtype, factor, pick(0))
    assert_close("final_state", got[1], ref[1], dtype, factor, pick(1))
    assert got[2].keys() == ref[2].keys()
    for name in ref[2]:
        lo = None if low is None else low[2][name]
        assert_close(f"d{name}", got[2][name], ref[2][name], dtype, factor, lo)


# --------------------------------------------------------------------------------------------
# Every mode against the loop


@pytest.mark.parametrize("init", [False, True], ids=["h0=None", "h0"])
@pytest.mark.parametrize(
    "mode,chunk_size",
    [("reference", None), ("recurrent", None), ("parallel", None), ("chunk", 1),
     ("chunk", 16), ("chunk", 64), (None, 7)],
    ids=["reference", "recurrent", "parallel", "chunk1", "chunk16", "chunk64>T", "default7"],
)  # fmt: skip
@pytest.mark.parametrize("gated", GATED, ids=GATED_IDS)
def test_modes_match_loop_fp64(gated, mode, chunk_size, init):
    """Grouped value heads (H=2, HV=4), odd T=37 (no multiple of 16 or 7), K ≠ V, β up to 2 on
    unit keys: outputs, final states and every gradient equal the loop's to ~1e-9."""
    B, T, H, HV, K, V = 2, 37, 2, 4, 12, 7
    inputs = build(B, T, H, HV, K, V, gated=gated, beta_max=2.0)
    S0 = torch.randn(B, HV, K, V, dtype=F64) if init else None
    ref = with_grads(loop, inputs, S0)
    got = with_grads(op, inputs, S0, mode=mode, chunk_size=chunk_size, backend="torch")
    assert got[0].dtype == F64 and got[1].dtype == F64
    compare(got, ref)


@pytest.mark.parametrize("mode", ["chunk", "parallel", "recurrent"])
def test_strong_decays_fp64(mode):
    """g = −30 on half the steps (cumulative −500 and below within a chunk): finite and exact."""
    B, T, H, HV, K, V = 1, 45, 1, 2, 8, 6
    inputs = build(B, T, H, HV, K, V, gated=True, strong=True, beta_max=2.0)
    S0 = torch.randn(B, HV, K, V, dtype=F64)
    ref = with_grads(loop, inputs, S0)
    got = with_grads(op, inputs, S0, mode=mode, chunk_size=16, backend="torch")
    compare(got, ref)


@pytest.mark.parametrize(
    "T,K,V,L", [(50, 16, 12, 16), (100, 64, 64, 64)], ids=["K16-V12-L16", "K64-V64-L64"]
)
@pytest.mark.parametrize("gated", GATED, ids=GATED_IDS)
def test_chunk_fp32_strong_decays(gated, T, K, V, L):
    """fp32 inputs on the chunk path (fp32 compute, fp64 log-space decays): within 2× the
    error of the loop run in fp32, against the fp64 loop on the same rounded inputs."""
    B, H, HV = 1, 2, 2
    inputs = build(B, T, H, HV, K, V, gated=gated, strong=True, beta_max=2.0)
    inputs = {n: x.float().double() for n, x in inputs.items()}
    S0 = torch.randn(B, HV, K, V, dtype=F64).float().double()
    ref = with_grads(loop, inputs, S0)
    f32 = {n: x.float() for n, x in inputs.items()}
    low = with_grads(loop, f32, S0.float())
    got = with_grads(op, f32, S0.float(), mode="chunk", chunk_size=L, backend="torch")
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    compare(got, ref, torch.float32, low)


def test_beta_two_exactly():
    """β = 2 everywhere on unit keys: the transition is a reflection (eigenvalue −1); the
    chunk solve stays exact."""
    B, T, H, HV, K, V = 1, 40, 1, 1, 8, 8
    inputs = build(B, T, H, HV, K, V, gated=True)
    inputs["beta"] = torch.full_like(inputs["beta"], 2.0)
    S0 = torch.randn(B, HV, K, V, dtype=F64)
    ref = with_grads(loop, inputs, S0)
    for L in (1, 16, 64):
        compare(with_grads(op, inputs, S0, mode="chunk", chunk_size=L), ref)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_l2norm_inside_the_op(mode):
    """``use_qk_l2norm=True`` equals normalizing q and k before the loop, gradients w.r.t. the
    raw q and k included."""
    B, T, H, HV, K, V = 2, 21, 2, 2, 10, 6
    inputs = build(B, T, H, HV, K, V, gated=True, normalize=False)
    inputs["q"], inputs["k"] = inputs["q"] * 3, inputs["k"] * 3

    def normalized_loop(leaves, **kw):
        n = lambda x: x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
        return loop({**leaves, "q": n(leaves["q"]), "k": n(leaves["k"])}, **kw)

    ref = with_grads(normalized_loop, inputs, None)
    got = with_grads(op, inputs, None, mode=mode, chunk_size=8, use_qk_l2norm=True)
    compare(got, ref)


def test_l2norm_low_precision_dtype():
    """The normalized q, k come back in the input dtype (bf16 in, bf16 out)."""
    inputs = build(1, 9, 1, 1, 8, 4, gated=False, normalize=False, dtype=torch.bfloat16)
    o, S = op(inputs, use_qk_l2norm=True, backend="torch")
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    ref = loop({n: x.double() for n, x in inputs.items()} | {
        "q": F.normalize(inputs["q"].double(), dim=-1, eps=0),
        "k": F.normalize(inputs["k"].double(), dim=-1, eps=0),
    })  # fmt: skip
    assert_close("o", o, ref[0], torch.bfloat16)


# --------------------------------------------------------------------------------------------
# Packed sequences, prefill + steps


@pytest.mark.parametrize("mode", ["chunk", "recurrent", "parallel"])
@pytest.mark.parametrize("gated", GATED, ids=GATED_IDS)
def test_packed_equals_separate(gated, mode):
    """cu_seqlens (with an empty sequence): each sequence from its own initial state, outputs,
    final states and gradients as separate calls."""
    offsets = [0, 5, 5, 23, 40]
    H, HV, K, V = 1, 2, 8, 5
    inputs = build(1, offsets[-1], H, HV, K, V, gated=gated, beta_max=2.0)
    n = len(offsets) - 1
    S0 = torch.randn(n, HV, K, V, dtype=F64)
    got = with_grads(op, inputs, S0, mode=mode, chunk_size=8, cu_seqlens=offsets)

    def separate(leaves, initial_state, **kw):
        outs, states = [], []
        for i in range(n):
            a, b = offsets[i], offsets[i + 1]
            if a == b:
                states.append(initial_state[i : i + 1])
                continue
            part = {name: x[:, a:b] for name, x in leaves.items()}
            o, S = op(part, initial_state=initial_state[i : i + 1], mode=mode, chunk_size=8)
            outs.append(o)
            states.append(S)
        return torch.cat(outs, dim=1), torch.cat(states)

    compare(got, with_grads(separate, inputs, S0))


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
@pytest.mark.parametrize("gated", GATED, ids=GATED_IDS)
def test_prefill_then_steps(gated, inplace):
    """A chunk prefill followed by single-token steps (``linrnn.<op>_step``) equals one call
    (fp64; in place: fp32, the dtype of the states an in-place step takes)."""
    B, T, T0, H, HV, K, V = 2, 30, 19, 2, 4, 8, 6
    dtype = torch.float32 if inplace else F64
    inputs = build(B, T, H, HV, K, V, gated=gated, beta_max=2.0, dtype=dtype)
    one, S_one = op(inputs, mode="chunk", chunk_size=8)
    pre = {n: x[:, :T0] for n, x in inputs.items()}
    outs, S = [], None
    o, S = op(pre, mode="chunk", chunk_size=8)
    outs.append(o)
    step = linrnn.gated_delta_rule_step if gated else linrnn.delta_rule_step
    for t in range(T0, T):
        tok = [inputs[n][:, t : t + 1] for n in (("q", "k", "v", "g", "beta") if gated else
                                                  ("q", "k", "v", "beta"))]  # fmt: skip
        before = S
        o, S = step(*tok, state=S, inplace=inplace)
        assert (S is before) == inplace
        outs.append(o)
    assert_close("o", torch.cat(outs, dim=1), one, dtype)
    assert_close("final_state", S, S_one, dtype)


# --------------------------------------------------------------------------------------------
# Causality


@pytest.mark.parametrize("mode,chunk_size", [("recurrent", None), ("chunk", 8), ("parallel", None)])
@pytest.mark.parametrize("name", ["q", "k", "v", "beta", "g"])
def test_causal_finite_change(name, mode, chunk_size):
    """Changing any input at step t0 (by a lot, finitely) leaves every output before t0
    bit-for-bit unchanged, in every mode (masked terms are exact zeros)."""
    B, T, H, HV, K, V, t0 = 1, 29, 1, 2, 6, 5, 13
    inputs = build(B, T, H, HV, K, V, gated=True)
    o, _ = op(inputs, mode=mode, chunk_size=chunk_size)
    changed = {n: x.clone() for n, x in inputs.items()}
    x = changed[name]
    x[:, t0:] = {"beta": 2.0, "g": -7.0}.get(name, 1e3)
    o2, _ = op(changed, mode=mode, chunk_size=chunk_size)
    assert torch.equal(o2[:, :t0], o[:, :t0])
    assert not torch.equal(o2[:, t0:], o[:, t0:])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
@pytest.mark.parametrize("name", ["q", "k", "v", "beta", "g"])
def test_causal_non_finite(name, mode, bad):
    """A NaN or inf at step t0 (value checks off, so it gets in) leaves every earlier output
    of the PyTorch path unchanged, in every mode: also the earlier rows of t0's own chunk (the
    chunk's products mask with ``where`` and never multiply a later row's NaN by a masked
    zero)."""
    B, T, H, HV, K, V, t0, L = 1, 29, 1, 2, 6, 5, 19, 8
    inputs = build(B, T, H, HV, K, V, gated=True)
    o, _ = op(inputs, mode=mode, chunk_size=L, backend="torch")
    inputs[name][:, t0] = bad
    with linrnn.checks(False):
        o2, _ = op(inputs, mode=mode, chunk_size=L, backend="torch")
    assert t0 % L, "t0 lies inside a chunk, after some of its rows"
    assert torch.equal(o2[:, :t0], o[:, :t0])


# --------------------------------------------------------------------------------------------
# The loop against fla's naive recurrent gated delta rule, as explicit matrices


def test_loop_matches_explicit_matrices():
    """``delta_recurrent`` against an independent form of fla's naive recurrent gated delta
    rule (``S_t = exp(g_t)(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ``, ``o_t = scale S_tᵀ
    q_t``, value head j reading q/k head j // (HV/H)): the transition built as a K×K matrix,
    the state after t steps as the product of the transitions applied to S0 plus the written
    terms, each carried forward by the later transitions. Unnormalized keys, β in [0, 2]."""
    B, T, H, HV, K, V = 2, 9, 2, 6, 5, 4
    inputs = build(B, T, H, HV, K, V, gated=True, normalize=False, beta_max=2.0)
    S0 = torch.randn(B, HV, K, V, dtype=F64)
    scale = 0.7
    o, S_T = delta_recurrent(
        inputs["q"], inputs["k"], inputs["v"], inputs["beta"], scale=scale, g=inputs["g"],
        S0=S0,
    )  # fmt: skip
    G, eye = HV // H, torch.eye(K, dtype=F64)
    for b in range(B):
        for j in range(HV):
            i = j // G
            k, q = inputs["k"][b, :, i], inputs["q"][b, :, i]
            v, beta, g = inputs["v"][b, :, j], inputs["beta"][b, :, j], inputs["g"][b, :, j]
            M = [torch.exp(g[t]) * (eye - beta[t] * torch.outer(k[t], k[t])) for t in range(T)]
            for t in range(T):
                carry = eye.clone()  # M_t ⋯ M_{s+1}, built from s = t down
                S = torch.zeros(K, V, dtype=F64)
                for s in range(t, -1, -1):
                    S = S + carry @ (beta[s] * torch.outer(k[s], v[s]))
                    carry = carry @ M[s]
                S = S + carry @ S0[b, j]
                torch.testing.assert_close(o[b, t, j], scale * S.T @ q[t], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(S_T[b, j], S, rtol=1e-12, atol=1e-12)


def test_unnormalized_keys_follow_the_math():
    """Keys with β|k|² far beyond 2 (an expanding recurrence) raise no error: every mode
    follows the loop while the values stay representable (short T, fp64)."""
    B, T, H, HV, K, V = 1, 12, 1, 1, 4, 3
    inputs = build(B, T, H, HV, K, V, gated=False, normalize=False, beta_max=2.0)
    inputs["k"] = inputs["k"] * 2  # |k|² ≈ 16
    # β in [1, 2]: every step expands along its key (|1 − β|k|²| ≈ 15–31); with β from 0 up
    # a few seeds in a hundred expanded less than 1e3 over the 12 steps (276 at the least)
    inputs["beta"] = 1.0 + inputs["beta"] / 2
    ref = loop(inputs)
    assert ref[1].abs().max() > 1e3  # it does expand (3e5 at the least over 300 seeds)
    for mode in ("chunk", "parallel", "recurrent"):
        o, S = op(inputs, mode=mode, chunk_size=4)
        assert_close("o", o, ref[0], F64, factor=1e3)
        assert_close("final_state", S, ref[1], F64, factor=1e3)


# --------------------------------------------------------------------------------------------
# Dispatch and input checks


def test_default_mode_and_dtypes():
    """mode=None on CPU runs the PyTorch chunk path; bf16 in → bf16 out, state fp32."""
    inputs = build(2, 20, 1, 2, 8, 8, gated=True, dtype=torch.bfloat16)
    o, S = op(inputs)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    o_none, S_none = call(inputs)
    assert S_none is None and torch.equal(o_none, o)


def test_fused_chunk_not_implemented():
    inputs = build(1, 4, 1, 1, 4, 4, gated=True)
    with pytest.raises(NotImplementedError, match="fused_chunk"):
        op(inputs, mode="fused_chunk")


def _bad(**changes):
    inputs = build(2, 5, 2, 4, 3, 6, gated=True)
    inputs.update(changes)
    return inputs


@pytest.mark.parametrize(
    "inputs,kw,exc,pattern",
    [
        (_bad(v=torch.randn(2, 5, 3, 6, dtype=F64)), {}, ValueError, r"HV=3.*multiple.*H=2"),
        (_bad(v=torch.randn(2, 4, 4, 6, dtype=F64)), {}, ValueError, r"v must be.*\(2, 4, 4, 6\)"),
        (_bad(k=torch.randn(2, 5, 2, 4, dtype=F64)), {}, ValueError, r"k must.*\(2, 5, 2, 4\)"),
        (_bad(k=torch.randn(2, 5, 2, 3)), {}, TypeError, r"share one dtype.*float32"),
        (_bad(g=torch.zeros(2, 5, 2, dtype=F64)), {}, ValueError, r"g must have.*\(2, 5, 4\)"),
        (_bad(beta=torch.zeros(2, 5, 2)), {}, ValueError, r"beta must have shape.*\(2, 5, 4\)"),
        (_bad(g=torch.full((2, 5, 4), 0.5, dtype=F64)), {}, ValueError, r"g .*≤ 0.*0\.5"),
        (_bad(g=torch.full((2, 5, 4), float("nan"))), {}, ValueError, r"g must be finite"),
        (_bad(beta=torch.full((2, 5, 4), 2.5)), {}, ValueError, r"beta must lie in \[0, 2\].*2\.5"),
        (_bad(beta=torch.full((2, 5, 4), -0.1)), {}, ValueError, r"beta must lie in.*-0\.1"),
        (_bad(beta=torch.full((2, 5, 4), float("inf"))), {}, ValueError, r"beta must be finite"),
        (_bad(), {"initial_state": torch.zeros(2, 2, 3, 6)}, ValueError,
         r"initial_state must have shape \[N, HV, K, V\] = \(2, 4, 3, 6\)"),
        (_bad(), {"use_qk_l2norm": 1}, TypeError, r"use_qk_l2norm must be a bool"),
        (_bad(), {"mode": "fast"}, ValueError, r"mode must be one of.*'fast'"),
        (_bad(), {"backend": "jax"}, ValueError, r"backend must be one of.*'jax'"),
        (_bad(), {"chunk_size": 0}, ValueError, r"chunk_size must be ≥ 1, got 0"),
        (_bad(), {"cu_seqlens": [0, 5]}, ValueError, r"batch size must be 1, got B=2"),
        (_bad(), {"scale": float("nan")}, ValueError, r"scale must be finite"),
    ],
    ids=["HV-not-multiple", "v-T", "k-shape", "dtype-mix", "g-shape", "beta-shape", "g-positive",
         "g-nan", "beta-above-2", "beta-negative", "beta-inf", "state-shape", "l2norm-flag",
         "mode", "backend", "chunk-size", "cu-seqlens-B", "scale"],
)  # fmt: skip
def test_bad_inputs(inputs, kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(inputs, **kw)


def test_value_checks_switch():
    """β and g value checks follow ``linrnn.checks``: off, β = 3 runs and follows the loop."""
    inputs = build(1, 6, 1, 1, 4, 4, gated=True)
    inputs["beta"] = torch.full_like(inputs["beta"], 3.0)
    with pytest.raises(ValueError, match=re.escape("beta must lie in [0, 2]")):
        op(inputs)
    with linrnn.checks(False):
        o, S = op(inputs, mode="chunk", chunk_size=4)
    ref = loop(inputs)
    assert_close("o", o, ref[0], F64)
    assert_close("final_state", S, ref[1], F64)


# --------------------------------------------------------------------------------------------
# The Triton dispatch contract (stand-in hosts record what the front end passes)

FRONT = importlib.import_module("linrnn.ops.delta_rule")
NEEDS_TRITON = pytest.mark.skipif(
    _generic.scalar is None, reason="backend='triton' routing needs Triton"
)


class _Host:
    """Stands in for linrnn.engine.delta / delta_recurrent: records each call and answers with
    the fp64 loop (in the kernels' output dtypes)."""

    def __init__(self):
        self.calls = []

    def _answer(self, q, k, v, beta, g, scale, S0):
        cast = lambda x: None if x is None else x.double()  # noqa: E731
        o, S = delta_recurrent(*map(cast, (q, k, v, beta)), scale=scale, g=cast(g), S0=cast(S0))
        return o.to(q.dtype), S.float()

    def chunk(self, q, k, v, beta, g, *, scale, S0, offsets, chunk_size):
        self.calls.append(dict(mode="chunk", q=q, beta=beta, g=g, S0=S0, offsets=offsets,
                               chunk_size=chunk_size))  # fmt: skip
        return self._answer(q, k, v, beta, g, scale, S0)

    def recurrent(self, q, k, v, beta, g, *, scale, S0, offsets, out_state=None,
                  l2norm_eps=None):  # fmt: skip
        self.calls.append(dict(mode="recurrent", q=q, beta=beta, g=g, S0=S0, offsets=offsets,
                               out_state=out_state, l2norm_eps=l2norm_eps))  # fmt: skip
        if l2norm_eps is not None:  # the kernel's normalization
            q, k = FRONT.l2norm(q), FRONT.l2norm(k)
        o, S = self._answer(q, k, v, beta, g, scale, S0)
        if out_state is not None:
            out_state.copy_(S)
            S = out_state
        return o, S


@NEEDS_TRITON
def test_triton_dispatch_contract(monkeypatch):
    """backend="triton": q, k, v keep their dtype; β, g and the initial state go in as fp32;
    offsets as a list; chunk_size None (the engine's default) unless given; mode=None without
    gradients and T ≤ 64 takes the recurrent kernel; an in-place step hands the caller's state
    to the recurrent kernel as out_state; a step with use_qk_l2norm hands it q and k as given
    and the normalization's eps (the kernel normalizes them)."""
    host = _Host()
    monkeypatch.setattr(FRONT, "triton_chunk", host)
    monkeypatch.setattr(FRONT, "triton_recurrent", host)
    x = build(1, 12, 1, 2, 8, 4, gated=True, dtype=torch.bfloat16)
    S0 = torch.randn(2, 2, 8, 4, dtype=torch.float64)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    cu = torch.tensor([0, 5, 12])
    linrnn.gated_delta_rule(*args, initial_state=S0, cu_seqlens=cu, mode="chunk",
                            backend="triton")  # fmt: skip
    linrnn.gated_delta_rule(*args, mode="chunk", chunk_size=16, backend="triton")
    linrnn.gated_delta_rule(*args, backend="triton")
    first, second, third = host.calls
    assert first["mode"] == "chunk" and first["chunk_size"] is None
    assert first["offsets"] == [0, 5, 12]
    assert first["q"].dtype == torch.bfloat16
    assert first["beta"].dtype == first["g"].dtype == first["S0"].dtype == torch.float32
    assert second["chunk_size"] == 16 and second["S0"] is None and second["offsets"] is None
    assert third["mode"] == "recurrent" and third["out_state"] is None

    host.calls.clear()
    state = torch.randn(1, 2, 8, 4)
    tok = [t[:, :1] for t in args]
    o, new = linrnn.gated_delta_rule_step(*tok, state=state.clone(), backend="triton")
    same = state.clone()
    o2, new2 = linrnn.gated_delta_rule_step(*tok, state=same, inplace=True, backend="triton")
    copy_call, inplace_call = host.calls
    assert copy_call["out_state"] is None and inplace_call["out_state"] is same
    assert new2 is same and torch.equal(new2, new) and torch.equal(o2, o)

    host.calls.clear()
    linrnn.gated_delta_rule_step(*tok, state=state.clone(), backend="triton", use_qk_l2norm=True)
    linrnn.gated_delta_rule(*args, mode="chunk", backend="triton", use_qk_l2norm=True)
    step_call, chunk_call = host.calls
    assert step_call["l2norm_eps"] == FRONT.L2NORM_EPS and step_call["q"] is tok[0]
    assert "l2norm_eps" not in chunk_call and not torch.equal(chunk_call["q"], args[0])


@NEEDS_TRITON
def test_triton_missing_host(monkeypatch):
    """Without the Triton delta-rule host the error names the module and the way out."""
    monkeypatch.setattr(FRONT, "triton_chunk", None)
    monkeypatch.setattr(FRONT, "_CHUNK_MISSING", ImportError("stand-in"), raising=False)
    x = build(1, 4, 1, 1, 4, 4, gated=False, dtype=torch.float32)
    with pytest.raises(NotImplementedError, match=r"linrnn\.engine\.delta.*backend='torch'"):
        op(x, mode="chunk", backend="triton")
    with pytest.raises(TypeError, match="float64"):
        op({n: t.double() for n, t in x.items()}, mode="chunk", backend="triton")
