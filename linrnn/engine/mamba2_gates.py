"""Mamba2's gates on the Triton paths (docs/DESIGN.md §11): from the step sizes dt ``[B, T, H]``,
dt_bias and A ``[H]`` the engine's log decay and log input gate in one kernel, and their
gradients in one more, instead of a dozen elementwise PyTorch ops each way::

    z = dt + dt_bias,   Δ = softplus(z),   g = Δ·A,   gi = log Δ

``log Δ`` is ``z − e^z/2`` below z = −15 and ``log(softplus(z))`` above, as
:func:`linrnn.ops.mamba2.log_softplus`; softplus as ``max(z, 0) + log1p(e^{−|z|})`` (z itself
above 40), every exponent ≤ 0. Backward, with σ the logistic function::

    ∂z = ∂g·A·σ(z) + ∂gi·(σ(z)/Δ,  or 1 − e^z/2 below −15)
    ∂dt = ∂z,   ∂dt_bias = Σ_{b,t} ∂z,   ∂A = Σ_{b,t} ∂g·Δ

fp32 throughout; the per-head sums from per-program partial sums added on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linrnn.engine.host_math import cdiv, next_pow2
from linrnn.engine.launch import launch
from linrnn.engine.triton_common import LOG_SOFTPLUS_CUT, _softplus_parts

BLOCK = 4096  # elements of one program's [time, head] tile


@triton.jit
def _tile_index(T, H, BT: tl.constexpr, BH: tl.constexpr):
    """This program's (b, t rows, heads, mask, flat offsets) of a [B, T, H] tensor."""
    i_t, i_b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_t = i_t * BT + tl.arange(0, BT)
    o_h = tl.arange(0, BH)
    m = (o_t < T)[:, None] & (o_h < H)[None, :]
    return i_b, o_h, m, (i_b * T + o_t.to(tl.int64))[:, None] * H + o_h[None, :]


