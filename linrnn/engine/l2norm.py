"""The delta rule's key/query normalization on Triton: y = x·rsqrt(Σx² + eps) along the last
dimension, forward and backward as one pass each over the rows (the PyTorch form in fp32 takes
about ten elementwise passes over fp32 copies of q and k, more than the delta-rule kernels
themselves at bf16).

Per row, r = (Σx² + eps)^(−1/2) in fp32; y = x·r in x's dtype; with ∂y given,
∂x = r·∂y − r³·x·(x·∂y) (fp32, cast to x's dtype). The forward keeps r ``[rows]`` fp32 for the
backward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linrnn.engine.host_math import cdiv, next_pow2
from linrnn.engine.launch import launch

# Rows per program: enough for a few KiB of data in flight per program at K = 64..256.
ROWS = 16


@triton.jit
def _rows(x, n, D, BR: tl.constexpr, BD: tl.constexpr):
    """Row indices, column indices, the in-bounds mask and the [BR, BD] tile of x in fp32."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_d = tl.arange(0, BD)
    m = (o_r < n)[:, None] & (o_d < D)[None, :]
    b_x = tl.load(x + o_r[:, None] * D + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    return o_r, o_d, m, b_x


@triton.jit
def l2norm_fwd_kernel(x, y, r, n, D, eps, BR: tl.constexpr, BD: tl.constexpr):
    """Grid (cdiv(n, BR),): rows of x ``[n, D]`` normalized into y (x's dtype), r fp32."""
    o_r, o_d, m, b_x = _rows(x, n, D, BR, BD)
    b_r = 1.0 / tl.sqrt(tl.sum(b_x * b_x, 1) + eps)
    tl.store(y + o_r[:, None] * D + o_d[None, :], (b_x * b_r[:, None]).to(y.dtype.element_ty),
             mask=m)  # fmt: skip
    tl.store(r + o_r, b_r, mask=o_r < n)


@triton.jit
def l2norm_bwd_kernel(x, r, dy, dx, n, D, BR: tl.constexpr, BD: tl.constexpr):
    """Grid (cdiv(n, BR),): ∂x = r·∂y − r³·x·(x·∂y) of rows ``[n, D]`` into dx (x's dtype)."""
    o_r, o_d, m, b_x = _rows(x, n, D, BR, BD)
    b_dy = tl.load(dy + o_r[:, None] * D + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    b_r = tl.load(r + o_r, mask=o_r < n, other=0.0)
    b_xdy = tl.sum(b_x * b_dy, 1)
    b_dx = b_r[:, None] * b_dy - (b_r * b_r * b_r * b_xdy)[:, None] * b_x
    tl.store(dx + o_r[:, None] * D + o_d[None, :], b_dx.to(dx.dtype.element_ty), mask=m)


class L2Norm(torch.autograd.Function):
    """The autograd Function of :func:`l2norm`."""

    @staticmethod
    def forward(ctx, x, eps):
        x = x.contiguous()
        D = x.shape[-1]
        n = x.numel() // D
        y = torch.empty_like(x)
        r = torch.empty(n, device=x.device, dtype=torch.float32)
        BD = next_pow2(D)
        launch(l2norm_fwd_kernel, (cdiv(n, ROWS),), x=x, y=y, r=r, n=n, D=D, eps=eps, BR=ROWS,
               BD=BD)  # fmt: skip
        ctx.save_for_backward(x, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, r = ctx.saved_tensors
        D = x.shape[-1]
        n = x.numel() // D
        dx = torch.empty_like(x)
        l2norm_bwd_kernel[(cdiv(n, ROWS),)](x=x, r=r, dy=dy.contiguous(), dx=dx, n=n, D=D,
                                            BR=ROWS, BD=next_pow2(D))  # fmt: skip
        return dx, None


def l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x·rsqrt(Σx² + eps)`` along the last dimension (fp32 inside, x's dtype out), with its
    gradient; x fp16, bf16 or fp32."""
    return L2Norm.apply(x, eps)
