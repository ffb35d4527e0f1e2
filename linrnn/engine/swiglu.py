"""The feed-forward's gated activation on Triton (:class:`linrnn.models.feedforward.SwiGLU`),
one pass each way over the packed projection ``gu = [g | u]`` (``[..., 2H]``, one GEMM's
output):

    h = silu(g) · u                                  (fp32 inside, rounded once)
    ∂g = ∂h · u · silu'(g),   ∂u = ∂h · silu(g)      (into one ``[..., 2H]`` gradient)

The PyTorch form splits gu into two strided halves, runs SiLU and the product as two passes
that round to the input dtype in between, keeps SiLU's output for the backward, and in the
backward runs two products, SiLU's backward and a concatenation of the halves' gradients.
Here the forward keeps nothing but gu, and the backward writes ∂gu in place of the
concatenation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linrnn.engine.host_math import cdiv

BR = 8  # rows (tokens) per tile
BH = 128  # channels per tile: [8, 128] on 4 warps, 8 elements of each tensor per thread
# (ptxas, sm_90: the backward took 146-193 registers at [16, 128], two programs per SM)


@triton.jit
def _sigmoid(g):
    """σ(g) from e^−|g| (never e of a positive number: finite and exact at either end)."""
    e = tl.exp(-tl.abs(g))
    return tl.where(g >= 0, 1.0, e) / (1.0 + e)


@triton.jit
def _tile(s_gu, i_r, i_h, n, HD, BR: tl.constexpr, BH: tl.constexpr):
    """The mask of a [BR, BH] tile, the offsets of its g in gu and of its h, and its rows."""
    o_r = (i_r * BR + tl.arange(0, BR)).to(tl.int64)
    o_h = i_h * BH + tl.arange(0, BH)
    m = (o_r < n)[:, None] & (o_h < HD)[None, :]
    return m, o_r[:, None] * s_gu + o_h[None, :], o_r[:, None] * HD + o_h[None, :], o_r, o_h


@triton.jit(do_not_specialize=["n"])
def swiglu_fwd_kernel(GU, H, n, HD, s_gu, BR: tl.constexpr, BH: tl.constexpr):
    """Grid (cdiv(n, BR), cdiv(HD, BH)). GU rows at stride s_gu (g at column c, u at HD + c);
    H ``[n, HD]`` contiguous."""
    m, pg, ph, _, _ = _tile(s_gu, tl.program_id(0), tl.program_id(1), n, HD, BR, BH)
    g = tl.load(GU + pg, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + pg + HD, mask=m, other=0.0).to(tl.float32)
    tl.store(H + ph, (g * _sigmoid(g) * u).to(H.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n"])
def swiglu_bwd_kernel(GU, DH, DGU, n, HD, s_gu, BR: tl.constexpr, BH: tl.constexpr):
    """Grid as the forward's. DH ``[n, HD]`` contiguous, DGU ``[n, 2·HD]`` contiguous."""
    m, pg, ph, o_r, o_h = _tile(s_gu, tl.program_id(0), tl.program_id(1), n, HD, BR, BH)
    g = tl.load(GU + pg, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + pg + HD, mask=m, other=0.0).to(tl.float32)
    dh = tl.load(DH + ph, mask=m, other=0.0).to(tl.float32)
    s = _sigmoid(g)
    pd = o_r[:, None] * (2 * HD) + o_h[None, :]
    tl.store(DGU + pd, (dh * u * s * (1.0 + g * (1.0 - s))).to(DGU.dtype.element_ty), mask=m)
    tl.store(DGU + pd + HD, (dh * g * s).to(DGU.dtype.element_ty), mask=m)


def _rows(gu: torch.Tensor) -> torch.Tensor:
    """``[..., 2H]`` → a ``[n, 2H]`` view with unit channel stride (a copy where the leading
    dimensions do not flatten to one stride)."""
    r = gu.reshape(-1, gu.shape[-1])
    return r if r.stride(1) == 1 else r.contiguous()


def swiglu_fwd(gu: torch.Tensor, h: torch.Tensor) -> None:
    """h ``[n, H]`` (contiguous) = silu(g)·u of gu ``[n, 2H]`` (unit channel stride)."""
    n, HD = h.shape
    if n and HD:
        swiglu_fwd_kernel[(cdiv(n, BR), cdiv(HD, BH))](
            GU=gu, H=h, n=n, HD=HD, s_gu=gu.stride(0), BR=BR, BH=BH
        )


def swiglu_bwd(gu: torch.Tensor, dh: torch.Tensor, dgu: torch.Tensor) -> None:
    """∂gu ``[n, 2H]`` (contiguous) from gu ``[n, 2H]`` and ∂h ``[n, H]`` (contiguous)."""
    n, HD = dh.shape
    if n and HD:
        swiglu_bwd_kernel[(cdiv(n, BR), cdiv(HD, BH))](
            GU=gu, DH=dh, DGU=dgu, n=n, HD=HD, s_gu=gu.stride(0), BR=BR, BH=BH
        )


class SwiGLUFn(torch.autograd.Function):
    """The autograd Function of :func:`swiglu`."""

    @staticmethod
    def forward(ctx, gu):
        rows = _rows(gu)
        HD = gu.shape[-1] // 2
        h = torch.empty(rows.shape[0], HD, device=gu.device, dtype=gu.dtype)
        swiglu_fwd(rows, h)
        ctx.save_for_backward(rows)
        ctx.shape = gu.shape
        return h.view(*gu.shape[:-1], HD)

    @staticmethod
    def backward(ctx, dh):
        (rows,) = ctx.saved_tensors
        dgu = torch.empty(rows.shape, device=rows.device, dtype=rows.dtype)
        swiglu_bwd(rows, dh.reshape(rows.shape[0], -1).contiguous(), dgu)
        return dgu.view(ctx.shape)


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    """``silu(g)·u`` of ``gu = [g | u]`` (``[..., 2H]``, fp16, bf16 or fp32), in gu's dtype.
    (Arguments checked by the caller, :func:`linrnn.models.feedforward.swiglu`.)"""
    return SwiGLUFn.apply(gu)
