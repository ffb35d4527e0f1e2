"""The Mamba2 layer (linrnn.layers.Mamba2) and the ``"mamba2"`` mixer of linrnn.models:

* the layer against its math written out (explicit convolution loop, the fp64 SSD loop, the
  gated group RMSNorm); chunk mode against the step-by-step reference inside the layer (output
  and every parameter's gradient); gradients reach every parameter;
* the cached decode (a prompt, one-token steps, a few tokens at once) ≡ one call; padding
  masks ≡ the rows alone, continuing from the cache; the initialization; bf16;
* the model: greedy generation with padded prompts, the static-buffer (CUDA-graph) decode
  step ≡ generate(), a training run; and on the Triton kernels (interpreter tier) the layer
  against fp64 and the in-place static decode.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, layer_grads

import linrnn
from linrnn.layers import Cache, Mamba2
from linrnn.models import CausalLM, LMConfig
from linrnn.reference.mamba2 import mamba2_recurrent

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton tests' device

D = 12
LAYERS = {
    "mamba2": lambda **kw: Mamba2(D, 2, state_size=8, **kw),
    # groups (2 heads per group), no conv bias, 3 taps, expand 1
    "mamba2_groups": lambda **kw: Mamba2(
        D, 4, expand=1, state_size=6, n_groups=2, conv_size=3, conv_bias=False, **kw
    ),
    # a skip weight per channel (mamba_ssm's D_has_hdim)
    "mamba2_d_per_channel": lambda **kw: Mamba2(D, 2, state_size=8, D_has_hdim=True, **kw),
}


def make(name: str, dtype=torch.float64, **kw):
    layer = LAYERS[name](**kw).to(dtype)
    with torch.no_grad():  # steps that matter at these lengths: Δ ~ 0.1..2
        layer.dt_bias.uniform_(-2.0, 1.0)
        layer.D.normal_()
        layer.norm.weight.normal_(1.0, 0.2)
    return layer


def conv_loop(conv, x):
    """``x [B, T, C]`` through the causal depthwise convolution tap by tap, then SiLU."""
    W, T = conv.kernel_size, x.shape[1]
    w = conv.weight[:, 0]  # [C, W]
    y = torch.zeros_like(x)
    for t in range(T):
        for j in range(W):
            s = t - (W - 1) + j
            if s >= 0:
                y[:, t] += w[:, j] * x[:, s]
    if conv.bias is not None:
        y = y + conv.bias
    return F.silu(y)


def layer_reference(layer, x):
    """The layer's math written out, independently of its code (``x [B, T, D]``, fp64)."""
    Bsz, T, _ = x.shape
    H, P, G, N = layer.num_heads, layer.head_dim, layer.n_groups, layer.state_size
    proj = layer.in_proj(x)
    z, xBC, dt = proj[..., : layer.d_inner], proj[..., layer.d_inner : -H], proj[..., -H:]
    xBC = conv_loop(layer.conv1d, xBC)
    xs, B, C = xBC[..., : H * P], xBC[..., H * P : H * P + G * N], xBC[..., H * P + G * N :]
    y, _ = mamba2_recurrent(
        xs.reshape(Bsz, T, H, P), dt, -layer.A_log.exp(), B.reshape(Bsz, T, G, N),
        C.reshape(Bsz, T, G, N), D=layer.D.reshape(H, -1) if layer.D.numel() > H else layer.D,
        dt_bias=layer.dt_bias, dt_softplus=True,
    )  # fmt: skip
    h = (y.reshape(Bsz, T, H * P) * F.silu(z)).reshape(Bsz, T, G, -1)
    h = h / (h.pow(2).mean(-1, keepdim=True) + layer.norm.eps).sqrt()
    return layer.out_proj(h.reshape(Bsz, T, -1) * layer.norm.weight)


@pytest.mark.parametrize("name", LAYERS)
def test_layer_matches_its_math_written_out(name):
    layer = make(name, chunk_size=8)
    x = torch.randn(2, 21, D, dtype=torch.float64)
    with torch.no_grad():
        assert_close(name, layer(x), layer_reference(layer, x), torch.float64)


