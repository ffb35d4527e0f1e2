"""The Triton short convolution (linrnn.engine.short_conv through ShortConvolution with
backend="triton") against a float64 loop over the taps written here: outputs and the
gradients of x, the weight and the bias; with and without SiLU and bias, 1 to 16 taps, widths
below and above one channel tile, more tokens than one backward program takes, x read in place
from a wider projection, packed sequences (an empty one and ones shorter than the kernel); the
new cache equals the PyTorch form's; fp32 and bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import rel_err

from linrnn.layers.conv import ShortConvolution

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _loop(x, w, b, cu, silu):
    """fp64: y_t = Σ_j w_j x_{t−W+1+j} over the taps inside t's own sequence, + b, SiLU."""
    T, W = x.shape[1], w.shape[-1]
    starts = [0] * T if cu is None else [cu[n] for n in range(len(cu) - 1)
                                         for _ in range(cu[n], cu[n + 1])]  # fmt: skip
    y = torch.zeros_like(x) + (0 if b is None else b)
    for t in range(T):
        for j in range(W):
            s = t - (W - 1) + j
            if s >= starts[t]:
                y[:, t] = y[:, t] + w[:, 0, j] * x[:, s]
    return F.silu(y) if silu else y


CASES = [  # B, T, D, taps, silu, bias, packed offsets
    (2, 37, 48, 4, True, False, None),
    (1, 300, 160, 4, True, True, None),
    (2, 19, 16, 2, False, True, None),
    (1, 9, 8, 1, True, False, None),
    (1, 45, 48, 4, True, True, [0, 3, 3, 20, 45]),
    (1, 290, 24, 3, False, False, [0, 1, 260, 290]),
    (1, 150, 40, 8, True, True, [0, 5, 150]),  # the backward's narrower tiles from 8 taps on
    (1, 40, 8, 16, True, False, None),  # 4-token tiles: two backward programs
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-T{c[1]}-D{c[2]}-W{c[3]}"
                         f"-{'silu' if c[4] else 'id'}-{'b' if c[5] else 'nob'}"
                         f"-{'packed' if c[6] else 'dense'}")  # fmt: skip
def test_values_gradients_and_cache(case, dtype):
    B, T, D, W, silu, bias, cu = case
    conv = ShortConvolution(D, W, "silu" if silu else None, bias)
    with torch.no_grad():
        conv.weight.normal_()
        if bias:
            conv.bias.normal_()
    wide = torch.randn(B, T, 2 * D)  # x as the second half of a projection
    dy = torch.randn(B, T, D)
    ref = ShortConvolution(D, W, "silu" if silu else None, bias).double()
    ref.load_state_dict(conv.state_dict())
    conv.to(DEVICE)

    xw = wide.to(DEVICE, dtype).requires_grad_()
    x = xw[..., D:]
    assert not x.is_contiguous()
    y, cache = conv(x, cu_seqlens=cu, backend="triton")
    grads = torch.autograd.grad(y, [xw, conv.weight, *([conv.bias] if bias else [])],
                                dy.to(DEVICE, dtype))  # fmt: skip
    assert not grads[0][..., :D].any()

    x64 = wide[..., D:].double().requires_grad_()
    leaves = [x64, ref.weight, *([ref.bias] if bias else [])]
    y64 = _loop(x64, ref.weight, ref.bias, cu, silu)
    ref_grads = torch.autograd.grad(y64, leaves, dy.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert y.dtype == dtype and rel_err(y.cpu(), y64) < tol
    assert rel_err(grads[0][..., D:].cpu(), ref_grads[0]) < tol
    for name, got, want in zip(("w", "b"), grads[1:], ref_grads[1:]):
        assert got.dtype == torch.float32 and rel_err(got.cpu(), want) < tol, name

    _, cache_ref = ref(wide[..., D:].double(), cu_seqlens=cu, backend="torch")
    assert torch.equal(cache.cpu().double(), cache_ref.to(dtype).double())


def test_matches_the_pytorch_form_and_decodes_on():
    """On either backend the same outputs (fp32), and steps after a Triton prefill continue
    from its cache as after a PyTorch one."""
    D, W = 24, 4
    conv = ShortConvolution(D, W, "silu", True).to(DEVICE)
    x = torch.randn(2, 30, D, device=DEVICE)
    y_fused, c_fused = conv(x[:, :20], backend="triton")
    y_plain, c_plain = conv(x[:, :20].cpu(), backend="torch") if DEVICE == "cpu" else (None, None)
    if y_plain is not None:
        assert rel_err(y_fused, y_plain) < 1e-6 and torch.equal(c_fused, c_plain)
    full, _ = conv(x, backend="torch")
    steps = []
    for t in range(20, 30):
        y_t, c_fused = conv(x[:, t : t + 1], cache_state=c_fused, backend="triton")
        steps.append(y_t)
    assert rel_err(torch.cat([y_fused, *steps], 1).cpu(), full.cpu()) < 1e-6
