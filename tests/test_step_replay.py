"""Replayed decode steps (linrnn.engine.replay behind linrnn.step): from the third step of a
signature on, ``linrnn.step`` performs the logged device work of the second without the host
logic. Every family and layout: each replayed step equals the ordinary path's step on the same
inputs bitwise (the same kernels on the same data), fresh random inputs every step; a changed
argument is a new signature; data checks asked for still run; calls the log cannot hold are
refused. Without a GPU the kernels run under TRITON_INTERPRET=1 (set in conftest), where the
replay calls each kernel again by name; on CUDA it calls the compiled launcher."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from helpers import FAMILIES, flat_state

import linrnn
from linrnn.engine import replay
from linrnn.ops import step as step_mod

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ORDINARY = step_mod._step  # the step without replay, for the expected values


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def _engine_case(name, B, H, K, V, dtype):
    """(fn, args, kwargs, state) of a helpers.FAMILIES variant at T = 1, fresh values."""
    fam = FAMILIES[name]
    d = {n: t.to(DEVICE, dtype if t.dim() == 4 else torch.float32)
         for n, t in fam.build(B, 1, H, K, V, False).items()}  # fmt: skip
    args = [d[n] for n in fam.tensors[: fam.positional]]
    named = {n: d[n] for n in fam.tensors[fam.positional :] if n in d}
    st = fam.make_state(B, H, K, V, torch.float32)
    st = tuple(s.to(DEVICE) for s in st) if isinstance(st, tuple) else st.to(DEVICE)
    return fam.fn, args, {**named, **fam.kwargs}, st


def _delta_case(gated, B, H, K, V, dtype):
    q, v = _rand(B, 1, H, K, dtype=dtype), _rand(B, 1, H, V, dtype=dtype)
    k = F.normalize(_rand(B, 1, H, K), dim=-1).to(dtype)
    beta = torch.rand(B, 1, H, device=DEVICE)
    S = _rand(B, H, K, V)
    if gated:
        g = F.logsigmoid(_rand(B, 1, H) + 2)
        return linrnn.gated_delta_rule, [q, k, v, g, beta], {}, S
    return linrnn.delta_rule, [q, k, v, beta], {}, S


def _mamba2_case(B, H, K, V, dtype):
    """Mamba2 as its layer calls it: one group of B, C for H heads, softplus step sizes with a
    bias, and D (bound with functools.partial, as the step-host benchmark does)."""
    x, dt = _rand(B, 1, H, V, dtype=dtype), _rand(B, 1, H)
    A = -torch.rand(H, device=DEVICE) - 0.5
    Bm, Cm = _rand(B, 1, 1, K, dtype=dtype), _rand(B, 1, 1, K, dtype=dtype)
    fn = functools.partial(linrnn.mamba2, D=_rand(H), dt_bias=_rand(H), dt_softplus=True)
    return fn, [x, dt, A, Bm, Cm], {}, _rand(B, H, K, V)


def _case(name):
    """A function of nothing giving (fn, args, kwargs, state) with fresh values and the same
    signature on every call; the Triton kernels (the interpreter's without a GPU), but for
    the ``_torch`` cases."""

    def make():
        fn, args, kw, st = _make(name)
        return fn, args, {**kw, "backend": "torch" if name.endswith("_torch") else "triton"}, st

    return make


def _make(name):
    B, H, K, V = 2, 2, 16, 12
    if name in FAMILIES:
        return _engine_case(name, B, H, K, V, torch.float32)
    if name == "gla_bf16":  # 16-bit inputs: the gates are cast to fp32 inside the step
        return _engine_case("gla", B, H, K, V, torch.bfloat16)
    if name == "mlstm_exp_torch":  # the PyTorch recurrence: a longer log of ATen operations
        return _engine_case("mlstm_exp", B, H, K, V, torch.float32)
    if name in ("delta_rule", "gated_delta_rule"):
        return _delta_case(name == "gated_delta_rule", B, H, K, V, torch.float32)
    if name == "gated_delta_rule_l2norm":  # q and k normalized inside the op
        fn, args, kw, st = _delta_case(True, B, H, K, V, torch.float32)
        args[1] = _rand(B, 1, H, K)
        return fn, args, {**kw, "use_qk_l2norm": True}, st
    if name == "mamba2":
        return _mamba2_case(B, H, K, V, torch.float32)
    if name == "linear_attn_strided_q":  # q a transposed view: copied to contiguous inside
        fn, args, kw, st = _engine_case("linear_attn", B, H, K, V, torch.float32)
        args[0] = _rand(B, 1, K, H).transpose(2, 3)
        return fn, args, kw, st
    if name == "retention_state_view":  # a state that is a view: written back by a copy
        fn, args, kw, st = _engine_case("retention", B, H, K, V, torch.float32)
        return fn, args, kw, _rand(B, H, K, V + 3)[..., :V]
    raise KeyError(name)


CASES = [*FAMILIES, "gla_bf16", "mlstm_exp_torch", "delta_rule", "gated_delta_rule",
         "gated_delta_rule_l2norm", "mamba2", "linear_attn_strided_q",
         "retention_state_view"]  # fmt: skip


def _clone(state):
    return tuple(s.clone() for s in state) if isinstance(state, tuple) else state.clone()


@pytest.fixture(autouse=True)
def _fresh_plans():
    step_mod._PLANS.clear()
    yield
    step_mod._PLANS.clear()


def _unfold(fn, args, kwargs):
    if isinstance(fn, functools.partial):
        return fn.func, [*fn.args, *args], {**fn.keywords, **kwargs}
    return fn, args, kwargs


@pytest.mark.parametrize(
    "case, inplace",
    # (a state view is in-place only: a new state is contiguous, a new signature after step 1)
    [(c, p) for c in CASES for p in (False, True) if p or c != "retention_state_view"],
    ids=lambda x: {False: "new", True: "inplace"}.get(x, x) if isinstance(x, bool) else x,
)
def test_replayed_steps_equal_the_ordinary_path(case, inplace, monkeypatch):
    make = _case(case)
    fn, _, _, state = make()
    ordinary_calls = []
    monkeypatch.setattr(step_mod, "_step", lambda *a: ordinary_calls.append(1) or ORDINARY(*a))
    with torch.no_grad(), linrnn.checks(False):
        for i in range(5):
            _, args, kwargs, _ = make()  # fresh values, the same signature
            f, a, kw = _unfold(fn, args, kwargs)
            want_o, want_state = ORDINARY(f, tuple(a), _clone(state), False, kw)
            n_before = len(ordinary_calls)
            o, new = linrnn.step(fn, *args, state=state, inplace=inplace, **kwargs)
            replayed = len(ordinary_calls) == n_before
            assert replayed == (i >= 2), (i, replayed)  # the third step on replays
            assert o.dtype == want_o.dtype and o.shape == want_o.shape
            assert torch.equal(o, want_o), (i, (o - want_o).abs().max())
            if inplace:
                assert new is state
            assert len(flat_state(new)) == len(flat_state(want_state))
            for j, (a_, b_) in enumerate(zip(flat_state(new), flat_state(want_state))):
                assert a_.dtype == torch.float32 and torch.equal(a_, b_), (i, j)
            state = new
    (entry,) = step_mod._PLANS.values()
    assert entry is not None and isinstance(entry[0], replay.Replay)


def test_a_changed_argument_is_a_new_signature():
    """scale 0.5 three times (recorded, replayed), then 0.25, then a bf16 q: each result is the
    ordinary path's for its own arguments."""
    make = _case("simple_gla")
    fn, args, kwargs, state = make()
    with torch.no_grad(), linrnn.checks(False):
        for scale in (0.5, 0.5, 0.5, 0.25, 0.25, 0.25):
            want = ORDINARY(fn, tuple(args), _clone(state), False, dict(kwargs, scale=scale))
            got = linrnn.step(fn, *args, state=state, scale=scale, **kwargs)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), scale
        args[:3] = [x.bfloat16() for x in args[:3]]
        for _ in range(3):
            want = ORDINARY(fn, tuple(args), _clone(state), False, dict(kwargs))
            got = linrnn.step(fn, *args, state=state, **kwargs)
            assert got[0].dtype == torch.bfloat16 and torch.equal(got[0], want[0])
    assert sum(isinstance(e, tuple) for e in step_mod._PLANS.values()) == 3


