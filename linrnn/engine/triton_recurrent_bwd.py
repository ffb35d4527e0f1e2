"""Backward of the Triton recurrent kernel (``mode="recurrent"`` with gradients): the same
recurrence with chunk length 1, as in triton_fused's walks.

* ``recurrent_dq_kernel``  grid (K tiles, N·H), state S[BK, V] recomputed walking forward:
  dq_t = scale·(S_t dO_t + dd_t n_t) (exclusive: S_{t-1} dO_t plus the bonus term).
* ``recurrent_dkv_kernel`` grid (K tiles, V tiles, N·H), dS in registers walking backward;
  launched once with the whole V (dk, dS_0, dn_0, du) and once with the whole K (dv):
  dS_{t-1} = decay_t ⊙ dS_t (+ scale·q_t dO_tᵀ, added before the read for the inclusive form
  and after it for the exclusive one).

dO_t is the cotangent of the unnormalized output (A_t·dh_t, A = 1/denominator) and dd_t that of
the denominator (triton_chunk._norm_rows, from the denominators the forward saved). The
kernels also store the per-channel pieces of the gate gradients — q⊙dq and k⊙dk (state parts
only for the exclusive form, q's shifted one step back since q_{t+1} reads F_t), v⊙dv — and the
host turns them into ∂L/∂g by the reverse cumulative sum of triton_chunk's module docstring.
Scalar gates (and mLSTM's max state m) reuse triton_chunk._gate_grads.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from linrnn.engine import triton_chunk
from linrnn.engine import triton_recurrent as fwd
from linrnn.engine.host_math import cdiv, next_pow2
from linrnn.engine.triton_common import _start_state


@triton.jit
def _step_inputs(Q, K_, V_, DO, R_A, R_D, row, i_h, o_k, m_k, o_v, m_v, T, H, K, V,
                 NORM: tl.constexpr):  # fmt: skip
    """Step ``row``'s index in the [N·H, T] row tensors, its q, k, v and dh (fp32; dh times the
    normalizer's 1/denominator) and the normalizer's row gradient dd (0 without one)."""
    rid = (row // T * H + i_h) * T + row % T
    b_q = tl.load(Q + (row * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(K_ + (row * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_v = tl.load(V_ + (row * H + i_h) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
    b_do = tl.load(DO + (row * H + i_h) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
    b_dd = 0.0
    if NORM != 0:
        b_do = b_do * tl.load(R_A + rid)
        b_dd = tl.load(R_D + rid)
    return rid, b_q, b_k, b_v, b_do, b_dd


@triton.jit
def _step_gates(G, GV, GI, row, i_h, o_k, m_k, o_v, m_v, K, V, H,
                DECAY: tl.constexpr, HAS_GV: tl.constexpr, HAS_IGATE: tl.constexpr):  # fmt: skip
    """This step's decay over K (a vector, ones without decay), over V, and input weight."""
    a_k = tl.full(o_k.shape, 1.0, tl.float32)
    a_v = tl.full(o_v.shape, 1.0, tl.float32)
    w = 1.0
    if DECAY == 1:
        a_k = a_k * tl.exp(tl.load(G + row * H + i_h))
    elif DECAY == 2:
        a_k = tl.exp(tl.load(G + (row * H + i_h) * K + o_k, mask=m_k, other=0.0))
    if HAS_GV:
        a_v = tl.exp(tl.load(GV + (row * H + i_h) * V + o_v, mask=m_v, other=0.0))
    if HAS_IGATE:
        w = tl.exp(tl.load(GI + row * H + i_h))
    return a_k, a_v, w


