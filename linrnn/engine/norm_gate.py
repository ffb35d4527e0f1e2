"""The layers' output norm and gate on Triton, one pass each way:

    y = norm(x)·w (+ b) · act(z)        (norm before the gate: GLA, RetNet, RWKV6, mLSTM, DeltaNet)
    y = norm(x·silu(z))·w               (the gate first: Mamba2's gated RMSNorm)

over rows of ``D`` channels (a head, or a group of channels), ``norm`` RMSNorm or LayerNorm
without its affine part, everything in fp32 and the output rounded once, to any dtype (a
block's norm writes the dtype its products compute in, so no cast follows it). A block's
residual add goes into the same pass (:func:`add_norm`): ``r = x + a`` is written and
normalized, and the backward adds r's own gradient and writes it twice, for x and, in a's
dtype, for a (the pass autograd's add and cast would take). The PyTorch form
(:func:`linrnn.layers.common.norm_gate`) takes about ten elementwise passes over fp32 copies
each way, and autograd keeps several of them for the backward; here the forward keeps only
the rows' 1/rms (and mean) ``[rows]`` fp32 and the backward reads x, z and ∂y once.

Rows: ``x [n, S, D]`` (n tokens, S rows per token: heads or groups); the weight ``[S·D]``
(one per channel of every row of a token) or ``[D]`` (shared by the S rows). A program takes
``BR`` tokens of one row slot s, so its weight tile is fixed; the backward's programs each
walk ``NB`` such tiles and write one partial sum of ∂w (and ∂b) per program, summed on the
host in a fixed order (deterministic, no atomics).

With x̂ the normalized row, r its 1/rms, ∂x̂ = ∂y_pre·w (∂y_pre the gradient of y before the
gate): RMSNorm ∂h = r·(∂x̂ − x̂·mean(∂x̂·x̂)); LayerNorm ∂h = r·(∂x̂ − mean(∂x̂) − x̂·mean(∂x̂·x̂)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linrnn.engine.host_math import cdiv, next_pow2

ACTS = {None: 0, "silu": 1, "sigmoid": 2}
TILE = 1024  # elements of a program's [BR, BD] tile (or one row, where that is longer)
NB = 8  # tiles per backward program (one partial ∂w per NB·BR tokens)
MAX_D = 8192  # the widest row a program holds (wider rows: the PyTorch form)


def _token_tile(D: int) -> tuple[int, int, int]:
    """(BR, BD, num_warps): tokens per tile (16 at D = 64, 8 at 128, 1 from 1024), the padded
    row width, and warps for 8 elements of each [BR, BD] tensor per thread, 16 at the widest
    rows (docs/tuning.md, "Layer glue": on the H200 this tile's backward is as fast as a
    2048-element one at D = 128 and 256 and 1.26x faster at D = 512 and 1024)."""
    BD = next_pow2(D)
    BR = max(1, min(16, TILE // BD))
    return BR, BD, max(4, min(16, BR * BD // 256))


@triton.jit
def _act(z, ACT: tl.constexpr):
    """act(z) and act'(z) in fp32 (ACT 1: silu, 2: sigmoid)."""
    s = tl.sigmoid(z)
    if ACT == 1:
        return z * s, s * (1.0 + z * (1.0 - s))
    return s, s * (1.0 - s)


@triton.jit
def _tile(sx, sz, i_t, s, n, D, BR: tl.constexpr, BD: tl.constexpr):
    """Token indices, column indices, the mask and the offsets of x's and z's [BR, BD] tile."""
    o_t = (i_t * BR + tl.arange(0, BR)).to(tl.int64)
    o_d = tl.arange(0, BD)
    m = (o_t < n)[:, None] & (o_d < D)[None, :]
    col = s * D + o_d[None, :]
    return o_t, o_d, m, o_t[:, None] * sx + col, o_t[:, None] * sz + col


