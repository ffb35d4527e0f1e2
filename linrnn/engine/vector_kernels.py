"""Triton kernels of chunk mode for per-channel (vector) decays: GLA's gk (with or without gv)
and RWKV6's w with the bonus u. One kernel per job:

* ``states_fwd_kernel``: walks a sequence's chunks; the state entering each chunk, the final
  state.
* ``states_bwd_kernel``: walks them back; the gradient of the state leaving each chunk and of
  the initial state, and the decay gradients' exact tails at each chunk end (Σ_v dS ⊙ S per K
  channel; with gv, Σ_k per V channel).
* ``out_fwd_kernel``: the output of calls with gv (gk alone stores its intra-chunk scores and
  applies them instead: vector_scores_kernels).
* ``dq_bwd_kernel``, ``dk_bwd_kernel``: dq and dk by sub-chunks of BQ / BS rows, with
  q ⊙ dq and k ⊙ dk for the decay gradient.
* ``dv_bwd_kernel``: dv of calls with gv (gk alone: vector_scores_kernels.apply_kernel).

The products, the sub-chunk split and the diagonal's forms are vector_common's. Layouts: token
tensors ``[B, T, H, D]`` contiguous, gate cumsums ``[B, T, H, D]`` fp32 (G^X the query side:
inclusive, or exclusive for RWKV6; G^K the key side), chunk states ``[B·H, NT, K, V]``. Packed
sequences (``VARLEN``): B = 1, chunks from the table ``chunks`` ([NT, 3]: start, end,
sequence), each sequence's first chunk in ``co``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import (
    _bounds,
    _chunk_rows,
    _start_state,
    _state_tile,
    _tile,
    _walk,
)
from linrnn.engine.vector_common import (
    _fast_chunk,
    _vec_cols_off,
    _vec_diag,
    _vec_rows_off,
    _vec_state_bwd,
    _vec_state_fwd,
    _vec_state_part,
)


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def states_fwd_kernel(
    k, v, gk, gv, h0, h, ht, co, chunks,
    T, H, K, V, L, NT, NSEQ,
    BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr, USE_GV: tl.constexpr,
    HAS_H0: tl.constexpr, PRE_GATED: tl.constexpr, DOT_PREC: tl.constexpr,
    VARLEN: tl.constexpr, ONE_TILE: tl.constexpr,
):  # fmt: skip
    """Grid (K tiles, V tiles, N·H). Stores h [B·H, NT, K, V] fp32, the state entering each
    chunk, and ht [N, H, K, V] fp32, the final one; h0 [N, H, K, V] fp32 the initial one
    (``HAS_H0``). ``PRE_GATED``: k is k ⊙ exp(G^K_L − G^K) already (vector_cumsum_kernels'
    KG). ``ONE_TILE`` (L ≤ BS): the chunk loop is the innermost loop, software-pipelined."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, _seq = _walk(co, i_nh, H, NT, VARLEN)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    base = i_b * T * H + i_h
    p_gv = gv
    if USE_GV:
        p_gv = gv + base * V
    b_h, _b_n0 = _start_state(h0, h0, i_st, o_k, o_v, K, V, m_k, m_v, HAS_H0, False, BK, BV)
    p_h = h + i_bh * NT * K * V
    for i_c in range(c_lo, c_hi):
        c0, c1, _seq_c = _bounds(chunks, i_c, L, T, VARLEN)
        p = p_h + i_c * K * V + o_k[:, None] * V + o_v[None, :]
        tl.store(p, b_h.to(h.dtype.element_ty), mask=m_kv)
        b_h = _vec_state_fwd(
            b_h, k + base * K, v + base * V, gk + base * K, p_gv, c0, c1, o_k, m_k, o_v, m_v,
            K, V, H, BS, USE_GV, DOT_PREC, PRE_GATED, ONE_TILE,
        )  # fmt: skip
    p = ht + i_st * K * V + o_k[:, None] * V + o_v[None, :]
    tl.store(p, b_h.to(ht.dtype.element_ty), mask=m_kv)


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def states_bwd_kernel(
    q, do, gkx, gk, gv, h, ht, dht, dh, dh0, bnd_k, bnd_v, co, chunks,
    T, H, K, V, L, NT, NSEQ, scale,
    BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr, USE_GV: tl.constexpr,
    HAS_DHT: tl.constexpr, PRE_GATED: tl.constexpr, DOT_PREC: tl.constexpr,
    VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (K tiles, V tiles, N·H), walking each sequence's chunks back. Stores dh [B·H, NT,
    K, V] (in its dtype), the gradient of the state leaving each chunk, and dh0 [N, H, K, V]
    fp32, the initial state's; dht the final state's (``HAS_DHT``). Also the decay gradients'
    tails at each chunk end from the state leaving it (h of the next chunk, or ht): this V
    tile's Σ_v dh ⊙ h into bnd_k [B·H, NT, V tiles, K] and (``USE_GV``) this K tile's Σ_k into
    bnd_v [B·H, NT, K tiles, V], fp32. ``PRE_GATED``: q is q ⊙ exp(G^X) already
    (vector_cumsum_kernels' QG)."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, _seq = _walk(co, i_nh, H, NT, VARLEN)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    base = i_b * T * H + i_h
    p_gv = gv
    if USE_GV:
        p_gv = gv + base * V
    b_dh, _b_dn0 = _start_state(dht, dht, i_st, o_k, o_v, K, V, m_k, m_v, HAS_DHT, False, BK, BV)
    for j in range(c_hi - c_lo):
        i_c = c_hi - 1 - j
        c0, c1, _seq_c = _bounds(chunks, i_c, L, T, VARLEN)
        p = dh + (i_bh * NT + i_c) * K * V + o_k[:, None] * V + o_v[None, :]
        tl.store(p, b_dh.to(dh.dtype.element_ty), mask=m_kv)
        if i_c + 1 < c_hi:  # the state leaving the chunk
            p_nx = h + (i_bh * NT + i_c + 1) * K * V
        else:
            p_nx = ht + i_st * K * V
        b_pr = b_dh * _state_tile(p_nx, o_k, o_v, V, 1, m_k, m_v).to(tl.float32)  # [BK, BV]
        p_bk = bnd_k + ((i_bh * NT + i_c) * tl.num_programs(1) + i_v) * K + o_k
        tl.store(p_bk, tl.sum(b_pr, 1), mask=m_k)
        if USE_GV:
            p_bv = bnd_v + ((i_bh * NT + i_c) * tl.num_programs(0) + i_k) * V + o_v
            tl.store(p_bv, tl.sum(b_pr, 0), mask=m_v)
        b_dh = _vec_state_bwd(
            b_dh, q + base * K, do + base * V, gkx + base * K, gk + base * K, p_gv, c0, c1, o_k,
            m_k, o_v, m_v, K, V, H, scale, BS, USE_GV, DOT_PREC, PRE_GATED,
        )  # fmt: skip
    p = dh0 + i_st * K * V + o_k[:, None] * V + o_v[None, :]
    tl.store(p, b_dh, mask=m_kv)


@triton.jit(do_not_specialize=["T", "NT", "NQ"])
def out_fwd_kernel(
    q, k, v, h, gkx, gk, gv, o, o32, chunks,
    T, H, K, V, L, NT, NQ, scale,
    BQ: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    BLOCK_DIAG: tl.constexpr, DIAG_SPAN: tl.constexpr, DOT_PREC: tl.constexpr,
    VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × sub-chunks, V tiles, B·H), calls with gv: the rows o_r of one sub-chunk,

        o_r = scale·[(q_r ⊙ e^{G^X_r}) h_c ⊙ e^{G^V_r} + Σ_{s≤r} P_rs v_s ⊙ e^{G^V_r − G^V_s}],
        P_rs = Σ_k q_r k_s e^{G^X_r − G^K_s},

    into o (the inputs' dtype) and o32 (fp32, for gv's gradient). BS: the tile of earlier keys;
    the walk over the diagonal sub-chunk unrolled (``BLOCK_DIAG``: the interpreter's block form;
    ``DIAG_SPAN``: vector_common's fast form)."""
    i_cq, i_o, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    i_c, c0, c1, _i_n, r0, o_r, m_r = _chunk_rows(chunks, i_cq, NQ, L, T, BQ, VARLEN)
    if r0 >= c1:
        return
    o_v = i_o * BO + tl.arange(0, BO)
    m_v = o_v < V
    base = i_b * T * H + i_h
    p_q, p_k, p_v = q + base * K, k + base * K, v + base * V
    p_gkx, p_gk, p_gv = gkx + base * K, gk + base * K, gv + base * V
    b_o = _vec_state_part(
        p_q, h + (i_bh * NT + i_c) * K * V, p_gkx, p_gv, o_r, m_r, o_v, m_v, c1, K, H * K, H * V,
        V, 1, BQ, BD, BO, False, True, True, DOT_PREC,
    )  # fmt: skip
    b_o += _vec_diag(
        p_q, p_k, p_v, p_gkx, p_gk, p_gv, p_gv, None, o_r, m_r, o_v, m_v, K, H * K, H * V, BQ,
        BD, False, True, True, False, DOT_PREC, BLOCK_DIAG, True, True, False, DIAG_SPAN,
    )  # fmt: skip
    b_o += _vec_rows_off(
        p_q, p_k, p_v, p_gkx, p_gk, p_gv, p_gv, o_r, m_r, r0, c0, o_v, m_v, K, H * K, H * V, BQ,
        BS, BD, BO, True, True, DOT_PREC,
    )  # fmt: skip
    b_o *= scale
    p = base * V + o_r.to(tl.int64)[:, None] * H * V + o_v[None, :]
    m_rv = m_r[:, None] & m_v[None, :]
    tl.store(o + p, b_o.to(o.dtype.element_ty), mask=m_rv)
    tl.store(o32 + p, b_o, mask=m_rv)


@triton.jit(do_not_specialize=["T", "NT", "NQ"])
def dq_bwd_kernel(
    do, v, dp, k, q, h, gv, gkx, gk, u, spans, dq, qdq, chunks,
    T, H, K, V, L, NT, NQ, scale,
    BQ: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    USE_GV: tl.constexpr, EXCL: tl.constexpr, SKIP: tl.constexpr, BLOCK_DIAG: tl.constexpr,
    DIAG_SPAN: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × sub-chunks, K tiles, B·H): the rows o_r of one sub-chunk,

        dq_r = scale·[(do_r ⊙ e^{G^V_r}) h_cᵀ ⊙ e^{G^X_r} + Σ_{s≤r} P_rs k_s ⊙ e^{G^X_r − G^K_s}],
        P_rs = Σ_v do_r v_s e^{G^V_r − G^V_s}

    (RWKV6, ``EXCL``: s < r, and P_rr k_r ⊙ u), into dq (its dtype) and qdq = q ⊙ dq (fp32).
    ``USE_GV``: P and the state part formed here (the walk unrolled). gk alone: P is the stored
    dp = do vᵀ ([B, T, H, L] fp32, vector_scores_kernels.scores_kernel), the state part is in
    qdq already (apply_kernel's INTER), and chunks whose span (spans [NT, B·H]) is below
    ``SKIP`` > 0 are left out (apply_kernel's FAST finished them)."""
    i_cq, i_o, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    i_c, c0, c1, _i_n, r0, o_r, m_r = _chunk_rows(chunks, i_cq, NQ, L, T, BQ, VARLEN)
    if r0 >= c1:
        return
    if _fast_chunk(spans, i_c, i_bh, tl.num_programs(2), SKIP):  # apply_kernel's FAST
        return
    o_k = i_o * BO + tl.arange(0, BO)
    m_k = o_k < K
    base = i_b * T * H + i_h
    p_do, p_k = do + base * V, k + base * K
    # (u is None without EXCL: a jit helper may not return None, so the pointer is set here)
    p_gkx, p_gk = gkx + base * K, gk + base * K
    p_u = u + i_h * K if EXCL else u
    if USE_GV:
        p_gv = gv + base * V
        p_p, s_p = v + base * V, H * V
        b_dq = _vec_state_part(
            p_do, h + (i_bh * NT + i_c) * K * V, p_gv, p_gkx, o_r, m_r, o_k, m_k, c1, V, H * V,
            H * K, 1, V, BQ, BD, BO, False, True, True, DOT_PREC,
        )  # fmt: skip
    else:
        p_gv = gv
        p_p, s_p = dp + base * L - c0, H * L  # P[r, s] at r·H·L + s
        b_dq = _tile(qdq + base * K, o_r, o_k, H * K, m_r, m_k)  # [BQ, BO]
    b_dq += _vec_diag(
        p_do, p_p, p_k, p_gv, p_gv, p_gkx, p_gk, p_u, o_r, m_r, o_k, m_k, V, s_p, H * K, BQ, BD,
        False, USE_GV, True, EXCL, DOT_PREC, BLOCK_DIAG, USE_GV, False, not USE_GV, DIAG_SPAN,
    )  # fmt: skip
    b_dq += _vec_rows_off(
        p_do, p_p, p_k, p_gv, p_gv, p_gkx, p_gk, o_r, m_r, r0, c0, o_k, m_k, V, s_p, H * K, BQ,
        BS, BD, BO, USE_GV, True, DOT_PREC, not USE_GV,
    )  # fmt: skip
    b_dq *= scale
    p = base * K + o_r.to(tl.int64)[:, None] * H * K + o_k[None, :]
    m_rk = m_r[:, None] & m_k[None, :]
    tl.store(dq + p, b_dq.to(dq.dtype.element_ty), mask=m_rk)
    b_q = tl.load(q + p, mask=m_rk, other=0.0).to(tl.float32)
    tl.store(qdq + p, b_q * b_dq, mask=m_rk)


@triton.jit(do_not_specialize=["T", "NT", "NS"])
def dk_bwd_kernel(
    v, do, dp, q, k, dh, gv, gkx, gk, u, spans, dk, kdk, chunks,
    T, H, K, V, L, NT, NS, scale,
    BS: tl.constexpr, BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    USE_GV: tl.constexpr, EXCL: tl.constexpr, SKIP: tl.constexpr, BLOCK_DIAG: tl.constexpr,
    DIAG_SPAN: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × sub-chunks, K tiles, B·H): the keys o_s of one sub-chunk,

        dk_s = (v_s ⊙ e^{G^V_L − G^V_s}) dh_cᵀ ⊙ e^{G^K_L − G^K_s}
               + scale·Σ_{r≥s} P_rs q_r ⊙ e^{G^X_r − G^K_s},
        P_rs = Σ_v do_r v_s e^{G^V_r − G^V_s}

    (RWKV6, ``EXCL``: r > s, and P_ss q_s ⊙ u), into dk (its dtype) and kdk = k ⊙ dk (fp32);
    dh the gradient of the state leaving the chunk (scaled already). BQ: the tile of later
    queries. ``USE_GV``, dp, ``SKIP`` as in :func:`dq_bwd_kernel` (kdk holds the state part
    with gk alone)."""
    i_cs, i_o, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    i_c, c0, c1, _i_n, s0, o_s, m_s = _chunk_rows(chunks, i_cs, NS, L, T, BS, VARLEN)
    if s0 >= c1:
        return
    if _fast_chunk(spans, i_c, i_bh, tl.num_programs(2), SKIP):  # apply_kernel's FAST
        return
    o_k = i_o * BO + tl.arange(0, BO)
    m_k = o_k < K
    base = i_b * T * H + i_h
    p_v, p_q = v + base * V, q + base * K
    # (u is None without EXCL: a jit helper may not return None, so the pointer is set here)
    p_gkx, p_gk = gkx + base * K, gk + base * K
    p_u = u + i_h * K if EXCL else u
    if USE_GV:
        p_gv = gv + base * V
        p_p, s_p = do + base * V, H * V
        b_int = _vec_state_part(
            p_v, dh + (i_bh * NT + i_c) * K * V, p_gv, p_gk, o_s, m_s, o_k, m_k, c1, V, H * V,
            H * K, 1, V, BS, BD, BO, True, True, True, DOT_PREC,
        )  # fmt: skip
    else:
        p_gv = gv
        p_p, s_p = dp + base * L - c0, H * L  # P[r, s] at r·H·L + s
        b_int = _tile(kdk + base * K, o_s, o_k, H * K, m_s, m_k)  # [BS, BO]
    b_dk = _vec_diag(
        p_v, p_p, p_q, p_gv, p_gv, p_gkx, p_gk, p_u, o_s, m_s, o_k, m_k, V, s_p, H * K, BS, BD,
        True, USE_GV, True, EXCL, DOT_PREC, BLOCK_DIAG, USE_GV, False, not USE_GV, DIAG_SPAN,
    )  # fmt: skip
    b_dk += _vec_cols_off(
        p_v, p_p, p_q, p_gv, p_gv, p_gkx, p_gk, o_s, m_s, tl.minimum(s0 + BS, c1), c1, o_k, m_k,
        V, s_p, H * K, BS, BQ, BD, BO, USE_GV, True, DOT_PREC, not USE_GV,
    )  # fmt: skip
    b_dk = b_dk * scale + b_int
    p = base * K + o_s.to(tl.int64)[:, None] * H * K + o_k[None, :]
    m_sk = m_s[:, None] & m_k[None, :]
    tl.store(dk + p, b_dk.to(dk.dtype.element_ty), mask=m_sk)
    b_k = tl.load(k + p, mask=m_sk, other=0.0).to(tl.float32)
    tl.store(kdk + p, b_k * b_dk, mask=m_sk)


@triton.jit(do_not_specialize=["T", "NT", "NS"])
def dv_bwd_kernel(
    k, q, do, v, dh, gkx, gk, gv, dv, vdv, chunks,
    T, H, K, V, L, NT, NS, scale,
    BS: tl.constexpr, BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    BLOCK_DIAG: tl.constexpr, DIAG_SPAN: tl.constexpr, DOT_PREC: tl.constexpr,
    VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × sub-chunks, V tiles, B·H), calls with gv: the values o_s of one
    sub-chunk,

        dv_s = (k_s ⊙ e^{G^K_L − G^K_s}) dh_c ⊙ e^{G^V_L − G^V_s}
               + scale·Σ_{r≥s} P_rs do_r ⊙ e^{G^V_r − G^V_s},
        P_rs = Σ_k q_r k_s e^{G^X_r − G^K_s},

    into dv (its dtype) and vdv = v ⊙ dv (fp32, for gv's gradient)."""
    i_cs, i_o, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    i_c, _c0, c1, _i_n, s0, o_s, m_s = _chunk_rows(chunks, i_cs, NS, L, T, BS, VARLEN)
    if s0 >= c1:
        return
    o_v = i_o * BO + tl.arange(0, BO)
    m_v = o_v < V
    base = i_b * T * H + i_h
    p_k, p_q, p_do = k + base * K, q + base * K, do + base * V
    p_gkx, p_gk, p_gv = gkx + base * K, gk + base * K, gv + base * V
    b_int = _vec_state_part(
        p_k, dh + (i_bh * NT + i_c) * K * V, p_gk, p_gv, o_s, m_s, o_v, m_v, c1, K, H * K, H * V,
        V, 1, BS, BD, BO, True, True, True, DOT_PREC,
    )  # fmt: skip
    b_dv = _vec_diag(
        p_k, p_q, p_do, p_gkx, p_gk, p_gv, p_gv, None, o_s, m_s, o_v, m_v, K, H * K, H * V, BS,
        BD, True, True, True, False, DOT_PREC, BLOCK_DIAG, True, False, False, DIAG_SPAN,
    )  # fmt: skip
    b_dv += _vec_cols_off(
        p_k, p_q, p_do, p_gkx, p_gk, p_gv, p_gv, o_s, m_s, tl.minimum(s0 + BS, c1), c1, o_v, m_v,
        K, H * K, H * V, BS, BQ, BD, BO, True, True, DOT_PREC,
    )  # fmt: skip
    b_dv = b_dv * scale + b_int
    p = base * V + o_s.to(tl.int64)[:, None] * H * V + o_v[None, :]
    m_sv = m_s[:, None] & m_v[None, :]
    tl.store(dv + p, b_dv.to(dv.dtype.element_ty), mask=m_sv)
    b_v = tl.load(v + p, mask=m_sv, other=0.0).to(tl.float32)
    tl.store(vdv + p, b_v * b_dv, mask=m_sv)