@triton.jit(do_not_specialize=["T"])
def gates_fwd_kernel(
    dt, dt_bias, A, g, gi, T, H,
    BT: tl.constexpr, BH: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """Grid (T tiles, B): g = softplus(dt + dt_bias)·A and gi = log softplus(dt + dt_bias),
    fp32 in the engine's row layout [B, H, T] (dt [B, T, H])."""
    i_b, o_h, m, off = _tile_index(T, H, BT, BH)
    o_t = tl.program_id(0) * BT + tl.arange(0, BT)
    off_rows = (i_b * H + o_h[None, :]) * T + o_t[:, None]
    z = tl.load(dt + off, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z += tl.load(dt_bias + o_h, mask=o_h < H, other=0.0).to(tl.float32)[None, :]
    delta, _sig, _e = _softplus_parts(z)
    b_A = tl.load(A + o_h, mask=o_h < H, other=0.0).to(tl.float32)
    low = z < LOG_SOFTPLUS_CUT  # (Δ may underflow there: log(1) in its place)
    small = tl.minimum(z, LOG_SOFTPLUS_CUT)  # e^z of the small branch, ≤ e^−15
    b_gi = tl.where(low, small - 0.5 * tl.exp(small), tl.log(tl.where(low, 1.0, delta)))
    tl.store(g + off_rows, delta * b_A[None, :], mask=m)
    tl.store(gi + off_rows, b_gi, mask=m)


@triton.jit(do_not_specialize=["T"])
def gates_bwd_kernel(
    dt, dt_bias, A, dg, dgi, ddt, dA, dbias, T, H,
    s_gb, s_gt, s_gh, s_ib, s_it, s_ih,
    BT: tl.constexpr, BH: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DG: tl.constexpr,
    HAS_DGI: tl.constexpr,
):  # fmt: skip
    """Grid (T tiles, B): ∂dt [B, T, H] in dt's dtype from ∂g and ∂gi (element strides (s_gb,
    s_gt, s_gh) and (s_ib, s_it, s_ih); either may be absent), and this tile's per-head sums
    of ∂z and ∂g·Δ at dbias, dA [B, T tiles, H] fp32."""
    i_b, o_h, m, off = _tile_index(T, H, BT, BH)
    i_t = tl.program_id(0)
    o_t = i_t * BT + tl.arange(0, BT)
    m_h = o_h < H
    z = tl.load(dt + off, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z += tl.load(dt_bias + o_h, mask=m_h, other=0.0).to(tl.float32)[None, :]
    delta, sig, _e = _softplus_parts(z)
    dz = tl.zeros([BT, BH], dtype=tl.float32)
    part_A = tl.zeros([BH], dtype=tl.float32)
    if HAS_DG:
        p = dg + i_b * s_gb + o_t.to(tl.int64)[:, None] * s_gt + o_h[None, :] * s_gh
        b_dg = tl.load(p, mask=m, other=0.0).to(tl.float32)
        b_A = tl.load(A + o_h, mask=m_h, other=0.0).to(tl.float32)
        dz += b_dg * b_A[None, :] * sig
        part_A = tl.sum(tl.where(m, b_dg * delta, 0.0), 0)
    if HAS_DGI:
        p = dgi + i_b * s_ib + o_t.to(tl.int64)[:, None] * s_it + o_h[None, :] * s_ih
        b_dgi = tl.load(p, mask=m, other=0.0).to(tl.float32)
        low = z < LOG_SOFTPLUS_CUT
        small = tl.minimum(z, LOG_SOFTPLUS_CUT)
        slope = tl.where(low, 1.0 - 0.5 * tl.exp(small), sig / tl.where(low, 1.0, delta))
        dz += b_dgi * slope
    dz = tl.where(m, dz, 0.0)
    tl.store(ddt + off, dz.to(ddt.dtype.element_ty), mask=m)
    row = (i_b * tl.num_programs(0) + i_t) * H
    tl.store(dA + row + o_h, part_A, mask=m_h)
    if HAS_BIAS:
        tl.store(dbias + row + o_h, tl.sum(dz, 0), mask=m_h)


def _tiles(T: int, H: int):
    BH = max(16, next_pow2(H))
    BT = max(1, min(next_pow2(T), BLOCK // BH))
    return BT, BH


def gates_forward(dt, A, dt_bias):
    """(g, gi) ``[B, T, H]`` fp32 from dt ``[B, T, H]`` (any float dtype), A and dt_bias ``[H]``
    (dt_bias may be None): views of ``[B, H, T]`` tensors, the layout in which the engine
    reads its gate rows (:func:`linrnn.engine.gate_grads.rows` then copies nothing)."""
    dt = dt.contiguous()
    B, T, H = dt.shape
    g = torch.empty(B, H, T, device=dt.device, dtype=torch.float32)
    gi = torch.empty_like(g)
    BT, BH = _tiles(T, H)
    launch(
        gates_fwd_kernel, (cdiv(T, BT), B),
        dt=dt, dt_bias=dt_bias, A=A, g=g, gi=gi, T=T, H=H, BT=BT, BH=BH,
        HAS_BIAS=dt_bias is not None,
    )  # fmt: skip
    return g.transpose(1, 2), gi.transpose(1, 2)


def gates_backward(dt, A, dt_bias, dg, dgi):
    """(∂dt in dt's dtype, ∂A, ∂dt_bias (None without dt_bias)) fp32 ``[H]`` from ∂g, ∂gi
    (``[B, T, H]``, any strides; None where the loss does not reach them)."""
    dt = dt.contiguous()
    B, T, H = dt.shape
    BT, BH = _tiles(T, H)
    NT = cdiv(T, BT)
    f32 = dict(device=dt.device, dtype=torch.float32)
    ddt = torch.empty_like(dt)
    part_A = torch.empty(B, NT, H, **f32)
    part_bias = torch.empty(B, NT, H, **f32) if dt_bias is not None else None
    sg = dg.stride() if dg is not None else (0, 0, 0)
    si = dgi.stride() if dgi is not None else (0, 0, 0)
    gates_bwd_kernel[(NT, B)](
        dt=dt, dt_bias=dt_bias, A=A, dg=dg, dgi=dgi, ddt=ddt, dA=part_A, dbias=part_bias, T=T,
        H=H, s_gb=sg[0], s_gt=sg[1], s_gh=sg[2], s_ib=si[0], s_it=si[1], s_ih=si[2], BT=BT,
        BH=BH, HAS_BIAS=dt_bias is not None, HAS_DG=dg is not None, HAS_DGI=dgi is not None,
    )  # fmt: skip
    dA = part_A.double().sum((0, 1)).float()
    dbias = part_bias.double().sum((0, 1)).float() if part_bias is not None else None
    return ddt, dA, dbias


class GatesFunction(torch.autograd.Function):
    """(g, gi) of (dt, A, dt_bias) with the kernels' gradients (eager calls)."""

    @staticmethod
    def forward(ctx, dt, A, dt_bias):
        A32 = A.float().contiguous()
        bias32 = None if dt_bias is None else dt_bias.float().contiguous()
        ctx.save_for_backward(dt, A32, bias32)
        ctx.dtypes = (A.dtype, None if dt_bias is None else dt_bias.dtype)
        return gates_forward(dt, A32, bias32)

    @staticmethod
    def backward(ctx, dg, dgi):
        dt, A32, bias32 = ctx.saved_tensors
        ddt, dA, dbias = gates_backward(dt, A32, bias32, dg, dgi)
        dA = dA.to(ctx.dtypes[0])
        dbias = None if dbias is None else dbias.to(ctx.dtypes[1])
        return ddt, dA, dbias


def gates(dt, A, dt_bias):
    """(g, gi) ``[B, T, H]`` fp32 of Mamba2's softplus step sizes (module docstring); without
    a gradient to track, straight from the kernel (a decode step skips the autograd Function)."""
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (dt, A, dt_bias)):
        return GatesFunction.apply(dt, A, dt_bias)
    bias = None if dt_bias is None else dt_bias.float().contiguous()
    return gates_forward(dt, A.float().contiguous(), bias)
