"""The layers' causal depthwise short convolution (:class:`linrnn.layers.conv.ShortConvolution`)
on Triton, for calls that start every sequence afresh (training, a prompt without a cache):

    y_t[d] = act( Σ_{j<W} w[d, j] · x_{t−(W−1)+j}[d] + bias[d] )      (x before a start: 0)

with ``act`` SiLU or none, over ``x [B, T, D]`` channels last (token stride free, so a slice
of a wider projection is read in place), or one packed row whose sequences never read each
other (a sequence index per token). The PyTorch form pads, transposes to ``[B, D, T]`` for
``conv1d`` and back, and applies SiLU as its own pass, each way; here the forward is one pass
and keeps nothing but its inputs, the backward one (∂pre = ∂y·act'(pre) at W shifted tokens,
pre formed again from x, then ∂x, ∂w and ∂bias). ∂w and ∂bias are per-program partial sums
added on the host in a fixed order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linrnn.engine.host_math import cdiv, next_pow2

# A [BT, BD] tile of 16 × 128 on 4 warps; the backward's tile is narrower in tokens from 8
# taps on (KWP·BT ≤ 64), as its per-element ∂w sums hold KWP·BT·BD fp32 (docs/tuning.md,
# "Layer glue": on the H200 at 65,536 tokens, D = 512, 4 taps, the forward takes 51 µs with
# this tile against 147 with 16 × 64, the backward 281 µs against 679 for the earlier
# two-kernel form).
BT = 16  # tokens per tile (forward; the backward's at 4 taps)
BD_MAX = 128  # channels per tile
NB = 8  # tiles per backward program (one partial ∂w per NB·BT tokens)
MAX_TAPS = 16


@triton.jit
def _tap(X, SID, sb, sx, i_b, o_t, o_d, m_t, m_d, sid_t, j, KW: tl.constexpr,
         VARLEN: tl.constexpr):  # fmt: skip
    """x at tap j of tokens o_t: x_{t−(KW−1)+j} [BT, BD] fp32, 0 before t's sequence."""
    src = o_t - (KW - 1) + j
    ok = m_t & (src >= 0)
    if VARLEN:
        ok &= tl.load(SID + src, mask=ok, other=-1) == sid_t
    p = X + i_b * sb + src.to(tl.int64)[:, None] * sx + o_d[None, :]
    return tl.load(p, mask=ok[:, None] & m_d[None, :], other=0.0).to(tl.float32)


