"""Triton kernels of the chunkwise delta rule's backward (docs/DESIGN.md §1b).

Per value head and chunk (rows r, columns s chunk-local; ``b`` the chunk-local cumulative log
decay, 0 without one; S0 the state entering the chunk, dS' the gradient of the state leaving it;
A = (I + N)⁻¹ the chunk's WY matrix, vn the forward's new values)::

    dvn  = scale·Mᵀ dO + Kt dS'         M_rs = exp(b_r − b_s) (q_r·k_s) (s ≤ r),
                                         Kt_s = exp(b_L − b_s) k_s
    dY   = Aᵀ dvn                        (the gradient of Y = diag(β) V)
    dS0  = exp(b_L) dS' + scale·Qbᵀ dO − Zᵀ dY     Qb_r = exp(b_r) q_r, Z_r = β_r exp(b_r) k_r
    dZ   = −dY S0ᵀ,   dN = −(dY vnᵀ) on the strictly lower triangle,   dv = β dY

(Wᵀ dvn = Zᵀ Aᵀ dvn = Zᵀ dY and A (Y − Z S0) = vn, so neither W nor U is needed.) From dZ and dN
(N_rs = β_r exp(b_r − b_s) (k_r·k_s)) come the WY parts of dk, dβ and the log-decay gradient.

Kernels, in the order the host launches them:

* ``dv_local_kernel`` — scale·Mᵀ dO, the intra-chunk part of dvn (chunk-parallel).
* ``walk_bwd_kernel`` — the reverse walk over chunks: dvn, then dY (stored over the local part),
  the state gradients dS' of every chunk, dS0 of the initial state and ⟨dS', S'⟩ at each chunk
  end (the log-decay gradient's chunk boundary term). The whole K of a V tile's state is held in
  up to four blocks of BK rows.
* (the engine's ``dq_bwd_kernel`` and ``dk_bwd_kernel`` with vn as v give dq and the direct dk)
* ``wy_bwd_kernel`` — per chunk: dv, dβ, the WY part of dk (added to the direct one) and the WY
  part of the log-decay gradient.

Layouts: q, k ``[B, T, H/G, K]`` (value head h reads q/k head h // G); v, vn, dO, dY
``[B, T, H, V]``; β, dβ ``[B, T, H]``; H counts value heads. Rows of b and db ``[B·H, T]`` fp32;
A ``[B·H, T, L]`` fp32 (row t: row r of its chunk's A, chunk-local columns); chunk states
``[B·H, NT, K, V]`` fp32, their gradients the same in the inputs' dtype. Packed sequences
(``VARLEN``) as in the scalar engine: the chunk table ``chunks`` and each sequence's first chunk
``co``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.delta_kernels import _h_start, _h_store
from linrnn.engine.triton_common import (
    _bounds,
    _chunk_rows,
    _state_tile,
    _tile,
    _tile_t,
    _vec,
    _walk,
)


@triton.jit(do_not_specialize=["T", "NT", "NS"])
def dv_local_kernel(
    q, k, do, g, dy, chunks,
    T, H, G, K, V, L, NT, NS, scale,
    BS: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
    HAS_DECAY: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × key tiles, V tiles, B·H): dy_s = scale·Σ_{r≥s} exp(b_r − b_s)
    (k_s·q_r) dO_r for the rows s of one key tile (the state-free part of dvn)."""
    i_cs, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    _i_c, _c0, c1, _i_n, s0, o_s, m_s = _chunk_rows(chunks, i_cs, NS, L, T, BS, VARLEN)
    if s0 >= c1:
        return
    HK = H // G
    p_q = q + (i_b * T * HK + i_h // G) * K
    p_k = k + (i_b * T * HK + i_h // G) * K
    p_do = do + (i_b * T * H + i_h) * V
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    if HAS_DECAY:
        g += i_bh * T
    b_bs = _vec(g, o_s, m_s) if HAS_DECAY else tl.zeros([BS], dtype=tl.float32)
    b_acc = tl.zeros([BS, BV], dtype=tl.float32)
    for r0 in range(s0, c1, BS):
        o_r = r0 + tl.arange(0, BS)
        m_r = o_r < c1
        b_m = tl.zeros([BS, BS], dtype=tl.float32)  # [BS (s), BS (r)]: k_s·q_r
        for d0 in range(0, K, BD):
            o_d = d0 + tl.arange(0, BD)
            m_d = o_d < K
            b_k = _tile(p_k, o_s, o_d, HK * K, m_s, m_d)  # [BS, BD]
            b_qt = _tile_t(p_q, o_r, o_d, HK * K, m_r, m_d)  # [BD, BS]
            b_m += tl.dot(b_k, b_qt, input_precision=DOT_PREC)
        causal = (o_r[None, :] >= o_s[:, None]) & m_r[None, :]
        if HAS_DECAY:
            lw = _vec(g, o_r, m_r)[None, :] - b_bs[:, None]
            b_m *= tl.exp(tl.where(causal, lw, float("-inf")))
        else:
            b_m = tl.where(causal, b_m, 0.0)
        b_do = _tile(p_do, o_r, o_v, H * V, m_r, m_v)  # [BS, BV]
        b_acc += tl.dot(b_m.to(b_do.dtype), b_do, input_precision=DOT_PREC)
    p_dy = dy + (i_b * T * H + i_h) * V + o_s.to(tl.int64)[:, None] * H * V + o_v[None, :]
    tl.store(p_dy, (b_acc * scale).to(dy.dtype.element_ty), mask=m_s[:, None] & m_v[None, :])


# The walk holds one V tile of the state gradient, all of K, as up to four [BK, BV] blocks
# (a block j ≥ NB is never touched).


@triton.jit
def _kt_ds(p_k, o_t, m_t, j, K, s_k, f_k, b_dS, BK: tl.constexpr, DOT_PREC: tl.constexpr):
    """Block j's part of Kt dS': Σ_{d in block} f_k[t] k[t, d] dS[d, :] ([BT, BV] fp32)."""
    o_k = j * BK + tl.arange(0, BK)
    b_k = _tile(p_k, o_t, o_k, s_k, m_t, o_k < K)  # [BT, BK]
    b_kw = (b_k.to(tl.float32) * f_k[:, None]).to(b_k.dtype)
    return tl.dot(b_kw, b_dS.to(b_k.dtype), input_precision=DOT_PREC)


@triton.jit
def _ds_step(b_dS, decay, p_q, p_k, o_t, m_t, j, K, s_k, f_q, f_k, b_do, b_dy,
             BK: tl.constexpr, DOT_PREC: tl.constexpr):  # fmt: skip
    """Block j of dS0 = decay·dS' + Σ_t f_q[t] q_t dO_tᵀ − Σ_t f_k[t] k_t dY_tᵀ."""
    o_k = j * BK + tl.arange(0, BK)
    m_k = o_k < K
    b_qt = _tile_t(p_q, o_t, o_k, s_k, m_t, m_k)  # [BK, BT]
    b_kt = _tile_t(p_k, o_t, o_k, s_k, m_t, m_k)  # [BK, BT]
    b_qw = (b_qt.to(tl.float32) * f_q[None, :]).to(b_do.dtype)
    b_kw = (b_kt.to(tl.float32) * f_k[None, :]).to(b_kt.dtype)
    b_dS = b_dS * decay + tl.dot(b_qw, b_do, input_precision=DOT_PREC)
    return b_dS - tl.dot(b_kw, b_dy.to(b_kt.dtype), input_precision=DOT_PREC)


@triton.jit
def _ds_inner(p, b_dS, j, K, V, o_v, m_v, BK: tl.constexpr):
    """⟨dS, S⟩ over block j (S at p, [K, V], read in fp32)."""
    o_k = j * BK + tl.arange(0, BK)
    b_s = _state_tile(p, o_k, o_v, V, 1, o_k < K, m_v).to(tl.float32)
    return tl.sum(tl.sum(b_dS * b_s, 1), 0)


@triton.jit
def _ds_state(p, b_d0, b_d1, b_d2, b_d3, K, V, o_v, m_v, BK: tl.constexpr, NB: tl.constexpr):
    """⟨dS, S⟩ over the NB blocks of dS (S at p, [K, V])."""
    b_bnd = _ds_inner(p, b_d0, 0, K, V, o_v, m_v, BK)
    if NB > 1:
        b_bnd += _ds_inner(p, b_d1, 1, K, V, o_v, m_v, BK)
    if NB > 2:
        b_bnd += _ds_inner(p, b_d2, 2, K, V, o_v, m_v, BK)
    if NB > 3:
        b_bnd += _ds_inner(p, b_d3, 3, K, V, o_v, m_v, BK)
    return b_bnd


@triton.jit(do_not_specialize=["T", "NT"])
def walk_bwd_kernel(
    q, k, beta, g, A, do, dy, h, ht, dht, dh, dh0, bnd, co, chunks,
    T, H, G, K, V, L, NT, scale,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NB: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_DHT: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (V tiles, N·H). Walks each sequence's chunks backwards from the final state's
    gradient dht ([N, H, K, V], or zeros without ``HAS_DHT``). Per chunk: stores dS' (dh
    [B·H, NT, K, V] in its dtype), reads the local part of dvn from dy and overwrites it with dY =
    Aᵀ dvn, and steps dS' to the gradient of the state entering the chunk; the first chunk's
    goes to dh0 [N, H, K, V]. ``HAS_DECAY``: also this V tile's part of ⟨dS', S'⟩ at each chunk
    end (bnd [B·H, NT, V tiles]; S' the next stored state h, or ht after a sequence's last
    chunk). The state's K rows are NB ≤ 4 blocks of BK; a chunk is one row tile of BT ≥ L."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, _i_n = _walk(co, i_nh, H, NT, VARLEN)
    i_b, i_h = i_bh // H, i_bh % H
    HK = H // G
    p_q = q + (i_b * T * HK + i_h // G) * K
    p_k = k + (i_b * T * HK + i_h // G) * K
    p_do = do + (i_b * T * H + i_h) * V
    p_dy = dy + (i_b * T * H + i_h) * V
    p_beta = beta + i_b * T * H + i_h
    if HAS_DECAY:
        g += i_bh * T
    A += i_bh * T * L
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_c = tl.arange(0, BT)  # chunk-local columns of A
    b_d0 = _h_start(dht, i_st, 0, o_v, m_v, K, V, BK, BV, HAS_DHT)
    b_d1 = _h_start(dht, i_st, 1, o_v, m_v, K, V, BK, BV, HAS_DHT and NB > 1)
    b_d2 = _h_start(dht, i_st, 2, o_v, m_v, K, V, BK, BV, HAS_DHT and NB > 2)
    b_d3 = _h_start(dht, i_st, 3, o_v, m_v, K, V, BK, BV, HAS_DHT and NB > 3)
    for j in range(c_hi - c_lo):
        i_c = c_hi - 1 - j
        c0, c1, _seq_c = _bounds(chunks, i_c, L, T, VARLEN)
        p_dh = dh + (i_bh * NT + i_c) * K * V
        _h_store(p_dh, b_d0, 0, o_v, m_v, K, V, BK)
        if NB > 1:
            _h_store(p_dh, b_d1, 1, o_v, m_v, K, V, BK)
        if NB > 2:
            _h_store(p_dh, b_d2, 2, o_v, m_v, K, V, BK)
        if NB > 3:
            _h_store(p_dh, b_d3, 3, o_v, m_v, K, V, BK)
        if HAS_DECAY:  # ⟨dS', S'⟩ for the log-decay gradient at the chunk's end
            # S' is the next stored state (k's dtype) or, after the last chunk, ht (fp32)
            if i_c + 1 < c_hi:
                b_bnd = _ds_state(h + (i_bh * NT + i_c + 1) * K * V, b_d0, b_d1, b_d2, b_d3, K,
                                  V, o_v, m_v, BK, NB)  # fmt: skip
            else:
                b_bnd = _ds_state(ht + i_st * K * V, b_d0, b_d1, b_d2, b_d3, K, V, o_v, m_v, BK,
                                  NB)  # fmt: skip
            tl.store(bnd + (i_bh * NT + i_c) * tl.num_programs(0) + i_v, b_bnd)

        o_t = c0 + o_c
        m_t = o_t < c1
        if HAS_DECAY:
            b_b = _vec(g, o_t, m_t)
            b_last = tl.load(g + c1 - 1)
            f_k = tl.exp(tl.where(m_t, b_last - b_b, float("-inf")))  # Kt weights, ≤ 1
            e_b = tl.exp(tl.where(m_t, b_b, float("-inf")))  # exp(b_r), ≤ 1
            decay = tl.exp(b_last)
        else:
            f_k = tl.where(m_t, 1.0, 0.0)
            e_b = f_k
            decay = 1.0
        # dvn = local part + Kt dS'
        b_dvn = _tile(p_dy, o_t, o_v, H * V, m_t, m_v).to(tl.float32)  # [BT, BV]
        b_dvn += _kt_ds(p_k, o_t, m_t, 0, K, HK * K, f_k, b_d0, BK, DOT_PREC)
        if NB > 1:
            b_dvn += _kt_ds(p_k, o_t, m_t, 1, K, HK * K, f_k, b_d1, BK, DOT_PREC)
        if NB > 2:
            b_dvn += _kt_ds(p_k, o_t, m_t, 2, K, HK * K, f_k, b_d2, BK, DOT_PREC)
        if NB > 3:
            b_dvn += _kt_ds(p_k, o_t, m_t, 3, K, HK * K, f_k, b_d3, BK, DOT_PREC)
        # dY = Aᵀ dvn
        b_at = _tile_t(A, o_t, o_c, L, m_t, o_c < L)  # [BT (s), BT (r)]: A[r, s]
        b_at = tl.where(o_c[:, None] <= o_c[None, :], b_at, 0.0)  # s ≤ r
        b_dy = tl.dot(b_at.to(k.dtype.element_ty), b_dvn.to(k.dtype.element_ty),
                      input_precision=DOT_PREC)  # fmt: skip
        p_o = p_dy + o_t.to(tl.int64)[:, None] * H * V + o_v[None, :]
        tl.store(p_o, b_dy.to(dy.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
        # dS0 = exp(b_L) dS' + scale·Qbᵀ dO − Zᵀ dY
        f_q = scale * e_b
        f_z = _vec(p_beta, o_t * H, m_t) * e_b
        b_do = _tile(p_do, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
        b_d0 = _ds_step(b_d0, decay, p_q, p_k, o_t, m_t, 0, K, HK * K, f_q, f_z, b_do, b_dy, BK,
                        DOT_PREC)  # fmt: skip
        if NB > 1:
            b_d1 = _ds_step(b_d1, decay, p_q, p_k, o_t, m_t, 1, K, HK * K, f_q, f_z, b_do, b_dy,
                            BK, DOT_PREC)  # fmt: skip
        if NB > 2:
            b_d2 = _ds_step(b_d2, decay, p_q, p_k, o_t, m_t, 2, K, HK * K, f_q, f_z, b_do, b_dy,
                            BK, DOT_PREC)  # fmt: skip
        if NB > 3:
            b_d3 = _ds_step(b_d3, decay, p_q, p_k, o_t, m_t, 3, K, HK * K, f_q, f_z, b_do, b_dy,
                            BK, DOT_PREC)  # fmt: skip
    p_h0 = dh0 + i_st * K * V
    _h_store(p_h0, b_d0, 0, o_v, m_v, K, V, BK)
    if NB > 1:
        _h_store(p_h0, b_d1, 1, o_v, m_v, K, V, BK)
    if NB > 2:
        _h_store(p_h0, b_d2, 2, o_v, m_v, K, V, BK)
    if NB > 3:
        _h_store(p_h0, b_d3, 3, o_v, m_v, K, V, BK)


@triton.jit(do_not_specialize=["T", "NT"])
def wy_bwd_kernel(
    k, v, vn, beta, g, h, dy, dv, dk, dbeta, db, chunks,
    T, H, G, K, V, L, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_DECAY: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks, B·H): the WY part of one chunk's gradients from dY (:func:`walk_bwd_kernel`)
    and the state entering the chunk (h)::

        dv = β dY,   dZ = −dY S0ᵀ,   dN = −(dY vnᵀ) strictly lower,   P = dN ∘ exp(b_r − b_s)
        dβ_r = dY_r·v_r + dZ_r·exp(b_r) k_r + Σ_s P_rs (k_r·k_s)
        dk  += β exp(b) dZ + (Pβ + Pβᵀ) K                     (Pβ = diag(β) P)
        db_r = β_r exp(b_r) dZ_r·k_r + Σ_s (Pβ∘KKᵀ)_rs − Σ_r' (Pβ∘KKᵀ)_r'r

    dv [B, T, H, V], dβ [B, T, H] fp32; dk [B, T, H, K] holds the direct part (the engine's
    dk kernel) and gets this part added; ``HAS_DECAY``: db [B·H, T] fp32, this part of
    the chunk-local log-decay gradient."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    c0, c1, _i_n = _bounds(chunks, i_c, L, T, VARLEN)
    if c0 >= c1:
        return
    HK = H // G
    p_k = k + (i_b * T * HK + i_h // G) * K
    p_v = v + (i_b * T * H + i_h) * V
    p_vn = vn + (i_b * T * H + i_h) * V
    p_dy = dy + (i_b * T * H + i_h) * V
    p_dv = dv + (i_b * T * H + i_h) * V
    p_dk = dk + (i_b * T * H + i_h) * K
    p_h = h + (i_bh * NT + i_c) * K * V
    o_c = tl.arange(0, BT)
    o_t = c0 + o_c
    m_t = o_t < c1
    b_beta = _vec(beta + i_b * T * H + i_h, o_t * H, m_t)
    if HAS_DECAY:
        b_b = _vec(g + i_bh * T, o_t, m_t)
    else:
        b_b = tl.zeros([BT], dtype=tl.float32)
    e_b = tl.exp(tl.where(m_t, b_b, float("-inf")))  # exp(b_r), 0 past the chunk

    # k kᵀ over K
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        b_kb = _tile(p_k, o_t, o_k, HK * K, m_t, m_k)  # [BT, BK]
        b_kk += tl.dot(b_kb, _tile_t(p_k, o_t, o_k, HK * K, m_t, m_k), input_precision=DOT_PREC)

    # Over V: dv, dY·v, dY vnᵀ
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    b_dnt = tl.zeros([BT, BT], dtype=tl.float32)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        m_v = o_v < V
        b_dy = _tile(p_dy, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
        b_vv = _tile(p_v, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
        b_dvv = b_dy.to(tl.float32) * b_beta[:, None]
        p_o = p_dv + o_t.to(tl.int64)[:, None] * H * V + o_v[None, :]
        tl.store(p_o, b_dvv.to(dv.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
        b_dbeta += tl.sum(b_dy.to(tl.float32) * b_vv.to(tl.float32), 1)
        b_vnt = _tile_t(p_vn, o_t, o_v, H * V, m_t, m_v)  # [BV, BT]
        b_dnt += tl.dot(b_dy.to(b_vnt.dtype), b_vnt, input_precision=DOT_PREC)

    strict = (o_c[:, None] > o_c[None, :]) & m_t[:, None]  # s < r < chunk end
    lw = b_b[:, None] - b_b[None, :]
    b_p = -b_dnt * tl.exp(tl.where(strict, lw, float("-inf")))  # dN ∘ exp(b_r − b_s)
    b_m = b_p * b_kk  # dN_rs ∂N_rs/∂β_r
    b_dbeta += tl.sum(b_m, 1)
    b_mb = b_m * b_beta[:, None]  # dN ∘ N
    b_db = tl.sum(b_mb, 1) - tl.sum(b_mb, 0)
    b_pb = b_p * b_beta[:, None]
    b_ps = b_pb + tl.trans(b_pb)  # dk gets (Pβ + Pβᵀ) K

    # Over K: dZ = −dY S0ᵀ, then dk
    b_dze = tl.zeros([BT], dtype=tl.float32)  # dZ_r·exp(b_r) k_r
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        b_dz = tl.zeros([BT, BK], dtype=tl.float32)
        for v0 in range(0, V, BV):
            o_v = v0 + tl.arange(0, BV)
            m_v = o_v < V
            b_dy = _tile(p_dy, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
            b_st = _state_tile(p_h, o_v, o_k, 1, V, m_v, m_k)  # [BV, BK]: S0ᵀ
            b_dz -= tl.dot(b_dy.to(k.dtype.element_ty), b_st.to(k.dtype.element_ty),
                           input_precision=DOT_PREC)  # fmt: skip
        b_kb = _tile(p_k, o_t, o_k, HK * K, m_t, m_k)  # [BT, BK]
        b_dkw = b_dz * (b_beta * e_b)[:, None]
        b_dkw += tl.dot(b_ps.to(b_kb.dtype), b_kb, input_precision=DOT_PREC)
        p_o = p_dk + o_t.to(tl.int64)[:, None] * H * K + o_k[None, :]
        msk = m_t[:, None] & m_k[None, :]
        b_dkw += tl.load(p_o, mask=msk, other=0.0).to(tl.float32)
        tl.store(p_o, b_dkw.to(dk.dtype.element_ty), mask=msk)
        b_dze += tl.sum(b_dz * b_kb.to(tl.float32), 1) * e_b

    tl.store(dbeta + (i_b * T + o_t) * H + i_h, b_dbeta + b_dze, mask=m_t)
    if HAS_DECAY:
        tl.store(db + i_bh * T + o_t, b_db + b_beta * b_dze, mask=m_t)