@triton.jit(do_not_specialize=["T"])
def recurrent_dq_kernel(
    Q, K_, V_, DO, G, GV, GI, U, S0, N0, M0, M_ROW, R_A, R_D, DQ, QDQ, OFFSETS,
    T, H, K, V, scale,
    BK: tl.constexpr, BV: tl.constexpr, DECAY: tl.constexpr, HAS_GV: tl.constexpr,
    HAS_IGATE: tl.constexpr, STAB: tl.constexpr, EXCLUSIVE: tl.constexpr,
    TRACK_N: tl.constexpr, NORM: tl.constexpr, HAS_S0: tl.constexpr, VARLEN: tl.constexpr,
    SAVE_QDQ: tl.constexpr,
):  # fmt: skip
    """Grid (K tiles, N·H); the whole value dimension is held (BV ≥ V)."""
    i_k, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_n, i_h = i_nh // H, i_nh % H
    if VARLEN:
        bos = tl.load(OFFSETS + i_n).to(tl.int64)
        n_steps = (tl.load(OFFSETS + i_n + 1) - bos).to(tl.int32)
        row0 = bos
    else:
        n_steps = T
        row0 = i_n * T
    o_k, o_v = i_k * BK + tl.arange(0, BK), tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    b_S, b_n = _start_state(S0, N0, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_S0, TRACK_N, BK, BV)
    if STAB and HAS_S0:  # m_{t-1}: the initial m, −∞ without a state
        b_m = tl.load(M0 + i_nh).to(tl.float32)
    else:
        b_m = tl.max(tl.full([2], float("-inf"), tl.float32), 0)
    if EXCLUSIVE:
        b_u = tl.load(U + i_h * K + o_k, mask=m_k, other=0.0)
    for t in range(n_steps):
        row = row0 + t
        rid, b_q, b_k, b_v, b_do, b_dd = _step_inputs(Q, K_, V_, DO, R_A, R_D, row, i_h, o_k, m_k,
                                                      o_v, m_v, T, H, K, V, NORM)  # fmt: skip
        if EXCLUSIVE:
            b_dqs = tl.sum(b_S * b_do[None, :], 1) * scale
            b_dq = b_dqs + b_u * b_k * (tl.sum(b_v * b_do) * scale)
            if SAVE_QDQ:  # q_t reads F_{t-1}: store at the previous token (none at t = 0)
                p = QDQ + ((row - 1) * H + i_h) * K + o_k
                tl.store(p, b_q * b_dqs, mask=m_k & (t > 0))
        a_k, a_v, w = _step_gates(G, GV, GI, row, i_h, o_k, m_k, o_v, m_v, K, V, H,
                                  DECAY, HAS_GV, HAS_IGATE)  # fmt: skip
        if STAB:
            m_new = tl.load(M_ROW + rid)
            a_k = a_k * tl.exp(tl.load(G + row * H + i_h) + b_m - m_new)
            w = tl.exp(tl.load(GI + row * H + i_h) - m_new)
            b_m = m_new
        b_S = b_S * a_k[:, None] * a_v[None, :] + (b_k * w)[:, None] * b_v[None, :]
        if TRACK_N:
            b_n = b_n * a_k + b_k * w
        if not EXCLUSIVE:
            b_dq = (tl.sum(b_S * b_do[None, :], 1) + b_dd * b_n) * scale
            if SAVE_QDQ:
                tl.store(QDQ + (row * H + i_h) * K + o_k, b_q * b_dq, mask=m_k)
        tl.store(DQ + (row * H + i_h) * K + o_k, b_dq, mask=m_k)