@triton.jit
def _pre(
    X, W, BIAS, SID, sb, sx, i_b, o_t, o_d, m_t, m_d, sid_t, KW: tl.constexpr, BT: tl.constexpr,
    BD: tl.constexpr, HAS_BIAS: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """The pre-activation [BT, BD] at tokens o_t, channels o_d (fp32)."""
    acc = tl.zeros([BT, BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(BIAS + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(KW):
        b_x = _tap(X, SID, sb, sx, i_b, o_t, o_d, m_t, m_d, sid_t, j, KW, VARLEN)
        b_w = tl.load(W + o_d * KW + j, mask=m_d, other=0.0).to(tl.float32)
        acc += b_x * b_w[None, :]
    return acc


@triton.jit
def _rows(SID, i_t, i_d, T, D, BT: tl.constexpr, BD: tl.constexpr, VARLEN: tl.constexpr):
    o_t = i_t * BT + tl.arange(0, BT)
    o_d = i_d * BD + tl.arange(0, BD)
    m_t, m_d = o_t < T, o_d < D
    sid_t = o_t * 0
    if VARLEN:
        sid_t = tl.load(SID + o_t, mask=m_t, other=-3)
    return o_t, o_d, m_t, m_d, sid_t


@triton.jit(do_not_specialize=["T"])
def short_conv_fwd_kernel(
    X, W, BIAS, SID, Y, T, D, sb, sx,
    KW: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(T, BT), cdiv(D, BD), B). X at batch stride sb, token stride sx; W ``[D, KW]``;
    SID ``[T]`` int32 (VARLEN: the sequence of each token); Y ``[B, T, D]`` contiguous."""
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_t, o_d, m_t, m_d, sid_t = _rows(SID, i_t, i_d, T, D, BT, BD, VARLEN)
    y = _pre(X, W, BIAS, SID, sb, sx, i_b, o_t, o_d, m_t, m_d, sid_t, KW, BT, BD, HAS_BIAS, VARLEN)
    if ACT:
        y = y * tl.sigmoid(y)
    p = Y + (i_b * T + o_t.to(tl.int64))[:, None] * D + o_d[None, :]
    tl.store(p, y.to(Y.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])


@triton.jit(do_not_specialize=["T"])
def short_conv_bwd_kernel(
    X, W, BIAS, SID, DY, DX, DW, DB, T, D, sb, sx,
    KW: tl.constexpr, KWP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, NB: tl.constexpr,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(T, BT·NB), cdiv(D, BD), B). With ∂pre_t = ∂y_t·act'(pre_t) (pre formed again
    from x): ∂x_s = Σ_k w_{KW−1−k}·∂pre_{s+k} into DX ``[B, T, D]``, and this program's partial
    sums ∂w_j = Σ_t x_{t−(KW−1)+j}·∂pre_t into DW ``[programs, KWP, D]``, ∂bias = Σ ∂pre into
    DB ``[programs, D]`` (programs = grid 0 × B, fp32), over pairs in one sequence. The
    partial sums stay per element ([KWP, BT, BD]) until the program's end: one reduction over
    tokens instead of one per tap and tile."""
    i_p, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_j = tl.arange(0, KWP)
    o_d = i_d * BD + tl.arange(0, BD)  # (the loop's own copy is out of scope after it)
    dw = tl.zeros([KWP, BT, BD], dtype=tl.float32)
    db = tl.zeros([BT, BD], dtype=tl.float32)
    for n in range(NB):
        o_s, o_d, m_s, m_d, sid_s = _rows(SID, i_p * NB + n, i_d, T, D, BT, BD, VARLEN)
        dx = tl.zeros([BT, BD], dtype=tl.float32)
        for k in tl.static_range(KW):  # ∂pre at t = s + k, through tap KW − 1 − k
            t = o_s + k
            ok = m_s & (t < T)
            if VARLEN:
                ok &= tl.load(SID + t, mask=ok, other=-1) == sid_s
            p = (i_b * T + t.to(tl.int64))[:, None] * D + o_d[None, :]
            dp = tl.load(DY + p, mask=ok[:, None] & m_d[None, :], other=0.0).to(tl.float32)
            if ACT:
                pre = _pre(X, W, BIAS, SID, sb, sx, i_b, t, o_d, ok, m_d, sid_s, KW, BT, BD,
                           HAS_BIAS, VARLEN)  # fmt: skip
                sg = tl.sigmoid(pre)
                dp = dp * sg * (1.0 + pre * (1.0 - sg))
            b_w = tl.load(W + o_d * KW + (KW - 1 - k), mask=m_d, other=0.0).to(tl.float32)
            dx += dp * b_w[None, :]
            if k == 0:  # ∂pre at the tile's own tokens: ∂w and ∂bias
                db += dp
                for j in tl.static_range(KW):  # (the taps _pre read: from the cache)
                    b_x = _tap(X, SID, sb, sx, i_b, o_s, o_d, m_s, m_d, sid_s, j, KW, VARLEN)
                    dw += tl.where(o_j[:, None, None] == j, (b_x * dp)[None], 0.0)
        p = (i_b * T + o_s.to(tl.int64))[:, None] * D + o_d[None, :]
        tl.store(DX + p, dx.to(DX.dtype.element_ty), mask=m_s[:, None] & m_d[None, :])
    row = i_b * tl.num_programs(0) + i_p
    tl.store(DW + (row * KWP + o_j[:, None]) * D + o_d[None, :], tl.sum(dw, 1),
             mask=(o_j < KW)[:, None] & (o_d < D)[None, :])  # fmt: skip
    if HAS_BIAS:
        tl.store(DB + row * D + o_d, tl.sum(db, 0), mask=o_d < D)


def _tiles(D: int) -> int:
    return min(BD_MAX, next_pow2(D))


class ShortConv(torch.autograd.Function):
    """The autograd Function of :func:`short_conv`."""

    @staticmethod
    def forward(ctx, x, weight, bias, sid, activation):
        B, T, D = x.shape
        if x.stride(2) != 1:  # (any token and batch strides: read in place)
            x = x.contiguous()
        w = weight.reshape(D, -1).contiguous()
        KW = w.shape[1]
        y = torch.empty(B, T, D, device=x.device, dtype=x.dtype)
        BD = _tiles(D)
        flags = dict(KW=KW, BT=BT, BD=BD, HAS_BIAS=bias is not None, VARLEN=sid is not None)
        short_conv_fwd_kernel[(cdiv(T, BT), cdiv(D, BD), B)](
            X=x, W=w, BIAS=bias, SID=sid, Y=y, T=T, D=D, sb=x.stride(0), sx=x.stride(1),
            ACT=activation, **flags,
        )  # fmt: skip
        ctx.save_for_backward(x, w, bias, sid)
        ctx.meta = (activation, flags, weight.shape, weight.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, bias, sid = ctx.saved_tensors
        activation, flags, wshape, wdtype = ctx.meta
        B, T, D = x.shape
        KW, BD = flags["KW"], flags["BD"]
        dy = dy.contiguous()
        KWP = next_pow2(KW)
        BTB = max(1, min(BT, 64 // KWP))  # the per-element ∂w sums: KWP·BT·BD fp32 in registers
        grid = (cdiv(T, BTB * NB), cdiv(D, BD), B)
        f32 = dict(device=x.device, dtype=torch.float32)
        dx = torch.empty(B, T, D, device=x.device, dtype=x.dtype)
        dw = torch.empty(B * grid[0], KWP, D, **f32)
        db = torch.empty(B * grid[0], D, **f32) if bias is not None else None
        short_conv_bwd_kernel[grid](
            X=x, W=w, BIAS=bias, SID=sid, DY=dy, DX=dx, DW=dw, DB=db, T=T, D=D, sb=x.stride(0),
            sx=x.stride(1), KWP=KWP, NB=NB, ACT=activation, **{**flags, "BT": BTB},
        )  # fmt: skip
        dw = dw.sum(0)[:KW].t().reshape(wshape).to(wdtype)
        if db is not None:
            db = db.sum(0).to(bias.dtype)
        return dx, dw, db, None, None


def short_conv(x, weight, bias, sid, activation: bool):
    """The convolution of ``x [B, T, D]`` (fp16, bf16 or fp32) with ``weight [D, 1, W]`` and
    ``bias [D]`` (or None), then SiLU when ``activation``; every sequence starts from zeros.
    ``sid``: None, or with B = 1 the int32 sequence index of each packed token."""
    if weight.shape[-1] > MAX_TAPS:
        raise ValueError(f"short_conv: at most {MAX_TAPS} taps, got {weight.shape[-1]}")
    return ShortConv.apply(x, weight, bias, sid, activation)