def test_fp64_layer_keeps_fp64_decays():
    """No skip term and slow decays (A in [0.37, 1], Δ ~ 0.7..1.3), where the output rests on
    the decays: A = −exp(A_log) rounded to fp32 alone would cost ~1e-8 here."""
    layer = make("mamba2_groups", chunk_size=8)
    with torch.no_grad():
        layer.D.zero_()
        layer.A_log.uniform_(-1.0, 0.0)
        layer.dt_bias.uniform_(0.0, 1.0)
    x = torch.randn(2, 21, D, dtype=torch.float64)
    with torch.no_grad():
        assert_close("slow decays", layer(x), layer_reference(layer, x), torch.float64)


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
    outputs are those of one call; the cache holds the SSD state and the convolution's."""
    layer = make(name, chunk_size=8)
    x = torch.randn(2, 24, D, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
        cache = Cache()
        parts = [layer(x[:, :2], cache=cache)]
        parts += [layer(x[:, t : t + 1], cache=cache) for t in range(2, 9)]
        parts.append(layer(x[:, 9:], cache=cache))
    entry = cache[layer.layer_idx]
    assert sorted(entry) == ["conv", "state"]
    H, P, N = layer.num_heads, layer.head_dim, layer.state_size
    assert entry["state"].shape == (2, H, N, P)
    assert entry["conv"].shape == (2, layer.conv1d.kernel_size - 1, layer.conv_dim)
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
def test_padding_mask_equals_unpadded_rows(side):
    """Each row of a padded batch gives what the row alone gives (zeros at the padding); with
    a cache each row continues from its own tokens, also through a second padded call."""
    layer = make("mamba2_groups", chunk_size=8)
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


def test_shapes_and_initialization():
    torch.manual_seed(0)
    m = Mamba2(64, 8, n_groups=2, layer_idx=3)
    assert (m.d_inner, m.head_dim, m.state_size, m.conv_dim) == (128, 16, 128, 128 + 2 * 2 * 128)
    assert m.in_proj.out_features == 2 * 128 + 2 * 2 * 128 + 8
    assert m.conv1d.weight.shape == (m.conv_dim, 1, 4) and m.conv1d.bias is not None
    assert m.out_proj.in_features == 128 and m.norm.weight.shape == (128,)
    A = m.A_log.exp()
    assert A.shape == (8,) and (A >= 1).all() and (A <= 16).all()
    dt = F.softplus(m.dt_bias)
    assert torch.allclose(dt, dt.clamp(1e-3, 0.1), rtol=1e-5)
    assert torch.equal(m.D, torch.ones(8)) and torch.equal(m.norm.weight, torch.ones(128))
    with pytest.raises(ValueError, match="num_heads=8 must be a multiple of n_groups=3"):
        Mamba2(64, 8, n_groups=3)
    with pytest.raises(ValueError, match="must be divisible by num_heads=5"):
        Mamba2(64, 5)
    with pytest.raises(ValueError, match="dt_min"):
        Mamba2(64, 8, dt_min=0.0)


def test_bf16_layer_is_close_to_fp64():
    layer = make("mamba2_groups", chunk_size=8)
    x = torch.randn(2, 19, D, dtype=torch.float64)
    with torch.no_grad():
        ref = layer(x)
        low = make("mamba2_groups", torch.bfloat16, chunk_size=8)
        low.load_state_dict(layer.state_dict())
        got = low(x.bfloat16())
    assert got.dtype == torch.bfloat16
    assert_close("bf16", got, ref, torch.bfloat16, factor=2)


# ------------------------------------------------------------------------------------------
# In the model


def _model(**kw):
    torch.manual_seed(0)
    return CausalLM(LMConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=2,
                             mixer="mamba2", mixer_kwargs={"state_size": 8}, **kw))  # fmt: skip


