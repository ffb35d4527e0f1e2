"""ShortConvolution and the delta-rule layers (DeltaNet, Gated DeltaNet).

* ShortConvolution against an explicit loop over taps (fp64, fp32, bf16), with a bias and
  without an activation; prompt + one-token steps ≡ one call; packed sequences (empty ones
  included) ≡ separate calls, forward, cache and gradients; under torch.compile;
* the layers: shapes and gradients reaching every parameter; the cached decode (a prompt, then
  one token at a time, then a few at once) ≡ one call; padding masks (left, right) ≡ the rows
  alone, continuing from the cache; grouped value heads; the initializations;
* the models with both mixers: loss and gradients, greedy generation ≡ the full forward,
  padded prompts, the static-buffer decode step, a training run.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from helpers import assert_close, layer_grads

import linrnn
from linrnn.layers import Cache, DeltaNet, GatedDeltaNet, ShortConvolution
from linrnn.models import CausalLM, LMConfig
from linrnn.reference import delta_recurrent

D = 12


# ------------------------------------------------------------------------------------------
# ShortConvolution


def conv_loop(conv: ShortConvolution, x: torch.Tensor, cache: torch.Tensor | None = None):
    """One sequence ``x [T, D]`` step by step: ``y_t = act(Σ_j w_j x_{t−(W−1)+j} + b)`` with
    the cached inputs ``cache [W−1, D]`` (or zeros) before the start; returns (y, last W−1)."""
    W, width = conv.kernel_size, x.shape[1]
    w = conv.weight[:, 0].to(x.dtype)  # [D, W]
    hist = [x.new_zeros(width) for _ in range(W - 1)]
    if cache is not None:
        hist = list(cache.unbind(0))
    ys = []
    for t in range(x.shape[0]):
        hist.append(x[t])
        acc = sum(w[:, j] * hist[len(hist) - W + j] for j in range(W))
        if conv.bias is not None:
            acc = acc + conv.bias.to(x.dtype)
        ys.append(F.silu(acc) if conv.activation else acc)
    tail = hist[len(hist) - (W - 1) :] if W > 1 else []
    tail = torch.stack(tail) if tail else x.new_zeros(0, width)
    return torch.stack(ys) if ys else x.new_zeros(0, width), tail


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "W,activation,bias", [(4, "silu", False), (3, None, True), (1, "silu", True), (5, "silu", True)]
)
def test_short_conv_matches_loop(W, activation, bias, dtype):
    conv = ShortConvolution(D, W, activation=activation, bias=bias).to(dtype)
    x = torch.randn(3, 11, D, dtype=dtype)
    cache = torch.randn(3, W - 1, D, dtype=dtype)
    for c in (None, cache):
        y, new = conv(x, cache_state=c)
        for b in range(3):
            ref, tail = conv_loop(conv, x[b].double(), None if c is None else c[b].double())
            assert_close(f"y row {b}", y[b], ref, dtype)
            assert torch.equal(new[b].double(), tail)
    assert conv(x, output_final_state=False)[1] is None


@pytest.mark.parametrize("W", [4, 2])
def test_short_conv_prompt_then_steps_equals_one_call(W):
    conv = ShortConvolution(D, W, bias=True).double()
    x = torch.randn(2, 10, D, dtype=torch.float64)
    full, last = conv(x)
    parts, cache = [], None
    # prompts shorter and longer than the kernel, then single steps, then a few at once
    for a, b in [(0, 2), (2, 3), (3, 7), (7, 8), (8, 10)]:
        y, cache = conv(x[:, a:b], cache_state=cache)
        parts.append(y)
    assert_close("steps", torch.cat(parts, 1), full, torch.float64)
    assert torch.equal(cache, last)


def test_short_conv_packed_equals_separate_calls():
    """Packed sequences (an empty one and ones shorter than the kernel included) with and
    without a cache: outputs, new caches and the gradients of x, the cache and the weights."""
    conv = ShortConvolution(D, 4, bias=True).double()
    lengths = [5, 0, 2, 1, 7]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    x = torch.randn(1, cu[-1], D, dtype=torch.float64, requires_grad=True)
    for cache in (None, torch.randn(len(lengths), 3, D, dtype=torch.float64, requires_grad=True)):
        y, new = conv(x, cu_seqlens=cu, cache_state=cache)
        dy, dnew = torch.randn_like(y), torch.randn_like(new)
        leaves = [x, *conv.parameters()] + ([cache] if cache is not None else [])
        got = torch.autograd.grad((y * dy).sum() + (new * dnew).sum(), leaves)
        loss = 0
        for n in range(len(lengths)):
            xs = x[:, cu[n] : cu[n + 1]]
            ys, news = conv(xs, cache_state=None if cache is None else cache[n : n + 1])
            assert_close(f"y seq {n}", y[:, cu[n] : cu[n + 1]], ys, torch.float64)
            assert torch.equal(new[n : n + 1], news), f"cache seq {n}"
            loss = loss + (ys * dy[:, cu[n] : cu[n + 1]]).sum() + (news * dnew[n]).sum()
        ref = torch.autograd.grad(loss, leaves)
        for j, (g, r) in enumerate(zip(got, ref)):
            assert_close(f"grad {j}", g, r, torch.float64)
    # a tensor of offsets works as well
    y2, _ = conv(x, cu_seqlens=torch.tensor(cu))
    assert torch.equal(y2, conv(x, cu_seqlens=cu)[0])


def test_short_conv_compiles():
    conv = ShortConvolution(D, 4, bias=True)
    cnt = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(conv, backend=cnt, fullgraph=True)
    cache = torch.randn(2, 3, D)
    for T in (7, 13):
        x = torch.randn(2, T, D, requires_grad=True)
        torch._dynamo.mark_dynamic(x, 1)
        y, new = compiled(x, cache_state=cache)
        y_ref, new_ref = conv(x, cache_state=cache)
        assert_close("y", y, y_ref, torch.float32)
        assert torch.equal(new, new_ref)
        g = torch.autograd.grad(y.sum(), [x, conv.weight])
        g_ref = torch.autograd.grad(y_ref.sum(), [x, conv.weight])
        for a, b in zip(g, g_ref):
            assert_close("grad", a, b, torch.float32)
    assert cnt.frame_count == 1


def test_short_conv_bad_inputs():
    conv = ShortConvolution(D, 4)
    with pytest.raises(ValueError, match="activation"):
        ShortConvolution(D, 4, activation="relu")
    with pytest.raises(ValueError, match="kernel_size"):
        ShortConvolution(D, 0)
    with pytest.raises(ValueError, match="hidden_size"):
        conv(torch.randn(2, 5, D + 1))
    with pytest.raises(ValueError, match=r"cache_state must have shape \[N, W-1, D\]"):
        conv(torch.randn(2, 5, D), cache_state=torch.zeros(2, 4, D))
    with pytest.raises(ValueError, match="cu_seqlens"):
        conv(torch.randn(1, 5, D), cu_seqlens=[0, 3, 4])
    with pytest.raises(ValueError, match="one packed sequence"):
        conv(torch.randn(2, 5, D), cu_seqlens=[0, 5])


# ------------------------------------------------------------------------------------------
# The layers

LAYERS = {
    "delta_net": lambda **kw: DeltaNet(D, 2, **kw),
    "delta_net_plain": lambda **kw: DeltaNet(D, 3, use_gate=False, conv_bias=True, **kw),
    "gated_delta_net": lambda **kw: GatedDeltaNet(D, 2, **kw),
    # grouped value heads (3 per q/k head), β ∈ [0, 2], K ≠ V
    "gated_delta_net_gva": lambda **kw: GatedDeltaNet(
        D, 2, head_dim=4, expand_v=1.5, num_v_heads=6, allow_neg_eigval=True, conv_size=3, **kw
    ),
}


def make(name: str, dtype=torch.float64, **kw):
    layer = LAYERS[name](**kw).to(dtype)
    if isinstance(layer, GatedDeltaNet):
        # Decays that matter at these lengths: A ∈ [0, 16] with dt ∈ [1e-3, 0.1] makes some
        # heads decay hardly at all, others by up to e^−1.6 per step.
        with torch.no_grad():
            layer.A_log.uniform_(-1.0, 1.0)
    return layer


def layer_reference(layer, x):
    """The layer's math written out, independently of its code: the convolutions as the
    explicit loop, the delta rule as the fp64 step-by-step reference (``x [1, T, D]``)."""
    H, HV, Dk = layer.num_heads, layer.num_v_heads, layer.head_k
    T = x.shape[1]

    def conv(c, z):
        return conv_loop(c, z[0])[0][None]

    q = conv(layer.q_conv, layer.q_proj(x)).view(1, T, H, Dk)
    k = conv(layer.k_conv, layer.k_proj(x)).view(1, T, H, Dk)
    v = conv(layer.v_conv, layer.v_proj(x)).view(1, T, HV, layer.head_v)
    q = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    k = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    beta = torch.sigmoid(layer.b_proj(x)) * (2 if layer.allow_neg_eigval else 1)
    g = None
    if isinstance(layer, GatedDeltaNet):
        z = layer.a_proj(x) + layer.dt_bias
        g = -layer.A_log.exp() * (z.clamp_min(0) + torch.log1p(torch.exp(-z.abs())))
    o, _ = delta_recurrent(q, k, v, beta, scale=Dk**-0.5, g=g)
    o = o / (o.pow(2).mean(-1, keepdim=True) + layer.o_norm.eps).sqrt() * layer.o_norm.weight
    if layer.use_gate:
        o = o * F.silu(layer.g_proj(x)).view(1, T, HV, layer.head_v)
    return layer.o_proj(o.flatten(-2))


@pytest.mark.parametrize("name", LAYERS)
def test_layer_matches_its_math_written_out(name):
    layer = make(name, chunk_size=8)
    x = torch.randn(1, 21, D, dtype=torch.float64)
    with torch.no_grad():
        assert_close(name, layer(x), layer_reference(layer, x), torch.float64)


@pytest.mark.parametrize("name", LAYERS)
def test_forward_backward_reach_every_parameter(name):
    layer = make(name, torch.float32)
    x = torch.randn(2, 19, D, requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 19, D) and y.dtype == torch.float32 and torch.isfinite(y).all()
    (y * torch.randn_like(y)).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for pname, p in layer.named_parameters():
        assert p.grad is not None, f"{name}.{pname}: no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}.{pname}: non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name}.{pname}: zero gradient"


@pytest.mark.parametrize("name", LAYERS)
def test_chunk_mode_matches_reference_mode(name):
    """mode="chunk" (several chunks, a partial last one) against the step-by-step fp64
    reference inside the same layer: output and every gradient."""
    layer = make(name, chunk_size=8)
    x = torch.randn(2, 21, D, dtype=torch.float64, requires_grad=True)
    y_chunk = layer(x)
    g_chunk = layer_grads(layer, x, y_chunk)
    layer.mode = "reference"
    y_ref = layer(x)
    g_ref = layer_grads(layer, x, y_ref)
    assert_close(f"{name} y", y_chunk, y_ref, torch.float64)
    for key in g_ref:
        assert_close(f"{name} d{key}", g_chunk[key], g_ref[key], torch.float64)


@pytest.mark.parametrize("name", LAYERS)
def test_prompt_then_decoding_equals_one_forward(name):
    """A prompt shorter than the convolution, one-token steps, a few tokens at once: the
    outputs are those of one call; the cache holds the state and the three convolutions'."""
    layer = make(name, chunk_size=8)
    x = torch.randn(2, 24, D, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
        cache = Cache()
        parts = [layer(x[:, :2], cache=cache)]
        parts += [layer(x[:, t : t + 1], cache=cache) for t in range(2, 9)]
        parts.append(layer(x[:, 9:], cache=cache))
    entry = cache[layer.layer_idx]
    W1 = layer.q_conv.kernel_size - 1
    assert sorted(entry) == ["conv_k", "conv_q", "conv_v", "state"]
    assert entry["state"].shape == (2, layer.num_v_heads, layer.head_k, layer.head_v)
    assert entry["conv_v"].shape == (2, W1, layer.value_dim)
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
@pytest.mark.parametrize("name", ["delta_net", "gated_delta_net_gva"])
def test_padding_mask_equals_unpadded_rows(name, side):
    """Each row of a padded batch gives what the row alone gives (zeros at the padding); with
    a cache each row continues from its own tokens, also through a second padded call."""
    layer = make(name, chunk_size=8)
    T, lengths = 17, [17, 11, 2, 0]
    rows = [torch.randn(n, D, dtype=torch.float64) for n in lengths]
    x, mask = _padded(rows, T, side)
    more = [torch.randn(n, D, dtype=torch.float64) for n in (1, 3, 0, 2)]
    x2, mask2 = _padded(more, 3, side)
    nxt = torch.randn(len(rows), 1, D, dtype=torch.float64)
    with torch.no_grad():
        cache = Cache()
        y = layer(x, attention_mask=mask, cache=cache)
        y2 = layer(x2, attention_mask=mask2, cache=cache)
        y_next = layer(nxt, cache=cache)
        for b, row in enumerate(rows):
            c = Cache()
            for part, got, m in ((row, y, mask), (more[b], y2, mask2)):
                if len(part):  # an empty row leaves its state as it was
                    alone = layer(part[None], cache=c)
                    assert_close(f"row {b}", got[b][m[b].bool()][None], alone, torch.float64)
            alone_next = layer(nxt[b : b + 1], cache=c)
            assert_close(f"next {b}", y_next[b : b + 1], alone_next, torch.float64)
        assert torch.equal(y[~mask.bool()], torch.zeros_like(y[~mask.bool()]))


def test_padding_gradients_equal_unpadded():
    """Gradients through the packed path equal the unpadded ones (padding gets none)."""
    layer = make("gated_delta_net")
    rows = [torch.randn(n, D, dtype=torch.float64) for n in (9, 5, 2)]
    x, mask = _padded(rows, 9, "left")
    x.requires_grad_()
    (layer(x, attention_mask=mask) ** 2).sum().backward()
    got = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    for b, row in enumerate(rows):
        r = row[None].clone().requires_grad_()
        (layer(r) ** 2).sum().backward()
        assert_close(f"dx row {b}", x.grad[b][mask[b].bool()][None], r.grad, torch.float64)
    for n, p in layer.named_parameters():
        assert_close(f"d{n}", got[n], p.grad, torch.float64)
    assert torch.equal(x.grad[~mask.bool()], torch.zeros_like(x.grad[~mask.bool()]))


def test_shapes_and_initialization():
    torch.manual_seed(0)
    g = GatedDeltaNet(64, 4, num_v_heads=8, layer_idx=3)
    assert (g.head_k, g.head_v, g.key_dim, g.value_dim) == (16, 32, 64, 256)  # expand_v 2
    assert g.q_conv.weight.shape == (64, 1, 4) and g.v_conv.hidden_size == 256
    assert g.o_norm.weight.shape == (32,) and g.b_proj.out_features == 8
    A = g.A_log.exp()
    assert A.shape == (8,) and (A > 0).all() and (A <= 16).all()
    dt = F.softplus(g.dt_bias)
    assert torch.allclose(dt, dt.clamp(1e-3, 0.1), rtol=1e-5)
    d = DeltaNet(64, 4)
    assert (d.head_k, d.head_v, d.use_gate) == (16, 16, True) and not hasattr(d, "A_log")
    assert DeltaNet(64, 4, use_gate=False).g_proj is None
    with pytest.raises(ValueError, match="num_v_heads=6 must be a multiple of num_heads=4"):
        DeltaNet(64, 4, num_v_heads=6)
    with pytest.raises(ValueError, match="d_model=30 must be divisible"):
        DeltaNet(30, 4)
    with pytest.raises(ValueError, match="expand_v"):
        DeltaNet(64, 4, expand_v=0.3)
    with pytest.raises(ValueError, match="dt_min"):
        GatedDeltaNet(64, 4, dt_min=0.0)


def test_bf16_layer_is_close_to_fp64():
    layer = make("gated_delta_net_gva", chunk_size=8)
    x = torch.randn(2, 19, D, dtype=torch.float64)
    with torch.no_grad():
        ref = layer(x)
        low = make("gated_delta_net_gva", torch.bfloat16, chunk_size=8)
        low.load_state_dict(layer.state_dict())
        got = low(x.bfloat16())
    assert got.dtype == torch.bfloat16
    assert_close("bf16", got, ref, torch.bfloat16, factor=2)


# ------------------------------------------------------------------------------------------
# In the model


@pytest.mark.parametrize("mixer", ["delta_net", "gated_delta_net"])
def test_model_decode_graph_fallback_and_padded_generation(mixer):
    """generate() with padded prompts ≡ each prompt alone; the static-buffer decode step (the
    CUDA-graph path, eager here) ≡ generate() and keeps its buffers."""
    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=2,
                              mixer=mixer, chunk_size=4)).double().eval()  # fmt: skip
    lengths, T = [6, 3, 1], 6
    rows = [torch.randint(0, 32, (n,)) for n in lengths]
    ids = torch.full((3, T), 31)
    mask = torch.zeros(3, T, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, T - len(row) :], mask[b, T - len(row) :] = row, 1
    out = model.generate(ids, 5, attention_mask=mask)
    for b, row in enumerate(rows):
        assert torch.equal(out[b, T:], model.generate(row[None], 5)[0, len(row) :]), b

    prompt = torch.randint(0, 32, (2, 5))
    ref = model.generate(prompt, max_new_tokens=6)
    cache = Cache()
    with torch.no_grad():
        first = model(prompt, cache=cache).logits[:, -1].argmax(-1)
    dec = linrnn.graphs.capture_decode(model, cache)
    buffers = [t.data_ptr() for t in linrnn.graphs._tensors(dec.cache.layers)]
    assert len(buffers) == 2 * 4  # per layer: the state and three convolution caches
    gen = dec.generate(first, 6)
    assert torch.equal(torch.cat([prompt, gen], dim=1), ref)
    assert [t.data_ptr() for t in linrnn.graphs._tensors(dec.cache.layers)] == buffers


