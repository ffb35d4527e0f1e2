"""The Triton recurrent kernel and the step API: every family against the float64 reference
loop, packed sequences, prefill (chunk) + token-by-token steps ≡ one call, in-place steps.
Without a GPU it runs under TRITON_INTERPRET=1 (set in conftest)."""

from __future__ import annotations

import pytest
import torch
from helpers import FAMILIES, assert_close, flat_state

import linrnn

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ALL = list(FAMILIES)


def _inputs(fam, B, T, H, K, V, dtype=torch.float32):
    return {n: t.to(DEVICE, dtype if t.dim() == 4 else torch.float32)
            for n, t in fam.build(B, T, H, K, V, False).items()}  # fmt: skip


def _state(fam, N, H, K, V):
    st = fam.make_state(N, H, K, V, torch.float32)
    return tuple(s.to(DEVICE) for s in st) if isinstance(st, tuple) else st.to(DEVICE)


def _ref(fam, inputs, h0, **kw):
    d = {n: t.double() for n, t in inputs.items()}
    h = None
    if h0 is not None:
        h = tuple(s.double() for s in h0) if isinstance(h0, tuple) else h0.double()
    return fam.call(d, mode="reference", initial_state=h, output_final_state=True, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("family", ALL)
def test_recurrent_matches_reference(family, dtype):
    fam = FAMILIES[family]
    B, T, H, K, V = 2, 11, 2, 20, 12
    inputs, h0 = _inputs(fam, B, T, H, K, V, dtype), _state(fam, B, H, K, V)
    with torch.no_grad():
        o, st = fam.call(inputs, mode="recurrent", backend="triton", initial_state=h0,
                         output_final_state=True)  # fmt: skip
    o_ref, st_ref = _ref(fam, inputs, h0)
    assert o.dtype == dtype
    assert_close("o", o, o_ref, dtype)
    for j, (a, b) in enumerate(zip(flat_state(st), flat_state(st_ref))):
        assert a.dtype == torch.float32
        assert_close(f"state[{j}]", a, b, dtype)


@pytest.mark.parametrize("family", ["gla_gv", "rwkv6", "mlstm_exp", "linear_attn_norm"])
def test_recurrent_varlen(family):
    """Packed sequences (lengths 1, 0, 7, 3) in one launch equal the reference per sequence."""
    fam = FAMILIES[family]
    lens = [1, 0, 7, 3]
    T, H, K, V = sum(lens), 2, 8, 6
    offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    inputs, h0 = _inputs(fam, 1, T, H, K, V), _state(fam, len(lens), H, K, V)
    with torch.no_grad():
        o, st = fam.call(inputs, mode="recurrent", backend="triton", initial_state=h0,
                         cu_seqlens=offsets, output_final_state=True)  # fmt: skip
    o_ref, st_ref = _ref(fam, inputs, h0, cu_seqlens=offsets)
    assert_close("o", o, o_ref, torch.float32)
    for j, (a, b) in enumerate(zip(flat_state(st), flat_state(st_ref))):
        assert_close(f"state[{j}]", a, b, torch.float32)


@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
@pytest.mark.parametrize("family", ALL)
def test_prefill_then_steps_equal_one_call(family, inplace):
    """Chunked prefill (Triton where it exists) then token-by-token steps equals one call."""
    fam = FAMILIES[family]
    B, T, H, K, V, P = 2, 19, 2, 12, 8, 13
    inputs = _inputs(fam, B, T, H, K, V)
    cut = lambda a, b: {n: (t[:, a:b] if t.dim() >= 3 else t) for n, t in inputs.items()}  # noqa: E731
    with torch.no_grad():
        o_all, st_all = fam.call(inputs, output_final_state=True, backend="torch")
        o_pre, st = fam.call(cut(0, P), output_final_state=True, chunk_size=8)
        outs = [o_pre]
        for t in range(P, T):
            tok = cut(t, t + 1)
            args = [tok[n] for n in fam.tensors[: fam.positional]]
            named = {n: tok[n] for n in fam.tensors[fam.positional :] if n in tok}
            o_t, new = linrnn.step(fam.fn, *args, state=st, inplace=inplace, backend="triton",
                                   **named, **fam.kwargs)  # fmt: skip
            if inplace:
                assert all(a is b for a, b in zip(flat_state(new), flat_state(st)))
            st = new
            outs.append(o_t)
    assert_close("o", torch.cat(outs, dim=1), o_all, torch.float32)
    for j, (a, b) in enumerate(zip(flat_state(st), flat_state(st_all))):
        assert_close(f"state[{j}]", a, b, torch.float32)


def test_forward_in_place_several_value_tiles():
    """recurrent.forward with out_state = the initial state (mLSTM-exp, V = 80: two value
    tiles per head, so the final n and m go through fresh buffers and are copied back): the
    same tensors come back, holding the reference's final state."""
    import torch.nn.functional as F

    from linrnn.engine import recurrent

    fam = FAMILIES["mlstm_exp"]
    B, H, K, V = 2, 1, 16, 80
    inputs = _inputs(fam, B, 3, H, K, V)
    S0, n0, m0 = _state(fam, B, H, K, V)
    ref_state = (S0.clone(), n0.clone(), m0.clone())
    q, k, v, i, f = (inputs[n] for n in ("q", "k", "v", "i", "f"))
    (o, S, n, m), saved = recurrent.forward(
        q, k, v, scale=K**-0.5, g=F.logsigmoid(f), gi=i, stabilize=True, track_n=True,
        normalizer="mlstm", eps=1e-6, S0=S0, n0=n0, m0=m0, out_state=(S0, n0, m0),
    )  # fmt: skip
    assert saved is None and S is S0 and n is n0 and m is m0
    o_ref, st_ref = _ref(fam, inputs, ref_state)
    assert_close("o", o, o_ref, torch.float32)
    for j, (a, b) in enumerate(zip((S, n, m), flat_state(st_ref))):
        assert_close(f"state[{j}]", a, b, torch.float32)


@pytest.mark.parametrize("packed,T", [(False, 5), (False, 1), (True, 11)],
                         ids=["batch", "one-step", "packed"])  # fmt: skip
def test_per_head_decay_read_in_place(packed, T, monkeypatch):
    """Retention's per-head decay, broadcast over B and T, reaches the forward kernel as the
    caller's [H] tensor with token-row stride 0 (no [B, T, H] copy per call); outputs and final
    states equal the reference. With gradients the kernel gets a dense copy (the backward reads
    it per token)."""
    from linrnn.engine import recurrent_kernels

    seen = []
    real = recurrent_kernels.recurrent_fwd_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(**kw):
                seen.append((kw["g"].data_ptr(), kw["s_g"]))
                return real[grid](**kw)

            return launch

    monkeypatch.setattr(recurrent_kernels, "recurrent_fwd_kernel", Spy())
    fam = FAMILIES["retention"]
    B, H, K, V = (1 if packed else 3), 3, 16, 8
    cu = [0, 4, 4, T] if packed else None
    inputs = _inputs(fam, B, T, H, K, V)
    h0 = _state(fam, 3, H, K, V)
    with torch.no_grad():
        o, S = fam.call(inputs, mode="recurrent", backend="triton", initial_state=h0,
                        output_final_state=True, cu_seqlens=cu)  # fmt: skip
    assert seen == [(inputs["log_decay"].data_ptr(), 0)]
    o_ref, S_ref = _ref(fam, inputs, h0, cu_seqlens=cu)
    assert_close("o", o, o_ref, torch.float32)
    assert_close("S", S, S_ref, torch.float32)
    leaf = inputs["log_decay"].clone().requires_grad_()
    fam.call(dict(inputs, log_decay=leaf), mode="recurrent", backend="triton", initial_state=h0,
             cu_seqlens=cu)  # fmt: skip
    assert seen[-1][1] == H and seen[-1][0] != leaf.data_ptr()


def test_family_step_functions_and_errors():
    fam = FAMILIES["mlstm_exp"]
    inputs = _inputs(fam, 1, 1, 2, 8, 8)
    st = _state(fam, 1, 2, 8, 8)
    o1, s1 = linrnn.mlstm_step(*[inputs[n] for n in fam.tensors], state=st)
    o2, s2 = linrnn.step(linrnn.mlstm, *[inputs[n] for n in fam.tensors], state=st)
    assert torch.equal(o1, o2) and all(torch.equal(a, b) for a, b in zip(s1, s2))
    with pytest.raises(TypeError, match="sets 'mode'"):
        linrnn.mlstm_step(*[inputs[n] for n in fam.tensors], state=st, mode="chunk")
    with pytest.raises(ValueError, match="needs a state"):
        linrnn.mlstm_step(*[inputs[n] for n in fam.tensors], state=None)
    with pytest.raises(TypeError, match="fp32 state"):
        linrnn.mlstm_step(*[inputs[n] for n in fam.tensors], inplace=True,
                          state=tuple(s.double() for s in st))  # fmt: skip


def test_recurrent_triton_with_gradients():
    """With gradients needed, backend='triton' runs the Triton backward (the same gradients as
    the PyTorch loop); the PyTorch path still serves backend='torch'."""
    q = torch.randn(1, 4, 1, 8, device=DEVICE, requires_grad=True)
    o, _ = linrnn.linear_attn(q, q, q, mode="recurrent", backend="triton")
    (dq,) = torch.autograd.grad(o.sum(), q)
    o_ref, _ = linrnn.linear_attn(q, q, q, mode="recurrent", backend="torch")
    (dq_ref,) = torch.autograd.grad(o_ref.sum(), q)
    assert_close("dq", dq, dq_ref, torch.float32)


def test_mode_none_rule(monkeypatch):
    """mode=None: the recurrent kernel for short sequences without gradients on the Triton path,
    the chunk engine otherwise (longer sequences, gradients, the PyTorch path)."""
    from linrnn.ops import _generic

    picked = []
    real = _generic.route

    def spy(*args, **kwargs):
        r = real(*args, **kwargs)
        picked.append(r.mode)
        return r

    monkeypatch.setattr(_generic, "route", spy)
    short = torch.randn(1, 64, 1, 8, device=DEVICE)
    long = torch.randn(1, 65, 1, 8, device=DEVICE)
    with torch.no_grad():
        linrnn.linear_attn(short, short, short, backend="triton")
        linrnn.linear_attn(long, long, long, backend="triton")
        linrnn.linear_attn(long, long, long, backend="triton", cu_seqlens=torch.tensor([0, 60, 65]))
        linrnn.linear_attn(short, short, short, backend="torch")
    grad = short.clone().requires_grad_()
    linrnn.linear_attn(grad, grad, grad, backend="triton")
    assert picked == ["recurrent", "chunk", "recurrent", "chunk", "chunk"]


def test_mode_none_fused_rule():
    """mode=None takes fused_chunk where config.FUSED_DEFAULT names it (enough sequence × head
    walkers, head dims of its table, the default chunk size), chunk elsewhere; and the call then
    gives fused_chunk's result bit for bit."""
    from linrnn.engine import config
    from linrnn.ops import _generic

    fewest, dims = config.FUSED_DEFAULT["linear_attn"][False]
    fewest_g, dims_g = config.FUSED_DEFAULT["linear_attn"][True]
    K, V = dims[0]

    def mode(family="linear_attn", N=1, H=fewest, K=K, V=V, grad=False, T=80, **kw):
        q = torch.empty(N, T, H, K, device=DEVICE)
        v = torch.empty(N, T, H, V, device=DEVICE)
        return _generic.route(family, q, v, grad=grad, backend="triton", **kw).mode

    assert mode() == "fused_chunk"
    assert mode(N=2, H=fewest // 2) == "fused_chunk"
    assert mode(H=fewest - 1) == "chunk"  # too few walkers to fill the GPU
    assert mode(K=K + 16, V=V + 16) == "chunk"  # head dims the table does not name
    assert mode(T=64) == "recurrent"  # a short sequence without a gradient
    assert mode(H=fewest_g, K=dims_g[-1][0], V=dims_g[-1][1], grad=True) == "fused_chunk"
    assert mode(H=fewest_g - 1, K=dims_g[-1][0], V=dims_g[-1][1], grad=True) == "chunk"
    assert mode(chunk_size=64) == "chunk"  # a chosen chunk size keeps chunk mode
    sig = "mlstm[sigmoid]" in config.FUSED_DEFAULT and config.default_fused(
        "mlstm[sigmoid]", K, V, fewest, False
    )
    assert mode(family="mlstm") == ("fused_chunk" if sig else "chunk")
    assert mode(family="mlstm", stabilize=True) == "chunk"
    assert mode(family="simple_gla") == "chunk"
    g = torch.empty(1, 80, fewest, K, device=DEVICE)
    assert _generic.route("gla", g, g, g=g, backend="triton").mode == "chunk"
    # packed sequences: the walkers count sequences (each longer than the recurrent kernel's)
    q = torch.empty(1, 160, fewest // 2, K, device=DEVICE)
    packed = lambda offsets: _generic.route("linear_attn", q, q, backend="triton",  # noqa: E731
                                            cu_seqlens=offsets).mode  # fmt: skip
    assert packed([0, 160]) == "chunk"
    assert packed([0, 80, 160]) == "fused_chunk"


def test_mode_none_runs_the_fused_kernels(monkeypatch):
    """A call that mode=None routes to fused_chunk runs it: its outputs and final state equal
    an explicit fused_chunk call's bit for bit."""
    from linrnn.engine import config
    from linrnn.ops import _generic

    fewest, dims = config.FUSED_DEFAULT["linear_attn"][False]
    K, V = dims[0]
    picked, real = [], _generic.route
    monkeypatch.setattr(
        _generic, "route", lambda *a, **kw: picked.append(real(*a, **kw)) or picked[-1]
    )
    q, k, v = (torch.randn(2, 80, fewest // 2, d, device=DEVICE) for d in (K, K, V))
    with torch.no_grad():
        o, S = linrnn.linear_attn(q, k, v, backend="triton", output_final_state=True)
        o_f, S_f = linrnn.linear_attn(q, k, v, backend="triton", mode="fused_chunk",
                                      output_final_state=True)  # fmt: skip
    assert [r.mode for r in picked] == ["fused_chunk", "fused_chunk"]
    assert torch.equal(o, o_f) and torch.equal(S, S_f)


@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mlstm_steps_form_the_forget_gate_in_the_kernel(gate_dtype):
    """mLSTM-exp decode steps without gradients pass the forget gate's pre-activation f to the
    kernel, which forms log σ(f): saturated gates (f = ±1000, ±30) and input gates at ±20 stay
    finite and match the float64 reference of the whole sequence, gates in fp32 or bf16."""
    fam = FAMILIES["mlstm_exp"]
    B, T, H, K, V = 2, 8, 2, 16, 8
    inputs = _inputs(fam, B, T, H, K, V)
    pick = torch.randint(0, 5, (B, T, H))
    table = torch.tensor([-1000.0, -30.0, 30.0, 1000.0])
    f = torch.where(pick < 4, table[pick.clamp_max(3)], torch.randn(B, T, H) * 3)
    inputs["f"] = f.to(gate_dtype).to(DEVICE)
    inputs["i"] = (torch.randint(0, 2, (B, T, H)) * 40.0 - 20.0).to(gate_dtype).to(DEVICE)
    h0 = _state(fam, B, H, K, V)
    o_ref, st_ref = _ref(fam, {n: x.float() for n, x in inputs.items()}, h0)
    state, outs = h0, []
    with torch.no_grad():
        for t in range(T):
            step = [inputs[n][:, t : t + 1] for n in fam.tensors]
            o, state = linrnn.mlstm_step(*step, state=state, backend="triton")
            outs.append(o)
    assert_close("o", torch.cat(outs, 1), o_ref, torch.float32)
    for j, (a, b) in enumerate(zip(state, st_ref)):
        assert_close(f"state[{j}]", a, b, torch.float32)


@pytest.mark.parametrize("lens", [None, [3, 5], [3, 0, 5]], ids=["batch", "packed", "empty"])
def test_mlstm_sigmoid_steps_fold_the_max_state_in_the_kernel(lens):
    """mLSTM-sigmoid recurrent calls without gradients from a state with a max part m_0 (the
    true state C·exp(m_0); m_0 ∈ {−∞, −3, 0, 2}): the kernel forms log σ(f), log σ(i) and joins
    m_0 to each sequence's first decay; the outputs and the true final state match the float64
    reference, and m_T is 0. With an empty packed sequence the op keeps its host form."""
    fam = FAMILIES["mlstm_sig"]
    H, K, V = 2, 16, 8
    B, T = (2, 6) if lens is None else (1, sum(lens))
    N = B if lens is None else len(lens)
    inputs = _inputs(fam, B, T, H, K, V)
    C0, n0, _ = _state(fam, N, H, K, V)
    m0 = torch.tensor([-float("inf"), -3.0, 0.0, 2.0])[torch.randint(0, 4, (N, H))].to(DEVICE)
    h0 = (C0, n0, m0)
    cu = None if lens is None else torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    with torch.no_grad():
        o, (C, n, m) = fam.call(inputs, mode="recurrent", backend="triton", initial_state=h0,
                                output_final_state=True, cu_seqlens=cu)  # fmt: skip
    o_ref, (C_ref, n_ref, m_ref) = _ref(fam, inputs, h0, cu_seqlens=cu)
    assert torch.equal(m, torch.zeros_like(m))
    true = lambda x, mm: x * torch.exp(mm.double())[..., None, None]  # noqa: E731
    assert_close("o", o, o_ref, torch.float32)
    assert_close("C", C.double(), true(C_ref, m_ref), torch.float32)
    assert_close("n", n.double(), true(n_ref[..., None], m_ref)[..., 0], torch.float32)


def test_step_tile_warps():
    """The step tile's warps: a plain walk (the state and scalar per-step terms) gets the
    table's PLAIN_WARPS, any other walk NUM_WARPS, a tile of STATE_ELEMS entries FULL_WARPS
    whatever the walk."""
    from linrnn.engine import recurrent

    t = {"BV_MAX": 64, "STATE_ELEMS": 8192, "NUM_WARPS": 1, "PLAIN_WARPS": 4, "FULL_WARPS": 2}
    assert recurrent.value_tile(64, 64, t, plain=True) == (64, 64, 4)
    assert recurrent.value_tile(64, 64, t) == (64, 64, 1)
    assert recurrent.value_tile(256, 256, t, plain=True) == (256, 32, 2)
    assert recurrent.value_tile(40, 24, dict(t, PLAIN_WARPS=8), plain=True) == (64, 32, 8)
    no_plain = {k: v for k, v in t.items() if k != "PLAIN_WARPS"}
    assert recurrent.value_tile(64, 64, no_plain, plain=True) == (64, 64, 1)
