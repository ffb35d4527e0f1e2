"""RWKV6's token shift and its data-dependent interpolations on Triton, for calls that start
every sequence afresh (training, a prompt without a cache):

    y_f,t = x_t + (x_{t−1} − x_t) · (mu_f + mix_f,t)        f = 0 … F−1

with ``x_{t−1} = 0`` at the start of each sequence, ``mu [F, D]`` and ``mix [B, T, F, D]`` (the
LoRA's output; absent for the plain shift-mix that feeds the LoRA). The PyTorch form pads x
for the shift, forms the difference, adds ``mu`` to ``mix`` as an fp32 ``[B, T, F, D]`` tensor
and makes each of the F outputs in two more passes, with autograd keeping the fp32 ``mix + mu``
for the backward; here one pass each way, which keeps only x and mix. The outputs may be
written in the autocast dtype (the projections they feed would cast them to it anyway).
∂mu is a per-program partial sum added on the host in a fixed order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linrnn.engine.host_math import cdiv, next_pow2

BT = 32  # tokens per tile
BD_MAX = 64  # channels per tile
NB = 8  # tiles per backward program (one partial ∂mu per NB·BT tokens)


@triton.jit
def _delta(X, SID, i_b, o_t, o_d, m, T, D, VARLEN: tl.constexpr):
    """x_t and x_{t−1} − x_t ([BT, BD] fp32; x_{t−1} = 0 before a sequence's start)."""
    p = X + (i_b * T + o_t.to(tl.int64))[:, None] * D + o_d[None, :]
    b_x = tl.load(p, mask=m, other=0.0).to(tl.float32)
    ok = o_t >= 1
    if VARLEN:
        sid = tl.load(SID + o_t, mask=o_t < T, other=-1)
        ok &= tl.load(SID + o_t - 1, mask=ok & (o_t < T), other=-2) == sid
    b_p = tl.load(p - D, mask=m & ok[:, None], other=0.0).to(tl.float32)
    return b_x, b_p - b_x


@triton.jit(do_not_specialize=["T"])
def lerp_shift_fwd_kernel(
    X, SID, MU, MIX, Y, T, D, smt, smf,
    F: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, HAS_MIX: tl.constexpr,
    VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(T, BT), cdiv(D, BD), B). X ``[B, T, D]``, Y ``[F, B, T, D]`` and MU ``[F, D]``
    contiguous; MIX ``[B, T, F, D]`` at token stride smt and output stride smf (as the LoRA's
    einsum leaves it); SID ``[T]`` int32 (VARLEN: each token's sequence)."""
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    B = tl.num_programs(2)
    o_t = i_t * BT + tl.arange(0, BT)
    o_d = i_d * BD + tl.arange(0, BD)
    m = (o_t < T)[:, None] & (o_d < D)[None, :]
    b_x, b_dx = _delta(X, SID, i_b, o_t, o_d, m, T, D, VARLEN)
    row = (i_b * T + o_t.to(tl.int64))[:, None]
    for f in range(F):
        c = tl.load(MU + f * D + o_d, mask=o_d < D, other=0.0).to(tl.float32)[None, :]
        if HAS_MIX:
            c += tl.load(MIX + row * smt + f * smf + o_d[None, :], mask=m, other=0.0).to(tl.float32)
        p = Y + ((f * B * T) + row) * D + o_d[None, :]
        tl.store(p, (b_x + b_dx * c).to(Y.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["T"])
def lerp_shift_bwd_kernel(
    X, SID, MU, MIX, DY, DX, DMIX, DMU, T, D, smt, smf,
    F: tl.constexpr, FP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, NB: tl.constexpr,
    HAS_MIX: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(T, BT·NB), cdiv(D, BD), B). DY ``[F, B, T, D]``; DX ``[B, T, D]``; DMIX as
    MIX, strides too; DMU ``[B · grid 0, FP, D]`` fp32, this program's partial sums.
    ∂x_t = Σ_f ∂y_f,t (1 − c_f,t) + Σ_f ∂y_f,t+1 c_f,t+1 (t + 1 in t's sequence),
    ∂mix_f,t = ∂y_f,t (x_{t−1} − x_t)."""
    i_p, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    B = tl.num_programs(2)
    o_d = i_d * BD + tl.arange(0, BD)
    o_f = tl.arange(0, FP)
    dmu = tl.zeros([FP, BD], dtype=tl.float32)
    for n in range(NB):
        o_t = (i_p * NB + n) * BT + tl.arange(0, BT)
        m = (o_t < T)[:, None] & (o_d < D)[None, :]
        _, b_dx = _delta(X, SID, i_b, o_t, o_d, m, T, D, VARLEN)
        nxt = o_t + 1 < T  # t + 1 reads t as its previous token
        if VARLEN:
            nxt &= tl.load(SID + o_t + 1, mask=nxt, other=-1) == tl.load(
                SID + o_t, mask=o_t < T, other=-2
            )
        mn = m & nxt[:, None]
        row = (i_b * T + o_t.to(tl.int64))[:, None]
        dx = tl.zeros([BT, BD], dtype=tl.float32)
        for f in range(F):
            mu = tl.load(MU + f * D + o_d, mask=o_d < D, other=0.0).to(tl.float32)[None, :]
            c, c1 = mu, mu
            if HAS_MIX:
                pm = MIX + row * smt + f * smf + o_d[None, :]
                c += tl.load(pm, mask=m, other=0.0).to(tl.float32)
                c1 += tl.load(pm + smt, mask=mn, other=0.0).to(tl.float32)
            py = DY + ((f * B * T) + row) * D + o_d[None, :]
            dy = tl.load(py, mask=m, other=0.0).to(tl.float32)
            dy1 = tl.load(py + D, mask=mn, other=0.0).to(tl.float32)
            dx += dy * (1.0 - c) + dy1 * c1
            g = dy * b_dx
            if HAS_MIX:
                tl.store(DMIX + row * smt + f * smf + o_d[None, :],
                         g.to(DMIX.dtype.element_ty), mask=m)  # fmt: skip
            dmu += tl.where(o_f[:, None] == f, tl.sum(g, 0)[None, :], 0.0)
        tl.store(DX + row * D + o_d[None, :], dx.to(DX.dtype.element_ty), mask=m)
    part = i_b * tl.num_programs(0) + i_p
    tl.store(DMU + (part * FP + o_f[:, None]) * D + o_d[None, :], dmu,
             mask=(o_f < F)[:, None] & (o_d < D)[None, :])  # fmt: skip


class LerpShift(torch.autograd.Function):
    """The autograd Function of :func:`lerp_shift`."""

    @staticmethod
    def forward(ctx, x, sid, mu, mix, out_dtype):
        B, T, D = x.shape
        F = mu.shape[0]
        x = x.contiguous()
        smt = smf = 0
        if mix is not None:
            # read in place where its [B·T, F, D] view has unit channel stride (the einsum's
            # [F, B·T, D] result does): no copy
            rows = mix.reshape(B * T, F, D)
            mix = mix if rows.stride(2) == 1 else mix.contiguous()
            smt, smf = mix.reshape(B * T, F, D).stride()[:2]
        y = torch.empty(F, B, T, D, device=x.device, dtype=out_dtype)
        BD = min(BD_MAX, next_pow2(D))
        flags = dict(F=F, BT=BT, BD=BD, HAS_MIX=mix is not None, VARLEN=sid is not None)
        lerp_shift_fwd_kernel[(cdiv(T, BT), cdiv(D, BD), B)](
            X=x, SID=sid, MU=mu, MIX=mix, Y=y, T=T, D=D, smt=smt, smf=smf, **flags
        )
        ctx.save_for_backward(x, sid, mu, mix)
        ctx.flags, ctx.strides = flags, (smt, smf)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, sid, mu, mix = ctx.saved_tensors
        flags = ctx.flags
        B, T, D = x.shape
        F = flags["F"]
        grid = (cdiv(T, BT * NB), cdiv(D, flags["BD"]), B)
        FP = next_pow2(F)
        dx = torch.empty_like(x)
        dmix = None  # laid out as mix, so the same offsets address both
        if mix is not None:
            dmix = torch.empty_strided(mix.shape, mix.stride(), device=x.device, dtype=mix.dtype)
        smt, smf = ctx.strides
        dmu = torch.empty(B * grid[0], FP, D, device=x.device, dtype=torch.float32)
        lerp_shift_bwd_kernel[grid](
            X=x, SID=sid, MU=mu, MIX=mix, DY=dy.contiguous(), DX=dx, DMIX=dmix, DMU=dmu, T=T,
            D=D, smt=smt, smf=smf, FP=FP, NB=NB, **flags,
        )  # fmt: skip
        return dx, None, dmu.sum(0)[:F].to(mu.dtype), dmix, None


def lerp_shift(x, sid, mu, mix=None, out_dtype=None):
    """``y [F, B, T, D]`` with ``y_f,t = x_t + (x_{t−1} − x_t)·(mu_f + mix_f,t)`` (module
    docstring): x ``[B, T, D]``, mu ``[F, D]``, mix ``[B, T, F, D]`` or None, ``sid`` None or
    (B = 1) the int32 sequence index of each packed token; fp32 inside, ``out_dtype`` (x's by
    default) out."""
    return LerpShift.apply(x, sid, mu, mix, out_dtype or x.dtype)