def test_training_run_with_gated_delta_net(tmp_path):
    from linrnn.train import TrainConfig, train

    cfg = TrainConfig(
        out=str(tmp_path / "run"), mixer="gated_delta_net", steps=4, warmup=1, eval_every=4,
        sample_tokens=4, progress=False, d_model=32, num_layers=1, num_heads=2, seq_len=16,
        batch_size=2, eval_batches=1, plot=False,
    )  # fmt: skip
    history = train(cfg)
    losses = [loss for _, loss in history["train_step_loss"]]
    assert len(losses) == 4 and all(3.0 < x < 7.0 for x in losses)
    model = CausalLM.from_pretrained(tmp_path / "run" / "checkpoint")
    assert model.config.mixer == "gated_delta_net"


# ------------------------------------------------------------------------------------------
# On the Triton kernels (the interpreter without a GPU)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("name", ["delta_net", "gated_delta_net_gva"])
def test_layer_on_triton_matches_fp64(name, mode, backend):
    """fp32 on the Triton kernels (packed sequences native; one-token steps on the recurrent
    kernel) against the fp64 step-by-step reference of the same layer: outputs and every
    gradient, unpadded and padded; a prompt then steps."""
    ref = make(name, mode="reference")
    layer = make(name, torch.float32, backend=backend, mode=mode, chunk_size=16)
    layer.load_state_dict(ref.state_dict())
    layer.to(DEVICE)
    x = torch.randn(2, 21, D, dtype=torch.float64)
    lengths = [21, 12]
    mask = torch.zeros(2, 21, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, 21 - n :] = 1
    for m in (None, mask):
        xr, xl = x.clone().requires_grad_(), x.float().to(DEVICE).requires_grad_()
        y_ref = ref(xr, attention_mask=m)
        y = layer(xl, attention_mask=None if m is None else m.to(DEVICE))
        g_ref, g = layer_grads(ref, xr, y_ref), layer_grads(layer, xl, y)
        assert_close(f"{name} y mask={m is not None}", y.cpu(), y_ref, torch.float32)
        for key in g_ref:
            assert_close(f"{name} d{key}", g[key], g_ref[key], torch.float32)
    with torch.no_grad():
        full = ref(x)
        cache = Cache()
        parts = [layer(x[:, :13].float().to(DEVICE), cache=cache).cpu()]
        parts += [layer(x[:, t : t + 1].float().to(DEVICE), cache=cache).cpu()
                  for t in range(13, 21)]  # fmt: skip
    assert_close(f"{name} decoded", torch.cat(parts, dim=1), full, torch.float32)


@pytest.mark.parametrize("backend", ["triton"])
def test_model_static_decode_on_triton_equals_generate(backend):
    """The static-buffer decode step with the recurrent kernel writing the state in place ≡
    generate() (whose steps copy the state)."""
    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=2,
                              mixer="gated_delta_net", backend=backend)).eval()  # fmt: skip
    model.to(DEVICE)
    prompt = torch.randint(0, 32, (2, 5)).to(DEVICE)
    ref = model.generate(prompt, max_new_tokens=5)
    cache = Cache()
    with torch.no_grad():
        first = model(prompt, cache=cache).logits[:, -1].argmax(-1)
    dec = linrnn.graphs.capture_decode(model, cache)
    buffers = [t.data_ptr() for t in linrnn.graphs._tensors(dec.cache.layers)]
    assert torch.equal(torch.cat([prompt, dec.generate(first, 5)], dim=1), ref)
    assert [t.data_ptr() for t in linrnn.graphs._tensors(dec.cache.layers)] == buffers