@triton.jit
def _row_input(X, Z, A, px, pz, pa, m, ACT: tl.constexpr, GATE_FIRST: tl.constexpr,
               HAS_ADD: tl.constexpr):  # fmt: skip
    """x (x + a with HAS_ADD), the row to normalize h (x, or x·act(z) with GATE_FIRST),
    act(z) and act'(z) of a tile, fp32 (without a gate the last two are x, unused)."""
    x = tl.load(X + px, mask=m, other=0.0).to(tl.float32)
    if HAS_ADD:
        x += tl.load(A + pa, mask=m, other=0.0).to(tl.float32)
    a, da = x, x
    if ACT != 0:
        a, da = _act(tl.load(Z + pz, mask=m, other=0.0).to(tl.float32), ACT)
    h = x
    if GATE_FIRST:
        h = x * a
    return x, h, a, da


@triton.jit(do_not_specialize=["n"])
def norm_gate_fwd_kernel(
    X, Z, A, W, B, Y, R, RS, MU, n, S, D, sx, sz, WS, eps,
    BR: tl.constexpr, BD: tl.constexpr, LAYER: tl.constexpr, ACT: tl.constexpr,
    GATE_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ADD: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(n, BR), S). X, Z rows at token stride sx, sz; Y ``[n, S, D]`` contiguous;
    RS, MU ``[n, S]`` fp32 (MU only for LayerNorm); WS: the weight's row-slot stride (D or 0).
    HAS_ADD: the row is x + A (A ``[n, S, D]`` contiguous), stored to R (the same)."""
    i_t, s = tl.program_id(0), tl.program_id(1)
    o_t, o_d, m, px, pz = _tile(sx, sz, i_t, s, n, D, BR, BD)
    po = o_t[:, None] * (S * D) + s * D + o_d[None, :]
    x, h, a, _ = _row_input(X, Z, A, px, pz, po, m, ACT, GATE_FIRST, HAS_ADD)
    if HAS_ADD:
        tl.store(R + po, x.to(R.dtype.element_ty), mask=m)
    if LAYER:
        mu = tl.sum(h, 1) / D
        h = tl.where(m, h - mu[:, None], 0.0)
        tl.store(MU + o_t * S + s, mu, mask=o_t < n)
    r = 1.0 / tl.sqrt(tl.sum(h * h, 1) / D + eps)
    tl.store(RS + o_t * S + s, r, mask=o_t < n)
    w = tl.load(W + s * WS + o_d, mask=o_d < D, other=0.0).to(tl.float32)
    y = h * r[:, None] * w[None, :]
    if HAS_BIAS:
        y += tl.load(B + s * WS + o_d, mask=o_d < D, other=0.0).to(tl.float32)[None, :]
    if ACT != 0 and not GATE_FIRST:
        y = y * a
    tl.store(Y + po, y.to(Y.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n"])
def norm_gate_bwd_kernel(
    X, Z, W, B, DY, DR, RS, MU, DX, DZ, DA, DW, DB, n, S, D, sx, sz, WS,
    BR: tl.constexpr, NB: tl.constexpr, BD: tl.constexpr, LAYER: tl.constexpr,
    ACT: tl.constexpr, GATE_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_ADD: tl.constexpr, HAS_DR: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(n, BR·NB), S). DY, DX, DZ ``[n, S, D]`` contiguous; DW, DB ``[programs, S, D]``
    fp32: each program's partial sums over its NB tiles. With HAS_ADD, X holds the rows the
    forward normalized (x + a), DR (HAS_DR) their own gradient, added to dx, and DA gets
    the same sum in a's dtype."""
    i_p, s = tl.program_id(0), tl.program_id(1)
    o_d = tl.arange(0, BD)
    w = tl.load(W + s * WS + o_d, mask=o_d < D, other=0.0).to(tl.float32)
    bias = tl.zeros([BD], dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(B + s * WS + o_d, mask=o_d < D, other=0.0).to(tl.float32)
    dw = tl.zeros([BR, BD], dtype=tl.float32)  # per element: one reduction over tokens, at the end
    db = tl.zeros([BR, BD], dtype=tl.float32)
    for j in range(NB):
        o_t, o_d, m, px, pz = _tile(sx, sz, i_p * NB + j, s, n, D, BR, BD)
        po = o_t[:, None] * (S * D) + s * D + o_d[None, :]
        x, h, a, da = _row_input(X, Z, X, px, pz, px, m, ACT, GATE_FIRST, False)
        dy = tl.load(DY + po, mask=m, other=0.0).to(tl.float32)
        r = tl.load(RS + o_t * S + s, mask=o_t < n, other=0.0)
        if LAYER:
            mu = tl.load(MU + o_t * S + s, mask=o_t < n, other=0.0)
            h = tl.where(m, h - mu[:, None], 0.0)
        xh = h * r[:, None]
        if ACT != 0 and not GATE_FIRST:
            # y = (x̂·w + b)·act(z): the gate's gradient, then ∂ of the pre-gate output
            dz = dy * (xh * w[None, :] + bias[None, :]) * da
            tl.store(DZ + po, dz.to(DZ.dtype.element_ty), mask=m)
            dy = dy * a
        dw += dy * xh
        db += dy
        dxh = dy * w[None, :]
        dh = dxh - xh * (tl.sum(dxh * xh, 1) / D)[:, None]
        if LAYER:
            dh -= (tl.sum(dxh, 1) / D)[:, None]
        dh = tl.where(m, dh * r[:, None], 0.0)
        if GATE_FIRST:
            tl.store(DZ + po, (dh * x * da).to(DZ.dtype.element_ty), mask=m)
            dh = dh * a
        if HAS_DR:
            dh += tl.load(DR + po, mask=m, other=0.0).to(tl.float32)
        tl.store(DX + po, dh.to(DX.dtype.element_ty), mask=m)
        if HAS_ADD:
            tl.store(DA + po, dh.to(DA.dtype.element_ty), mask=m)
    part = (i_p * S + s) * D + o_d
    tl.store(DW + part, tl.sum(dw, 0), mask=o_d < D)
    if HAS_BIAS:
        tl.store(DB + part, tl.sum(db, 0), mask=o_d < D)


def _rows(t: torch.Tensor, S: int, D: int) -> tuple[torch.Tensor, int]:
    """``[..., S, D]`` → a ``[n, S·D]`` view with unit channel stride (a copy only where the
    leading dimensions do not flatten to one stride), and its token stride."""
    r = t.reshape(-1, S * D)
    if r.stride(1) != 1:
        r = r.contiguous()
    return r, r.stride(0)


class NormGate(torch.autograd.Function):
    """The autograd Function of :func:`norm_gate` and :func:`add_norm`: the normalized rows,
    and with ``a`` also the sum ``x + a`` they normalize."""

    @staticmethod
    def forward(ctx, x, z, w, b, a, layer, act, gate_first, eps, out_dtype):
        S, D = x.shape[-2:]
        xr, sx = _rows(x, S, D)
        zr, sz = _rows(z, S, D) if z is not None else (None, 0)
        ar = a.reshape(-1, S * D).contiguous() if a is not None else None
        n = xr.shape[0]
        f32 = dict(device=x.device, dtype=torch.float32)
        y = torch.empty(x.shape, device=x.device, dtype=out_dtype or x.dtype)
        r = torch.empty(x.shape, device=x.device, dtype=x.dtype) if a is not None else None
        rs = torch.empty(n, S, **f32)
        mu = torch.empty(n, S, **f32) if layer else None
        WS = D if w.numel() == S * D else 0
        BR, BD, warps = _token_tile(D)
        consts = dict(BR=BR, BD=BD, num_warps=warps, LAYER=layer, ACT=ACTS[act],
                      GATE_FIRST=gate_first, HAS_BIAS=b is not None,
                      HAS_ADD=a is not None)  # fmt: skip
        norm_gate_fwd_kernel[(cdiv(n, BR), S)](
            X=xr, Z=zr, A=ar, W=w, B=b, Y=y, R=r, RS=rs, MU=mu, n=n, S=S, D=D, sx=sx, sz=sz,
            WS=WS, eps=eps, **consts,
        )  # fmt: skip
        if a is not None:  # the backward reads the rows normalized: the sum
            xr, sx = r.view(n, S * D), S * D
        ctx.save_for_backward(xr, zr, w, b, rs, mu)
        ctx.meta = (x.shape, x.dtype, None if z is None else z.dtype,
                    None if a is None else a.dtype, y.dtype, sx, sz, WS, consts)  # fmt: skip
        ctx.set_materialize_grads(False)
        return y if a is None else (y, r)

    @staticmethod
    def backward(ctx, dy, dr=None):
        xr, zr, w, b, rs, mu = ctx.saved_tensors
        shape, xdtype, zdtype, adtype, ydtype, sx, sz, WS, consts = ctx.meta
        S, D = shape[-2:]
        n = xr.shape[0]
        programs = cdiv(n, consts["BR"] * NB)
        f32 = dict(device=xr.device, dtype=torch.float32)
        if dy is None:  # only the sum's gradient reached the call
            dy = torch.zeros(shape, device=xr.device, dtype=ydtype)
        dx = torch.empty(shape, device=xr.device, dtype=xdtype)
        dz = torch.empty(shape, device=xr.device, dtype=zdtype) if zr is not None else None
        da = torch.empty(shape, device=xr.device, dtype=adtype) if adtype is not None else None
        dw = torch.empty(programs, S, D, **f32)
        db = torch.empty(programs, S, D, **f32) if b is not None else None
        norm_gate_bwd_kernel[(programs, S)](
            X=xr, Z=zr, W=w, B=b, DY=dy.contiguous(),
            DR=None if dr is None else dr.contiguous(), RS=rs, MU=mu, DX=dx, DZ=dz, DA=da,
            DW=dw, DB=db, n=n, S=S, D=D, sx=sx, sz=sz, WS=WS, NB=NB, HAS_DR=dr is not None,
            **consts,
        )  # fmt: skip
        shared = WS == 0  # one weight row for all S slots: sum over them too
        dw = dw.sum((0, 1) if shared else 0).reshape(w.shape).to(w.dtype)
        if db is not None:
            db = db.sum((0, 1) if shared else 0).reshape(b.shape).to(b.dtype)
        return dx, dz, dw, db, da, None, None, None, None, None


def norm_gate(x, z, weight, bias=None, *, layer=False, act=None, gate_first=False, eps=1e-6,
              dtype=None):  # fmt: skip
    """Rows of ``x [..., S, D]`` normalized (RMSNorm, or LayerNorm with ``layer``), times
    ``weight`` (``[S·D]`` or ``[D]``) plus ``bias``, times ``act(z)`` (``act`` "silu" or
    "sigmoid", z shaped as x, or both None); with ``gate_first`` the row normalized is
    ``x·act(z)`` instead. fp32 inside, ``dtype`` (x's by default) out. x, z fp16, bf16 or
    fp32, the leading dimensions of each flattening to one stride. (Arguments checked by the
    caller, :func:`linrnn.layers.common.norm_gate`.)"""
    return NormGate.apply(x, z, weight, bias, None, layer, act, gate_first, eps, dtype)


def add_norm(x, a, weight, bias=None, *, layer=False, eps=1e-6, dtype=None):
    """``(r, norm(r)·weight + bias)`` with ``r = x + a`` in x's dtype (``a`` shaped as x, any
    float dtype; None: r is x) and the norm in ``dtype`` (x's by default), as
    :func:`norm_gate` without a gate forms it: one pass each way."""
    if a is None:
        return x, norm_gate(x, None, weight, bias, layer=layer, eps=eps, dtype=dtype)
    y, r = NormGate.apply(x, None, weight, bias, a, layer, None, False, eps, dtype)
    return r, y