@triton.jit(do_not_specialize=["T"])
def recurrent_dkv_kernel(
    Q, K_, V_, DO, G, GV, GI, U, M0, M_ROW, R_A, R_D, DS_T, DN_T, DK, DV, KDK, VDV, DU, DS0,
    DN0, OFFSETS, T, H, K, V, scale,
    BK: tl.constexpr, BV: tl.constexpr, DECAY: tl.constexpr, HAS_GV: tl.constexpr,
    HAS_IGATE: tl.constexpr, STAB: tl.constexpr, EXCLUSIVE: tl.constexpr,
    TRACK_N: tl.constexpr, NORM: tl.constexpr, HAS_S0: tl.constexpr, VARLEN: tl.constexpr,
    HAS_DST: tl.constexpr, IS_DK: tl.constexpr, SAVE_KDK: tl.constexpr, SAVE_VDV: tl.constexpr,
):  # fmt: skip
    """Grid (K tiles, V tiles, N·H), walking backward. IS_DK: the whole V is held (one V
    tile): dk, k⊙dk, du and the initial-state gradients. Else the whole K (one K tile): dv."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_n, i_h = i_nh // H, i_nh % H
    if VARLEN:
        bos = tl.load(OFFSETS + i_n).to(tl.int64)
        n_steps = (tl.load(OFFSETS + i_n + 1) - bos).to(tl.int32)
        row0 = bos
    else:
        n_steps = T
        row0 = i_n * T
    o_k, o_v = i_k * BK + tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_s = i_nh * K * V + o_k[:, None] * V + o_v[None, :]
    b_dS, b_dn = _start_state(DS_T, DN_T, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_DST, TRACK_N, BK,
                              BV)  # fmt: skip
    if STAB and HAS_S0:
        b_m0 = tl.load(M0 + i_nh).to(tl.float32)
    else:
        b_m0 = tl.max(tl.full([2], float("-inf"), tl.float32), 0)
    if EXCLUSIVE:
        b_u = tl.load(U + i_h * K + o_k, mask=m_k, other=0.0)
        b_du = tl.zeros([BK], dtype=tl.float32)
    for j in range(n_steps):
        t = n_steps - 1 - j
        row = row0 + t
        rid, b_q, b_k, b_v, b_do, b_dd = _step_inputs(Q, K_, V_, DO, R_A, R_D, row, i_h, o_k, m_k,
                                                      o_v, m_v, T, H, K, V, NORM)  # fmt: skip
        a_k, a_v, w = _step_gates(G, GV, GI, row, i_h, o_k, m_k, o_v, m_v, K, V, H,
                                  DECAY, HAS_GV, HAS_IGATE)  # fmt: skip
        if STAB:
            m_t = tl.load(M_ROW + rid)
            m_prev = tl.load(M_ROW + rid - 1, mask=t > 0, other=0.0)
            m_prev = tl.where(t > 0, m_prev, b_m0)
            a_k = a_k * tl.exp(tl.load(G + row * H + i_h) + m_prev - m_t)
            w = tl.exp(tl.load(GI + row * H + i_h) - m_t)
        if EXCLUSIVE:  # dS holds ∂L/∂S_t; o_t read S_{t-1} and the bonus
            if IS_DK:
                b_vdo = tl.sum(b_v * b_do) * scale
                b_dks = tl.sum(b_dS * b_v[None, :], 1)
                b_dk = b_dks + b_u * b_q * b_vdo
                b_du += b_q * b_k * tl.sum(b_v * b_do)
                if SAVE_KDK:
                    tl.store(KDK + (row * H + i_h) * K + o_k, b_k * b_dks, mask=m_k)
            else:
                b_dv = tl.sum(b_dS * b_k[:, None], 0) + tl.sum(b_q * b_u * b_k) * scale * b_do
            b_dS = b_dS * a_k[:, None] * a_v[None, :] + (b_q * scale)[:, None] * b_do[None, :]
        else:
            b_dS += (b_q * scale)[:, None] * b_do[None, :]
            if TRACK_N:
                b_dn += b_q * (scale * b_dd)
            if IS_DK:
                b_dk = (tl.sum(b_dS * b_v[None, :], 1) + b_dn) * w
                if SAVE_KDK:
                    tl.store(KDK + (row * H + i_h) * K + o_k, b_k * b_dk, mask=m_k)
            else:
                b_dv = tl.sum(b_dS * b_k[:, None], 0) * w
            b_dS = b_dS * a_k[:, None] * a_v[None, :]
            b_dn = b_dn * a_k
        if IS_DK:
            tl.store(DK + (row * H + i_h) * K + o_k, b_dk, mask=m_k)
        else:
            tl.store(DV + (row * H + i_h) * V + o_v, b_dv, mask=m_v)
            if SAVE_VDV:
                tl.store(VDV + (row * H + i_h) * V + o_v, b_v * b_dv, mask=m_v)
    if IS_DK:
        tl.store(DS0 + p_s, b_dS, mask=m_kv)
        if TRACK_N:
            tl.store(DN0 + i_nh * K + o_k, b_dn, mask=m_k)
        if EXCLUSIVE:
            tl.store(DU + i_nh * K + o_k, b_du * scale, mask=m_k)


class _Cfg(SimpleNamespace):
    """The switches of one call (duck-typed as triton_chunk.Config for its helpers)."""


def _ends(c: _Cfg, T: int, device):
    """Per token: the index one past its sequence's last token (None without packing)."""
    if not c.varlen:
        return None
    off = torch.tensor(c.offsets, device=device)
    lens = off[1:] - off[:-1]
    return torch.repeat_interleave(off[1:], lens)


def _add_at_last(x, vals, c: _Cfg):
    """x [B, T, H, D] += vals [N, H, D] at each (non-empty) sequence's last token."""
    if not c.varlen:
        x[:, -1] += vals
        return
    for n in range(c.N):
        if c.offsets[n + 1] > c.offsets[n]:
            x[0, c.offsets[n + 1] - 1] += vals[n]


def _rev_cumsum(x, c: _Cfg):
    """Σ_{s ≥ t} x_s within each sequence, along dim 1, in fp64."""
    x = x.double()
    cs = x.flip(1).cumsum(1).flip(1)
    ends = _ends(c, x.shape[1], x.device)
    if ends is None:
        return cs
    cs = torch.cat([cs, torch.zeros_like(cs[:, :1])], 1)
    return cs[:, :-1] - cs[:, ends]


