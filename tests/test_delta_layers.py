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
from helpers import assert_close

from linrnn.layers import ShortConvolution

D = 12


# ------------------------------------------------------------------------------------------
# ShortConvolution


def conv_loop(conv: ShortConvolution, x: torch.Tensor, cache: torch.Tensor | None = None):
    """One sequence ``x [T, D]`` step by step: ``y_t = act(Σ_j w_j x_{t−(W−1)+j} + b)`` with
    the cached inputs ``cache [W−1, D]`` (or zeros) before the start; returns (y, last W−1)."""
    W = conv.kernel_size
    w = conv.weight.detach()[:, 0].to(x.dtype)  # [D, W]
    hist = [torch.zeros(D, dtype=x.dtype) for _ in range(W - 1)]
    if cache is not None:
        hist = list(cache.unbind(0))
    ys = []
    for t in range(x.shape[0]):
        hist.append(x[t])
        acc = sum(w[:, j] * hist[len(hist) - W + j] for j in range(W))
        if conv.bias is not None:
            acc = acc + conv.bias.detach().to(x.dtype)
        ys.append(F.silu(acc) if conv.activation else acc)
    tail = hist[len(hist) - (W - 1) :] if W > 1 else []
    tail = torch.stack(tail) if tail else x.new_zeros(0, D)
    return torch.stack(ys) if ys else x.new_zeros(0, D), tail


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