def test_data_checks_asked_for_still_run():
    """A signature replayed with checks off still gets its data checks when they are turned
    on: a positive log decay raises ValueError then (and on CPU tensors by default)."""
    make = _case("simple_gla")
    fn, args, kwargs, state = make()
    with torch.no_grad():
        with linrnn.checks(False):
            for _ in range(4):
                linrnn.step(fn, *args, state=state, **kwargs)
        bad = list(args)
        bad[3] = args[3].abs() + 0.5  # log decays must be ≤ 0
        message = "g is a log decay and must be ≤ 0"
        with linrnn.checks(True), pytest.raises(ValueError, match=message):
            linrnn.step(fn, *bad, state=state, **kwargs)
        if DEVICE == "cpu":
            with pytest.raises(ValueError, match=message):
                linrnn.step(fn, *bad, state=state, **kwargs)


def test_wrappers_and_gradients_take_the_ordinary_path():
    """An op that is not linrnn's own function (a wrapper may do anything between calls), and
    a step whose inputs need gradients, are never recorded."""
    make = _case("linear_attn")
    _, args, kwargs, state = make()

    def wrapper(*a, **kw):
        return linrnn.linear_attn(*a, **kw)

    with linrnn.checks(False):
        with torch.no_grad():
            for _ in range(4):
                linrnn.step(wrapper, *args, state=state, **kwargs)
        q = args[0].clone().requires_grad_()
        for _ in range(4):
            o, _ = linrnn.step(linrnn.linear_attn, q, *args[1:], state=state, **kwargs)
        assert o.requires_grad
    assert not step_mod._PLANS


