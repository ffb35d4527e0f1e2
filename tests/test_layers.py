"""Layers: shapes and finite gradients, chunk ≡ reference inside the layer (fp64), prompt +
step-by-step decoding ≡ one forward, padding masks (left and right) ≡ the unpadded rows."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close, assert_decay_grad_close, decay_grad_scale

from linrnn.layers import (
    Cache,
    GatedLinearAttention,
    LinearAttention,
    MultiScaleRetention,
    RWKV6TimeMix,
    SimpleGLA,
    SoftmaxAttention,
    mLSTMLayer,
)
from linrnn.layers.common import Packing, token_shift

D, H = 16, 2

LAYERS = {
    "linear_attn_elu": lambda **kw: LinearAttention(D, H, **kw),
    "linear_attn_relu": lambda **kw: LinearAttention(D, H, feature_map="relu", **kw),
    "linear_attn_identity": lambda **kw: LinearAttention(D, H, feature_map="identity", **kw),
    "linear_attn_performer": lambda **kw: LinearAttention(
        D, H, feature_map="performer", num_features=12, **kw
    ),
    "gla": lambda **kw: GatedLinearAttention(D, H, gate_low_rank_dim=4, **kw),
    "simple_gla": lambda **kw: SimpleGLA(D, H, **kw),
    "retention": lambda **kw: MultiScaleRetention(D, H, **kw),
    "rwkv6": lambda **kw: RWKV6TimeMix(
        D, H, mix_low_rank_dim=4, decay_low_rank_dim=8, layer_idx=1, num_layers=3, **kw
    ),
    "mlstm_exp": lambda **kw: mLSTMLayer(D, H, **kw),
    "mlstm_sig": lambda **kw: mLSTMLayer(D, H, input_gate="sigmoid", **kw),
    "softmax": lambda **kw: SoftmaxAttention(D, H, **kw),
}
LINEAR = [name for name in LAYERS if name != "softmax"]


def make(name: str, dtype=torch.float64, **kw):
    layer = LAYERS[name](**kw).to(dtype)
    if name.startswith("mlstm"):
        # Gates that matter: the initialization (weights 0, input bias −10) makes the gates
        # constant, which would hide errors in their data dependence.
        with torch.no_grad():
            for proj in (layer.i_proj, layer.f_proj):
                proj.weight.normal_(0, 0.5)
            layer.i_proj.bias.fill_(0.0)
    return layer


@pytest.mark.parametrize("name", LAYERS)
def test_forward_backward_shapes_and_finite_gradients(name):
    layer = make(name, torch.float32)
    x = torch.randn(2, 19, D, requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 19, D) and y.dtype == torch.float32
    assert torch.isfinite(y).all()
    (y * torch.randn_like(y)).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for pname, p in layer.named_parameters():
        assert p.grad is not None, f"{name}.{pname}: no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}.{pname}: non-finite gradient"


def _grads(layer, x, y):
    gen = torch.Generator().manual_seed(7)
    (y * torch.randn(y.shape, generator=gen, dtype=y.dtype)).sum().backward()
    out = {"x": x.grad.clone()}
    out.update({n: p.grad.clone() for n, p in layer.named_parameters()})
    layer.zero_grad()
    x.grad = None
    return out


@pytest.mark.parametrize("name", LINEAR)
def test_chunk_mode_matches_reference_mode(name):
    """The layer in mode="chunk" (several chunks, a partial last one) against the same layer
    calling the step-by-step fp64 reference: output and every gradient."""
    layer = make(name, chunk_size=8)
    x = torch.randn(2, 21, D, dtype=torch.float64, requires_grad=True)
    y_chunk = layer(x)
    g_chunk = _grads(layer, x, y_chunk)
    layer.mode = "reference"
    y_ref = layer(x)
    g_ref = _grads(layer, x, y_ref)
    assert_close(f"{name} y", y_chunk, y_ref, torch.float64)
    for key in g_ref:
        assert_close(f"{name} d{key}", g_chunk[key], g_ref[key], torch.float64)


@pytest.mark.parametrize("name", LAYERS)
def test_prompt_then_decoding_equals_one_forward(name):
    """A prompt with a cache, one-token steps, then a few tokens at once: the outputs are
    those of one call over the whole sequence."""
    layer = make(name, chunk_size=8) if name != "softmax" else make(name)
    x = torch.randn(2, 24, D, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
        cache = Cache()
        parts = [layer(x[:, :13], cache=cache)]
        parts += [layer(x[:, t : t + 1], cache=cache) for t in range(13, 19)]
        parts.append(layer(x[:, 19:], cache=cache))
    assert len(cache) == 1 and cache[layer.layer_idx]
    assert_close(f"{name} decoded", torch.cat(parts, dim=1), full, torch.float64)


def _padded(x_rows, T, side):
    """Rows of different lengths → a padded batch and its mask (garbage in the padding)."""
    B = len(x_rows)
    x = torch.randn(B, T, D, dtype=torch.float64) * 100
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, row in enumerate(x_rows):
        n = row.shape[0]
        sl = slice(T - n, T) if side == "left" else slice(0, n)
        x[b, sl] = row
        mask[b, sl] = 1
    return x, mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", LAYERS)
def test_padding_mask_equals_unpadded_rows(name, side):
    """Each row of a padded batch gives what the row alone gives (zeros at the padding), and
    with a cache each row continues from its own tokens."""
    layer = make(name)
    T, lengths = 17, [17, 11, 1]
    rows = [torch.randn(n, D, dtype=torch.float64) for n in lengths]
    x, mask = _padded(rows, T, side)
    nxt = torch.randn(len(rows), 1, D, dtype=torch.float64)
    with torch.no_grad():
        cache = Cache()
        y = layer(x, attention_mask=mask, cache=cache)
        y_next = layer(nxt, cache=cache)
        for b, row in enumerate(rows):
            c = Cache()
            alone = layer(row[None], cache=c)
            alone_next = layer(nxt[b : b + 1], cache=c)
            got = y[b][mask[b].bool()]
            assert_close(f"{name} {side} row {b}", got[None], alone, torch.float64)
            assert_close(f"{name} {side} next {b}", y_next[b : b + 1], alone_next, torch.float64)
        assert torch.equal(y[~mask.bool()], torch.zeros_like(y[~mask.bool()]))


@pytest.mark.parametrize("name", ["gla", "rwkv6", "mlstm_exp"])
def test_padding_gradients_equal_unpadded(name):
    """Gradients through the packed path equal the unpadded ones (padding gets none)."""
    layer = make(name)
    rows = [torch.randn(n, D, dtype=torch.float64) for n in (9, 5)]
    x, mask = _padded(rows, 9, "left")
    x.requires_grad_()
    y = layer(x, attention_mask=mask)
    (y * y).sum().backward()
    for b, row in enumerate(rows):
        r = row[None].clone().requires_grad_()
        (layer(r) ** 2).sum().backward()
        assert_close(f"{name} dx row {b}", x.grad[b][mask[b].bool()][None], r.grad, torch.float64)
    assert torch.equal(x.grad[~mask.bool()], torch.zeros_like(x.grad[~mask.bool()]))


def test_token_shift_restarts_at_sequence_starts():
    x = torch.arange(1.0, 8.0).view(1, 7, 1)
    cu = [0, 3, 3, 7]  # an empty middle sequence
    assert token_shift(x, cu, None).flatten().tolist() == [0, 1, 2, 0, 4, 5, 6]
    prev = torch.tensor([[10.0], [20.0], [30.0]])
    assert token_shift(x, cu, prev).flatten().tolist() == [10, 1, 2, 30, 4, 5, 6]
    assert token_shift(x, None, prev[:1]).flatten().tolist() == [10, 1, 2, 3, 4, 5, 6]


def test_all_ones_mask_packs_nothing_and_bad_mask_raises():
    assert Packing.from_mask(torch.ones(2, 5), 2, 5) is None
    layer = make("gla")
    with pytest.raises(ValueError, match="attention_mask"):
        layer(torch.randn(2, 5, D, dtype=torch.float64), attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"\[B, T, D\]"):
        layer(torch.randn(5, D, dtype=torch.float64))


def test_initializations_follow_the_papers():
    m = mLSTMLayer(32, 4)
    assert torch.equal(m.i_proj.bias, torch.full((4,), -10.0))
    assert torch.allclose(m.f_proj.bias, torch.tensor([3.0, 4.0, 5.0, 6.0]))
    assert m.q_proj.out_features == 16 and m.v_proj.out_features == 32  # qk_dim_factor 0.5
    r = MultiScaleRetention(32, 4)
    assert torch.allclose(r.log_decay.exp(), 1 - 2.0 ** (-5.0 - torch.arange(4.0)))
    g = GatedLinearAttention(32, 4)
    assert (g.key_dim, g.value_dim, g.gate_logit_normalizer) == (16, 32, 16.0)
    w = RWKV6TimeMix(32, 4, layer_idx=0, num_layers=2)
    assert -6.0 <= w.decay.min() and w.decay.max() <= -1.0  # w = −exp(decay) ∈ [−e^−1, −e^−6]
    # The performer projection is a fixed, seeded buffer (saved with the weights).
    a, b = (
        LinearAttention(32, 4, feature_map="performer"),
        LinearAttention(32, 4, feature_map="performer"),
    )
    assert torch.equal(a.projection, b.projection) and "projection" in a.state_dict()


def test_mlstm_gate_soft_cap():
    m = make("mlstm_exp")
    with torch.no_grad():
        m.i_proj.bias.fill_(1e4)  # capped at 15: still finite and differentiable
    x = torch.randn(1, 6, D, dtype=torch.float64, requires_grad=True)
    y = m(x)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", LAYERS)
def test_fla_argument_names_and_unknown_keywords(name):
    """fla's hidden_size is d_model; an unknown keyword is a TypeError that names it."""
    cls = type(LAYERS[name]())
    kwargs = {"feature_map": "relu"} if name == "linear_attn_relu" else {}
    torch.manual_seed(0)
    a = cls(hidden_size=D, num_heads=H, **kwargs)
    torch.manual_seed(0)
    b = cls(D, H, **kwargs)
    assert a.d_model == D and all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with pytest.raises(TypeError, match="no_such_option"):
        cls(D, H, no_such_option=1)
    with pytest.raises(TypeError, match="hidden_size=8"):
        cls(D, H, hidden_size=8)