class _RecurrentFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, gv, gi, u, S0, n0, m0, c: _Cfg):
        B, T, H = q.shape[:3]
        f32 = dict(device=q.device, dtype=torch.float32)
        den = torch.empty(B * H, T, **f32) if c.norm else None
        m_row = torch.empty(B * H, T, **f32) if c.stab else None
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o, S_T, n_T, m_T = fwd.recurrent(
            q, k, v, scale=c.scale, g=g, gv=gv, gi=gi, u=u, stabilize=c.stab,
            track_n=c.track_n, normalizer=c.normalizer, eps=c.eps, S0=S0, n0=n0, m0=m0,
            offsets=c.offsets, saved=(den, m_row),
        )  # fmt: skip
        ctx.c = c
        ctx.save_for_backward(q, k, v, g, gv, gi, u, S0, n0, m0, o, S_T, n_T, den, m_row)
        return o, S_T, n_T, m_T

    @staticmethod
    def backward(ctx, do, dS_T, dn_T, dm_T):
        c = ctx.c
        q, k, v, g, gv, gi, u, S0, n0, m0, o, S_T, n_T, den, m_row = ctx.saved_tensors
        B, T, H, K = q.shape
        V = v.shape[3]
        dev = q.device
        f32 = dict(device=dev, dtype=torch.float32)
        dummy = torch.empty(1, **f32)
        do = do.contiguous()
        R_A, R_D, R_M = triton_chunk._norm_rows(
            do, o, den if den is not None else dummy, m_row if m_row is not None else dummy, c
        )
        has_dst, dS_T, dn_T = triton_chunk._final_grads(dS_T, dn_T, q, K, V, c)
        decay = 0 if g is None else (fwd.DECAY_VECTOR if g.dim() == 4 else fwd.DECAY_SCALAR)
        has_gates = g is not None or gi is not None
        opt = lambda x: dummy if x is None else x  # noqa: E731
        flags = dict(  # mLSTM-exp applies its gates through STAB alone
            DECAY=0 if c.stab else decay, HAS_GV=gv is not None,
            HAS_IGATE=gi is not None and not c.stab, STAB=c.stab, EXCLUSIVE=u is not None,
            TRACK_N=c.track_n, NORM=c.norm, HAS_S0=S0 is not None, VARLEN=c.varlen,
        )  # fmt: skip
        offsets = torch.tensor(c.offsets, device=dev) if c.varlen else dummy
        gates = (opt(g), opt(gv), opt(gi), opt(u))
        NH = c.N * H
        KP, VP = max(16, next_pow2(K)), max(16, next_pow2(V))
        BKt = max(16, min(64, 8192 // VP, KP))
        BVt = max(16, min(64, 8192 // KP, VP))

        dq = torch.empty(B, T, H, K, **f32)
        qdq = torch.zeros(B, T, H, K, **f32) if g is not None else dummy
        recurrent_dq_kernel[(cdiv(K, BKt), NH)](
            q, k, v, do, *gates, opt(S0), opt(n0), opt(m0), opt(m_row), R_A, R_D, dq, qdq,
            offsets, T, H, K, V, c.scale, BK=BKt, BV=VP, SAVE_QDQ=g is not None, **flags,
        )  # fmt: skip
        dk = torch.empty(B, T, H, K, **f32)
        kdk = torch.zeros(B, T, H, K, **f32) if has_gates else dummy
        du = torch.empty(NH, K, **f32) if u is not None else dummy
        dS0 = torch.empty(c.N, H, K, V, **f32)
        dn0 = torch.empty(c.N, H, K, **f32) if c.track_n else dummy
        dst = (dS_T if has_dst else dummy, dn_T if (has_dst and c.track_n) else dummy)
        common = (q, k, v, do, *gates, opt(m0), opt(m_row), R_A, R_D, *dst)
        recurrent_dkv_kernel[(cdiv(K, BKt), 1, NH)](
            *common, dk, dummy, kdk, dummy, du, dS0, dn0, offsets, T, H, K, V, c.scale,
            BK=BKt, BV=VP, HAS_DST=has_dst, IS_DK=True, SAVE_KDK=has_gates, SAVE_VDV=False,
            **flags,
        )  # fmt: skip
        dv = torch.empty(B, T, H, V, **f32)
        vdv = torch.empty(B, T, H, V, **f32) if gv is not None else dummy
        recurrent_dkv_kernel[(1, cdiv(V, BVt), NH)](
            *common, dummy, dv, dummy, vdv, dummy, dummy, dummy, offsets, T, H, K, V, c.scale,
            BK=KP, BV=BVt, HAS_DST=has_dst, IS_DK=False, SAVE_KDK=False,
            SAVE_VDV=gv is not None, **flags,
        )  # fmt: skip

        dm0 = None
        if S0 is not None and c.stab:
            dm0 = (dS0 * S0).sum((-2, -1)) + (dn0 * n0).sum(-1)
        dg = dgv = dgi = None
        if decay != fwd.DECAY_VECTOR and gv is None:
            if has_gates:  # scalar gates, and the mLSTM max state: the chunk engine's routing
                rows = lambda x: triton_chunk._rows(x.sum(-1))  # noqa: E731
                dg, dgi, dm0 = triton_chunk._gate_grads(
                    g, gi, (B, T, H), rows(qdq) if g is not None else None, rows(kdk), R_M,
                    S_T, n_T, None, dS_T if has_dst else None, dn_T if has_dst else None,
                    dm_T, m0, dm0, c,
                )  # fmt: skip
        else:
            if g is not None:
                dF = qdq.double() - kdk
                if has_dst:
                    end = (dS_T * S_T).sum(-1)
                    if c.track_n:
                        end = end + dn_T * n_T
                    if decay == fwd.DECAY_SCALAR:
                        end = end.sum(-1, keepdim=True)
                if decay == fwd.DECAY_SCALAR:
                    dF = dF.sum(-1, keepdim=True)
                if has_dst:
                    _add_at_last(dF, end.double(), c)
                dg = _rev_cumsum(dF, c).float()
                if decay == fwd.DECAY_SCALAR:
                    dg = dg[..., 0]
            if gv is not None:
                dFv = o.double() * do - vdv
                if has_dst:
                    _add_at_last(dFv, (dS_T * S_T).sum(-2).double(), c)
                dgv = _rev_cumsum(dFv, c).float()
            if gi is not None:
                dgi = kdk.sum(-1)
        dS0r = dn0r = None
        if S0 is not None:
            dS0r, dn0r = dS0, (dn0 if c.track_n else None)
        dur = du.view(c.N, H, K).sum(0) if u is not None else None
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, dgv, dgi, dur, dS0r,
                dn0r, dm0, None)  # fmt: skip


def fp32_contiguous(x):
    return None if x is None else x.float().contiguous()


def prepare_state(S0, n0, m0, track_n: bool, stabilize: bool):
    """The initial state as the kernels take it: fp32, contiguous, a missing n_0 / m_0 as
    zeros (None without an initial state, or where the family has no n / m)."""
    if S0 is None:
        return None, None, None
    if track_n and n0 is None:
        n0 = S0.new_zeros(S0.shape[:3])
    if stabilize and m0 is None:
        m0 = S0.new_zeros(S0.shape[:2])
    return (S0.float().contiguous(), fp32_contiguous(n0) if track_n else None,
            fp32_contiguous(m0) if stabilize else None)  # fmt: skip


def recurrent(q, k, v, *, scale, g=None, gv=None, gi=None, u=None, stabilize=False,
              track_n=False, normalizer=None, eps=0.0, S0=None, n0=None, m0=None,
              offsets=None):  # fmt: skip
    """:func:`triton_recurrent.recurrent` with autograd (same arguments; gates fp32).
    Returns ``(o, S_T, n_T, m_T)``."""
    B = q.shape[0]
    if u is not None and gv is not None:
        raise NotImplementedError("the recurrent backward has no exclusive form with gv")
    offs = None if offsets is None else [int(x) for x in offsets]
    c = _Cfg(
        scale=float(scale), eps=float(eps), normalizer=normalizer, stab=stabilize,
        track_n=track_n, varlen=offs is not None, offsets=offs,
        N=B if offs is None else len(offs) - 1,
        norm={None: 0, "sum": 1, "mlstm": 3 if stabilize else 2}[normalizer],
        has_decay=g is not None, has_igate=gi is not None,
    )  # fmt: skip
    S0, n0, m0 = prepare_state(S0, n0, m0, track_n, stabilize)
    g, gv, gi, u = map(fp32_contiguous, (g, gv, gi, u))
    return _RecurrentFn.apply(q, k, v, g, gv, gi, u, S0, n0, m0, c)