def _recorded(call, inputs):
    result, rep, _, why = replay.record(call, inputs)
    return result, rep, why


def test_record_refuses_value_reads_and_outside_tensors():
    x = torch.randn(5)
    outside = torch.randn(5)
    for call, what in [
        (lambda: x.tolist(), "tolist"),
        (lambda: x.sum().item(), "item"),
        (lambda: bool(x.sum() > 0), "__bool__"),
        (lambda: int(x.argmax()), "__int__"),
    ]:
        _, rep, why = _recorded(call, [x])
        assert rep is None and what in why, (what, why)
    _, rep, why = _recorded(lambda: x + outside, [x])
    assert rep is None and "neither an input" in why


def test_record_replays_plain_tensor_work_on_new_inputs():
    """Allocation, arithmetic into it, an in-place update of an input: the replay on new
    tensors gives what the call gives on them."""

    def call(a, b):
        out = torch.empty_like(a)
        torch.mul(a, 2.0, out=out)
        b.add_(out)
        return out.view(-1)[:3]

    a, b = torch.randn(2, 3), torch.randn(2, 3)
    result, rep, slot_of, why = replay.record(lambda: call(a, b), [a, b])
    assert why is None and rep is not None
    a2, b2 = torch.randn(2, 3), torch.randn(2, 3)
    b2_want = b2 + 2 * a2
    env = rep.run([a2, b2])
    assert torch.equal(b2, b2_want)
    assert torch.equal(env[slot_of(id(result))], (2 * a2).view(-1)[:3])


@pytest.mark.parametrize("case", ["mlstm_exp", "mlstm_sig", "mamba2", "gated_delta_rule_l2norm"])
def test_gate_activations_are_formed_in_the_step_kernel(case):
    """An eager Triton step of mLSTM (log σ of the forget gate; with the sigmoid gate also of
    the input gate, and m_0 joined to the first decay), of Mamba2 (Δ, its decay and
    D·x) and of the gated delta rule with ``use_qk_l2norm`` (q and k normalized) in place is one
    launch of the recurrent kernel and the allocation of o (filled with NaN by the test set-up):
    no gate or normalization operations on the host."""
    fn, args, kwargs, state = _case(case)()
    f, a, kw = _unfold(fn, args, kwargs)
    tensors = [x for x in (*a, *flat_state(state), *kw.values()) if isinstance(x, torch.Tensor)]
    with torch.no_grad(), linrnn.checks(False):
        ORDINARY(f, tuple(a), state, True, kw)  # compiled, caches filled
        _, rep, _, why = replay.record(lambda: ORDINARY(f, tuple(a), state, True, kw), tensors)
    assert rep is not None, why
    names = [getattr(ev.func, "__name__", str(ev.func)) if isinstance(ev, replay._Op)
             else ev.kernel.__name__ for ev in rep.events]  # fmt: skip
    kernel = "delta_recurrent_fwd_kernel" if "delta" in case else "recurrent_fwd_kernel"
    assert names == ["empty_like", "fill_.Scalar", kernel], names
