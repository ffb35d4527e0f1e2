"""dq and dk of gk-only calls in chunk mode (GLA without gv, RWKV6) from one kernel, and, in
fast chunks, their log-decay gradient too.

One program per (chunk, K tile, b·h) forms the inter-chunk parts of both gradients from the
same row tiles of the chunk (dq's do Cᵀ gated by e^{G^X}, dk's v dCᵀ gated by e^{G_L − G^K};
triton_kernels._vec_state_part), then

* in a fast chunk (its span below LIM, triton_scores' fast chunks): adds the intra-chunk parts
  around the chunk's middle from the stored ungated P = do vᵀ (triton_vector._chunk_fast_out),
  stores dq and dk, and reverse-sums q ⊙ dq − k ⊙ dk over the chunk in registers, the row tiles
  walked from the chunk's end with the running sum carried from the exact tail W_c
  (triton_gate_grad's formula, RWKV6's bonus terms and ∂L/∂u's chunk sums included), so
  neither fp32 product goes through memory;
* in another chunk (strong decays: the sub-chunk forms): stores the two inter-chunk parts
  alone (fp32, unscaled) for the 16-row dq/dk programs of triton_kernels to load (their
  ``STATE_IN``); those programs and decay_grad_kernel skip the fast chunks.

Before this kernel (session 9) the same work took two apply_kernel launches, each loading the
chunk's rows, gates and P on its own, and a third pass reading back both fp32 products.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_kernels import _bounds, _fast_chunk, _vec_state_part
from linrnn.engine.triton_vector import _chunk_fast_out


@triton.jit(do_not_specialize=["T", "NT"])
def fast_grad_kernel(
    Q, K_, V_, DO, P, ST, DST, GX, GK, U, W, SPAN, DQ, DK, QD, KD, DG, DU, CHUNKS,
    T, H, K, V, L, NT, scale,
    BQ: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    VARLEN: tl.constexpr, EXCL: tl.constexpr, DOT_PREC: tl.constexpr, LIM: tl.constexpr,
):  # fmt: skip
    """Grid (chunks, K tiles, B·H). q, k, dq, dk ``[B, T, H, K]``; v, do ``[B, T, H, V]``; P
    ``[B, T, H, L]`` fp32 (do vᵀ per chunk); ST the states entering the chunks and DST the
    gradients of those leaving them (``[B·H, NT, K, V]`` fp32); GX, GK the chunk-local gate
    cumsums (``[B, T, H, K]`` fp32; RWKV6's G^X exclusive); U ``[H, K]``; W ``[B·H, NT, K]``
    the exact tails; SPAN ``[NT, B·H]``. Fast chunks: DQ, DK and DG (fp32) and, ``EXCL``, DU
    ``[B·H, NT, K]`` (the chunk's Σ scale·q ⊙ k (do·v)). Other chunks: QD, KD (fp32) the
    inter-chunk parts. LIM 0: no chunk is fast."""
    i_c, i_o, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    c0, c1, _ = _bounds(CHUNKS, i_c, L, T, VARLEN)
    o_o = i_o * BO + tl.arange(0, BO)
    m_o = o_o < K
    base = i_b * T * H + i_h
    p_gx, p_gk, p_u = GX + base * K, GK + base * K, U + i_h * K
    p_p = P + base * L - c0  # P[r, s] at p_p + r·H·L + s (triton_vector._ld_p)
    p_st = ST + (i_bh * NT + i_c) * K * V
    p_dst = DST + (i_bh * NT + i_c) * K * V
    fast = _fast_chunk(SPAN, i_c, i_bh, tl.num_programs(2), LIM)
    row = (i_bh * NT + i_c) * K
    carry = tl.load(W + row + o_o, mask=m_o, other=0.0)  # the tail after the chunk
    b_u = tl.zeros([BO], dtype=tl.float32)
    if EXCL:
        b_u = tl.load(p_u + o_o, mask=m_o, other=0.0).to(tl.float32)
    du = tl.zeros([BO], dtype=tl.float32)
    n_r = tl.cdiv(c1 - c0, BQ)
    for j in range(0, n_r):  # row tiles from the chunk's end (the reverse sum's order)
        r0 = c0 + (n_r - 1 - j) * BQ
        o_r = r0 + tl.arange(0, BQ)
        m_r = o_r < c1
        m = m_r[:, None] & m_o[None, :]
        p_out = base * K + o_r.to(tl.int64)[:, None] * H * K + o_o[None, :]
        # Cᵀ and dCᵀ: element (v, k) at k·V + v
        q_int = _vec_state_part(DO + base * V, p_st, p_gx, p_gx, o_r, m_r, o_o, m_o, c1, V,
                                H * V, H * K, 1, V, BQ, BD, BO, False, False, True,
                                DOT_PREC)  # fmt: skip
        k_int = _vec_state_part(V_ + base * V, p_dst, p_gk, p_gk, o_r, m_r, o_o, m_o, c1, V,
                                H * V, H * K, 1, V, BQ, BD, BO, True, False, True,
                                DOT_PREC)  # fmt: skip
        if fast:
            q_in = _chunk_fast_out(p_p, K_ + base * K, p_gx, p_gk, p_u, o_r, m_r, r0, c0, c1,
                                   o_o, m_o, H * K, H * L, BQ, BS, BO, False, EXCL,
                                   DOT_PREC)  # fmt: skip
            k_in = _chunk_fast_out(p_p, Q + base * K, p_gk, p_gx, p_u, o_r, m_r, r0, c0, c1,
                                   o_o, m_o, H * K, H * L, BQ, BS, BO, True, EXCL,
                                   DOT_PREC)  # fmt: skip
            b_dq = scale * (q_in + q_int)
            b_dk = scale * k_in + k_int  # the state gradient carries the scale already
            tl.store(DQ + p_out, b_dq.to(DQ.dtype.element_ty), mask=m)
            tl.store(DK + p_out, b_dk.to(DK.dtype.element_ty), mask=m)
            b_q = tl.load(Q + p_out, mask=m, other=0.0).to(tl.float32)
            b_k = tl.load(K_ + p_out, mask=m, other=0.0).to(tl.float32)
            qd = b_q * b_dq
            x = qd - b_k * b_dk  # 0 on rows past the chunk
            b_dg = tl.cumsum(x, 0, reverse=True) + carry[None, :]
            carry += tl.sum(x, 0)
            if EXCL:  # the query term is exclusive: less q ⊙ dq, plus u ⊙ w (triton_gate_grad)
                p_rr = tl.load(p_p + o_r.to(tl.int64) * H * L + o_r, mask=m_r, other=0.0)
                w = b_q * b_k * (p_rr * scale)[:, None]
                b_dg += b_u[None, :] * w - qd
                du += tl.sum(w, 0)
            tl.store(DG + p_out, b_dg, mask=m)
        else:
            tl.store(QD + p_out, q_int, mask=m)
            tl.store(KD + p_out, k_int, mask=m)
    if EXCL and fast:
        tl.store(DU + row + o_o, du, mask=m_o)