def test_grouped_query_softmax_attention():
    """num_kv_heads (fla's name): query head h reads key/value head h // (H / num_kv_heads),
    as the same layer with those key/value heads repeated."""
    gqa = SoftmaxAttention(D, 4, num_kv_heads=2).double()
    full = SoftmaxAttention(D, 4).double()
    hd = D // 4
    with torch.no_grad():
        q, k, v = gqa.qkv_proj.weight.split([D, 2 * hd, 2 * hd])
        rep = [t.view(2, hd, D).repeat_interleave(2, 0).reshape(4 * hd, D) for t in (k, v)]
        full.qkv_proj.weight.copy_(torch.cat([q, *rep]))
        full.o_proj.weight.copy_(gqa.o_proj.weight)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    assert_close("gqa", gqa(x), full(x), torch.float64)
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
        SoftmaxAttention(D, 4, num_kv_heads=3)


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("name", ["gla", "simple_gla", "retention", "rwkv6", "mlstm_exp"])
def test_layer_on_triton_matches_fp64(name, backend, monkeypatch):
    """fp32 on the Triton kernels (the op and the fused output norm and gate; the interpreter
    without a GPU) against the fp64 reference layer: the output and every gradient, within the
    fp32 tolerance or twice the error of the fp32 reference layer on the same inputs (mLSTM-exp's
    q/k gradients are that ill-conditioned on some draws). mLSTM's per-head gate biases sum
    their gate gradients over every token, and the kernels form those from the identity of
    DESIGN §6.5, whose fp32 error is absolute (the reference's autograd has no such term): they
    are held to ``u·Σ_t (‖q_t‖‖dq_t‖ + ‖k_t‖‖dk_t‖)`` per head on top of the relative
    tolerance."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref = make(name, mode="reference")
    layer = make(name, torch.float32, backend=backend, chunk_size=16)
    layer.load_state_dict(ref.state_dict())
    with torch.no_grad():  # norm weights and biases away from their 1/0 initialization
        for p in (ref.norm.weight, ref.norm.bias):
            if p is not None:
                p.add_(0.3 * torch.randn_like(p))
    layer.load_state_dict(ref.state_dict())
    layer.to(device)
    x = torch.randn(2, 21, D, dtype=torch.float64)
    dy = torch.randn(2, 21, D, dtype=torch.float64)
    xr, xl = x.clone().requires_grad_(), x.float().to(device).requires_grad_()
    op_inputs = {}
    if name.startswith("mlstm"):
        import linrnn.layers.mlstm as module

        def spy(q, k, *args, **kwargs):
            for key, t in (("q", q), ("k", k)):
                t.retain_grad()
                op_inputs[key] = t
            return mlstm(q, k, *args, **kwargs)

        mlstm = module.mlstm
        monkeypatch.setattr(module, "mlstm", spy)
    y_ref = ref(xr)
    monkeypatch.undo()
    y = layer(xl)
    (y_ref * dy).sum().backward()
    (y * dy.float().to(device)).sum().backward()
    ref32 = make(name, torch.float32, mode="reference", backend="torch")
    ref32.load_state_dict(ref.state_dict())
    x32 = x.float().requires_grad_()
    y32 = ref32(x32)
    (y32 * dy.float()).sum().backward()
    assert_close(f"{name} y", y.cpu(), y_ref, torch.float32, same_dtype_ref=y32.detach())
    assert_close(f"{name} dx", xl.grad.cpu(), xr.grad, torch.float32, same_dtype_ref=x32.grad)
    params, params32 = dict(layer.named_parameters()), dict(ref32.named_parameters())
    for key, p in ref.named_parameters():
        if key in ("i_proj.bias", "f_proj.bias"):
            q, k = op_inputs["q"], op_inputs["k"]
            scale = decay_grad_scale(q, q.grad, k, k.grad, q.shape[2]).sum(0)  # [H]
            assert_decay_grad_close(f"{name} d{key}", params[key].grad.cpu(), p.grad, scale,
                                    torch.float32, factor=1.0)  # fmt: skip
        else:
            assert_close(f"{name} d{key}", params[key].grad.cpu(), p.grad, torch.float32,
                         same_dtype_ref=params32[key].grad)  # fmt: skip


@pytest.mark.parametrize("name", LAYERS)
def test_garbage_in_padding_stays_there(name):
    """NaN and inf at padded positions change nothing: the valid rows equal a call with zeros
    there, bitwise, and the padded outputs are zeros."""
    layer = make(name, torch.float32)
    x = torch.randn(2, 7, D)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, 4:], mask[1, :2] = 0, 0  # right and left padding
    dirty = x.clone()
    dirty[0, 5], dirty[1, 0] = float("nan"), float("inf")
    clean = torch.where(mask[..., None].bool(), x, 0.0)
    y, y_clean = layer(dirty, attention_mask=mask), layer(clean, attention_mask=mask)
    assert torch.equal(y, y_clean)
    assert not y[mask == 0].any()


@pytest.mark.parametrize("name", LAYERS)
def test_all_padding_gives_zeros_and_keeps_the_cache(name):
    """A batch of padding only (garbage included): zero outputs and gradients, and a cache
    entry left as it was, so the next call continues as if the empty one had not happened."""
    layer = make(name, torch.float32)
    x = torch.randn(2, 6, D)
    x[0, 2] = float("nan")
    x.requires_grad_()
    y = layer(x, attention_mask=torch.zeros(2, 6, dtype=torch.long))
    assert torch.equal(y, torch.zeros_like(y))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    z = torch.randn(2, 5, D)
    with torch.no_grad():
        cache, ref = Cache(), Cache()
        layer(z[:, :3], cache=cache), layer(z[:, :3], cache=ref)
        layer(x.detach(), attention_mask=torch.zeros(2, 6, dtype=torch.long), cache=cache)
        assert_close(name, layer(z[:, 3:], cache=cache), layer(z[:, 3:], cache=ref),
                     torch.float32)  # fmt: skip


# --- one matrix product for a layer's input projections under autocast ----------------------

FUSED = {  # layer: its projections of x that project() multiplies as one
    "linear_attn_elu": ("q_proj", "k_proj", "v_proj"),
    "simple_gla": ("q_proj", "k_proj", "v_proj", "g_proj"),
    "gla": ("q_proj", "k_proj", "v_proj", "g_proj"),
    "retention": ("q_proj", "k_proj", "v_proj", "g_proj"),
    "mlstm_exp": ("q_proj", "k_proj", "v_proj", "i_proj", "f_proj", "og_proj"),
}


def test_project_is_the_separate_projections():
    """project() under bf16 autocast against each nn.Linear called alone (the same autocast):
    the outputs, the weights' and biases' gradients and the input's (summed in one product
    instead of in fp32 afterwards), within bf16's tolerance. Each output is a contiguous
    tensor of its own (no copy before a kernel), all from one autograd node (one backward
    product, not one per output); an output left without a gradient counts as zeros."""
    from linrnn.layers.common import project

    mods = [torch.nn.Linear(24, n, bias=b) for n, b in ((16, False), (3, True), (8, False))]
    x = torch.randn(2, 7, 24, requires_grad=True)
    dys = [torch.randn(2, 7, m.out_features) for m in mods]
    results = []
    for fused in (True, False):
        for m in mods:
            m.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ys = project(x, *mods) if fused else [m(x) for m in mods]
        assert [y.dtype for y in ys] == [torch.bfloat16] * 3
        assert [y.shape[-1] for y in ys] == [16, 3, 8]
        if fused:
            assert all(y.is_contiguous() for y in ys)
            assert len({y.untyped_storage().data_ptr() for y in ys}) == 3
            assert len({id(y.grad_fn) for y in ys}) == 1
            assert "Projections" in ys[0].grad_fn.name()
        torch.autograd.backward(ys, dys)
        grads = [p.grad.clone() for m in mods for p in m.parameters()]
        results.append(([y.float() for y in ys], grads, x.grad.clone()))
    (ys, grads, dx), (ys0, grads0, dx0) = results
    for i, (a, b) in enumerate(zip([*ys, *grads, dx], [*ys0, *grads0, dx0])):
        assert_close(f"project {i}", a, b, torch.bfloat16)
    with torch.no_grad():  # without autocast: each projection alone, exactly
        assert all(torch.equal(a, m(x)) for a, m in zip(project(x, *mods), mods))


def _delta_layer(gated: bool, use_gate: bool):
    from linrnn.layers import DeltaNet, GatedDeltaNet

    cls = GatedDeltaNet if gated else DeltaNet
    return cls(D, 2, use_gate=use_gate, backend="torch")


FUSED_DELTA = {
    "delta_net": (False, False, ("q_proj", "k_proj", "v_proj", "b_proj")),
    "delta_net_gate": (False, True, ("q_proj", "k_proj", "v_proj", "b_proj", "g_proj")),
    "gated_delta_net": (True, True, ("q_proj", "k_proj", "v_proj", "b_proj", "g_proj")),
}


@pytest.mark.parametrize("name", [*FUSED, *FUSED_DELTA])
def test_layer_projections_take_one_product_under_autocast(name):
    """Under CPU bf16 autocast a layer's input projections run as one product (none of their
    own forwards is called) and give what the separate projections give (forced by a forward
    hook on one of them, which then sees its own call)."""
    if name in FUSED:
        layer, names = make(name, torch.float32, backend="torch"), FUSED[name]
    else:
        gated, use_gate, names = FUSED_DELTA[name]
        layer = _delta_layer(gated, use_gate)
    calls = []
    for n in names:
        m = getattr(layer, n)
        m.forward = lambda x, m=m, n=n: calls.append(n) or torch.nn.Linear.forward(m, x)
    x = torch.randn(2, 12, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert calls == []
    seen = []
    getattr(layer, names[0]).register_forward_hook(lambda *a: seen.append(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y0 = layer(x)
    assert seen == [1] and calls == list(names)
    assert_close(name, y.float(), y0.float(), torch.bfloat16)


def test_project_outputs_without_gradients():
    """Outputs the loss does not use (no gradient reaches them) count as zeros in project()'s
    backward: the input's gradient and the used projections' weight gradients match the
    separate projections', and an unused projection's weight gradient is zero."""
    from linrnn.layers.common import project

    mods = [torch.nn.Linear(24, n, bias=True) for n in (16, 3, 8)]
    x = torch.randn(2, 7, 24, requires_grad=True)
    dy = torch.randn(2, 7, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ys = project(x, *mods)
    (ys[2].float() * dy).sum().backward()
    got = [x.grad.clone()] + [p.grad.clone() for m in mods for p in m.parameters()]
    x.grad = None
    for m in mods:
        m.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = [m(x) for m in mods]
    (ref[2].float() * dy).sum().backward()
    want = [x.grad] + [torch.zeros_like(p) if p.grad is None else p.grad
                       for m in mods for p in m.parameters()]  # fmt: skip
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(f"grad {i}", a, b, torch.bfloat16)
    assert not got[1].any() and not got[3].any()  # the unused projections' weights


def test_project_padding_under_inference_then_training():
    """The padded rows are made once: first under inference mode (generation), then in a
    training step with gradients, the fused product still gives the separate projections."""
    from linrnn.layers.common import project

    mods = [torch.nn.Linear(24, n, bias=True) for n in (16, 3)]
    x = torch.randn(2, 5, 24)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        first = project(x, *mods)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ys = project(x, *mods)
        ref = [m(x) for m in mods]
    sum(y.float().sum() for y in ys).backward()
    assert all(m.weight.grad is not None and m.bias.grad is not None for m in mods)
    for a, b, c in zip(ys, ref, first):
        assert_close("project", a.float(), b.float(), torch.bfloat16)
        assert torch.equal(a, c)


def test_project_padding_compiles_without_warnings():
    """Under torch.compile (fullgraph, bf16 autocast) the padded product traces without the
    warning dynamo gives for a cached call, and matches eager."""
    import warnings

    from linrnn.layers.common import project

    mods = [torch.nn.Linear(24, n, bias=False) for n in (16, 3)]
    x = torch.randn(2, 5, 24)
    fn = torch.compile(lambda x: project(x, *mods), fullgraph=True)
    with warnings.catch_warnings(record=True) as seen, torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("always")
        ys = fn(x)
        ref = project(x, *mods)
    assert not [w for w in seen if "lru_cache" in str(w.message)], [str(w.message) for w in seen]
    for a, b in zip(ys, ref):
        assert torch.equal(a, b)


def test_default_mode_is_the_ops_choice(monkeypatch):
    """Layers default to mode=None (the op's measured choice) and pass their chunk size with
    it; None and "chunk" turn a single-token call into a recurrent step (a decode step keeps
    the op form it had), and a mode without chunks gets no chunk size."""
    from linrnn.ops import linear_attn as real

    calls = []

    def spy(*args, **kwargs):
        calls.append({k: kwargs.get(k) for k in ("mode", "chunk_size")})
        return real(*args, **kwargs)

    monkeypatch.setattr("linrnn.layers.linear_attention.linear_attn", spy)
    layer = LinearAttention(D, H)
    assert layer.mode is None and MultiScaleRetention(D, H).mode is None
    x = torch.randn(1, 5, D)
    for mode, chunk_size, T, want in (
        (None, 16, 5, {"mode": None, "chunk_size": 16}),
        (None, 16, 1, {"mode": "recurrent", "chunk_size": None}),
        ("chunk", 16, 1, {"mode": "recurrent", "chunk_size": None}),
        ("chunk", 16, 5, {"mode": "chunk", "chunk_size": 16}),
        ("recurrent", 16, 5, {"mode": "recurrent", "chunk_size": None}),
    ):
        layer.mode, layer.chunk_size = mode, chunk_size
        layer(x[:, :T])
        assert calls[-1] == want, (mode, T)