def test_model_decode_graph_fallback_and_padded_generation():
    """generate() with padded prompts ≡ each prompt alone; the static-buffer decode step (the
    CUDA-graph path, eager here) ≡ generate() and keeps its buffers."""
    model = _model(chunk_size=4).double().eval()
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
    assert len(buffers) == 2 * 2  # per layer: the state and the convolution cache
    gen = dec.generate(first, 6)
    assert torch.equal(torch.cat([prompt, gen], dim=1), ref)
    assert [t.data_ptr() for t in linrnn.graphs._tensors(dec.cache.layers)] == buffers


def test_training_run_with_mamba2(tmp_path):
    from linrnn.train import TrainConfig, train

    cfg = TrainConfig(
        out=str(tmp_path / "run"), mixer="mamba2", mixer_kwargs={"state_size": 16}, steps=4,
        warmup=1, eval_every=4, sample_tokens=4, progress=False, d_model=32, num_layers=1,
        num_heads=2, seq_len=16, batch_size=2, eval_batches=1, plot=False,
    )  # fmt: skip
    history = train(cfg)
    losses = [loss for _, loss in history["train_step_loss"]]
    assert len(losses) == 4 and all(3.0 < x < 7.0 for x in losses)
    model = CausalLM.from_pretrained(tmp_path / "run" / "checkpoint")
    assert model.config.mixer == "mamba2" and isinstance(model.blocks[0].mixer, Mamba2)


# ------------------------------------------------------------------------------------------
# On the Triton kernels (the interpreter without a GPU)


# Per-head sums of the kernels' gate gradients: the engine forms the log-decay gradient by an
# identity whose fp32 rounding scales with its summed terms, not with these sums (their error
# reaches ~1e-4 of their size here); tests/test_mamba2_ops.py::test_triton_modes holds dA and
# d(dt_bias) to that identity's bound, and the layer's chain rule to them (A_log, dt_bias) is
# the PyTorch path's, checked exactly by test_chunk_mode_matches_reference_mode.
HEAD_SUMS = ("A_log", "dt_bias")


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_layer_on_triton_matches_fp64(mode, backend):
    """fp32 on the Triton kernels (packed sequences native; one-token steps on the recurrent
    kernel) against the fp64 step-by-step reference of the same layer: outputs and every
    gradient, unpadded and padded; a prompt then steps."""
    name = "mamba2_groups"
    ref = make(name, mode="reference")
    layer = make(name, torch.float32, backend=backend, mode=mode, chunk_size=16)
    layer.load_state_dict(ref.state_dict())
    layer.to(DEVICE)
    x = torch.randn(2, 21, D, dtype=torch.float64)
    mask = torch.zeros(2, 21, dtype=torch.long)
    for b, n in enumerate([21, 12]):
        mask[b, 21 - n :] = 1
    for m in (None, mask):
        xr, xl = x.clone().requires_grad_(), x.float().to(DEVICE).requires_grad_()
        y_ref = ref(xr, attention_mask=m)
        y = layer(xl, attention_mask=None if m is None else m.to(DEVICE))
        g_ref, g = layer_grads(ref, xr, y_ref), layer_grads(layer, xl, y)
        assert_close(f"{name} y mask={m is not None}", y.cpu(), y_ref, torch.float32)
        for key in g_ref:
            if key in HEAD_SUMS:
                continue
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
    model = _model(backend=backend).eval().to(DEVICE)
    prompt = torch.randint(0, 32, (2, 5)).to(DEVICE)
    ref = model.generate(prompt, max_new_tokens=5)
    cache = Cache()
    with torch.no_grad():
        first = model(prompt, cache=cache).logits[:, -1].argmax(-1)
    dec = linrnn.graphs.capture_decode(model, cache)
    buffers = [t.data_ptr() for t in linrnn.graphs._tensors(dec.cache.layers)]
    assert torch.equal(torch.cat([prompt, dec.generate(first, 5)], dim=1), ref)
    assert [t.data_ptr() for t in linrnn.graphs._tensors(dec.cache.layers)] == buffers
