"""Triton kernels of the chunkwise delta rule's forward (docs/DESIGN.md §1b): the WY/UT
preparation of each chunk and the walk over the chunks that turns values into new values.

Per value head and chunk (rows r, columns s chunk-local; b the chunk-local cumulative log decay,
β the write strengths, S0 the state entering the chunk)::

    N_rs = β_r exp(b_r − b_s) (k_r·k_s)   (s < r, else 0)      A = (I + N)⁻¹
    W = A diag(β) diag(exp(b)) K      U = A diag(β) V      vn = U − W S0
    S' = exp(b_L) S0 + Σ_s exp(b_L − b_s) k_s vn_sᵀ

With vn in place of v the output is the scalar engine's (scalar_kernels.out_fwd_kernel). Every
exponent is ≤ 0 (b is non-increasing within a chunk).

* ``solve_fwd_kernel`` — N of one chunk and A = (I + N)⁻¹ by block forward substitution: the
  16 × 16 diagonal blocks of I + N are inverted row by row (all blocks in one loop), then each
  block row of A follows from the ones above it, A_i· = (I + N_ii)⁻¹ (E_i − Σ_{m<i} N_im A_m·),
  in fp32 ("ieee" dots).
  Forward substitution cancels as it goes; a power series of N (Σ (−N)ⁿ) would sum terms far
  larger than A itself (e.g. with equal keys) and lose it to rounding.
* ``wu_fwd_kernel`` — W and U of one chunk from A (the backward recomputes them with it).
* ``walk_fwd_kernel`` — the chunks of one sequence in order: stores each chunk's entering state
  and vn, and the final state. The whole key dimension of the state (≤ 256) is held in up to
  four blocks of BK rows (``NKB``), since vn needs all of S0's rows.

Layouts: q, k ``[B, T, H/G, K]``; v, u, vn ``[B, T, H, V]``, w ``[B, T, H, K]`` (H value heads,
G per q/k head: value head h reads q/k head h // G); β ``[B, T, H]`` fp32; b ``[B·H, T]`` fp32;
A ``[B·H, T, L]`` fp32 (row t holds row r of its chunk's A, chunk-local columns, zeros above the
diagonal); chunk states ``[B·H, NT, K, V]`` in k's dtype; initial and final states ``[N, H, K, V]``
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import _bounds, _state_tile, _tile, _tile_t, _vec, _walk


@triton.jit
def _inv_unit_lower(b_n, NB: tl.constexpr):
    """(I + n)⁻¹ of NB strictly lower [16, 16] blocks n ``[NB, 16, 16]`` at once, by forward
    substitution one row at a time: y_t = −n_t − Σ_{s<t} n_ts y_s for the strictly lower part y
    of each inverse."""
    o_i = tl.arange(0, 16)
    b_y = -b_n
    for t in range(1, 16):
        at_t = (o_i == t)[None, :, None]
        row = tl.sum(tl.where(at_t, b_y, 0.0), 1)  # [NB, 16]: −n_t (columns < t)
        row += tl.sum(row[:, :, None] * b_y, 1)  # rows s < t of b_y are final, row[s ≥ t] = 0
        b_y = tl.where(at_t, row[:, None, :], b_y)
    return b_y + tl.where(o_i[:, None] == o_i[None, :], 1.0, 0.0)[None, :, :]


@triton.jit(do_not_specialize=["T", "NT"])
def solve_fwd_kernel(
    k, beta, b, A, chunks,
    T, H, G, K, L, NT,
    BL: tl.constexpr, BK: tl.constexpr, NB: tl.constexpr,
    HAS_DECAY: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks, B·H): A = (I + N)⁻¹ of one chunk into A [B·H, T, L]. BL = NB·16 ≥ L: the
    chunk's rows as one tile (rows and columns past the chunk are the identity's, never
    stored)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    HK = H // G  # q/k heads: value head i_h reads q/k head i_h // G
    c0, c1, _seq = _bounds(chunks, i_c, L, T, VARLEN)
    o_t = tl.arange(0, BL)
    o_r = c0 + o_t
    m_r = o_r < c1

    p_k = k + (i_b * T * HK + i_h // G) * K
    b_kk = tl.zeros([BL, BL], dtype=tl.float32)
    for d0 in range(0, K, BK):
        o_d = d0 + tl.arange(0, BK)
        b_k = _tile(p_k, o_r, o_d, HK * K, m_r, o_d < K)  # [BL, BK]
        b_kk += tl.dot(b_k, tl.trans(b_k), input_precision=DOT_PREC)
    b_beta = _vec(beta + i_b * T * H + i_h, o_r * H, m_r)  # [BL]
    lower = (o_t[:, None] > o_t[None, :]) & m_r[:, None]  # s < r < c1
    if HAS_DECAY:
        b_b = _vec(b + i_bh * T, o_r, m_r)
        b_kk *= tl.exp(tl.where(lower, b_b[:, None] - b_b[None, :], float("-inf")))
    b_n = tl.where(lower, b_kk * b_beta[:, None], 0.0)  # [BL, BL] N, strictly lower

    # Block rows i of A as a [NB, 16, BL] tile (block row index first); rows below the current
    # block row are still 0, so N_i· A multiplies only the finished ones. The diagonal blocks'
    # inverses X_ii = (I + N_ii)⁻¹ first, all at once.
    o_b = tl.arange(0, NB)
    b_n3 = tl.reshape(b_n, [NB, 16, BL])
    on_diag = o_b[:, None, None, None] == o_b[None, None, :, None]  # [NB, 1, NB, 1]
    b_x3 = _inv_unit_lower(tl.sum(tl.where(on_diag, tl.reshape(b_n, [NB, 16, NB, 16]), 0.0), 2),
                           NB)  # fmt: skip
    b_a3 = tl.zeros([NB, 16, BL], dtype=tl.float32)
    for i in range(NB):
        in_row = (o_b == i)[:, None, None]
        n_row = tl.sum(tl.where(in_row, b_n3, 0.0), 0)  # [16, BL]: N_i·
        x_ii = tl.sum(tl.where(in_row, b_x3, 0.0), 0)  # [16, 16]
        b_s = tl.dot(n_row, tl.reshape(b_a3, [BL, BL]), input_precision="ieee")  # [16, BL]
        in_i = (o_b == i)[None, :, None]  # block column i of a [16, NB, 16] view
        a_row = tl.reshape(tl.where(in_i, x_ii[:, None, :], 0.0), [16, BL])  # X_ii E_i
        a_row -= tl.dot(x_ii, b_s, input_precision="ieee")
        b_a3 = tl.where(in_row, a_row[None, :, :], b_a3)
    b_a = tl.reshape(b_a3, [BL, BL])

    p_a = A + (i_bh * T + o_r.to(tl.int64)[:, None]) * L + o_t[None, :]
    tl.store(p_a, b_a, mask=m_r[:, None] & (o_t < L)[None, :])


@triton.jit
def _wu_part(p_x, p_y, b_a, b_f, o_r, m_r, D, s_x, s_y, BL: tl.constexpr, BD: tl.constexpr,
             DOT_PREC: tl.constexpr):  # fmt: skip
    """y = A diag(f) x over D columns in tiles of BD (x at p_x, row stride s_x; y at p_y, row
    stride s_y, stored in y's dtype)."""
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_r, o_d, s_x, m_r, m_d).to(tl.float32) * b_f[:, None]  # [BL, BD]
        b_y = tl.dot(b_a, b_x, input_precision=DOT_PREC)
        p_o = p_y + o_r.to(tl.int64)[:, None] * s_y + o_d[None, :]
        tl.store(p_o, b_y.to(p_y.dtype.element_ty), mask=m_r[:, None] & m_d[None, :])


@triton.jit(do_not_specialize=["T", "NT"])
def wu_fwd_kernel(
    k, v, beta, b, A, w, u, chunks,
    T, H, G, K, V, L, NT,
    BL: tl.constexpr, BD: tl.constexpr,
    HAS_DECAY: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks, B·H): W = A diag(β exp(b)) K into w [B, T, H, K] and U = A diag(β) V into
    u [B, T, H, V] of one chunk."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    HK = H // G
    c0, c1, _seq = _bounds(chunks, i_c, L, T, VARLEN)
    o_t = tl.arange(0, BL)
    o_r = c0 + o_t
    m_r = o_r < c1
    b_a = _tile(A + i_bh * T * L, o_r, o_t, L, m_r, o_t < L)  # [BL, BL]
    b_beta = _vec(beta + i_b * T * H + i_h, o_r * H, m_r)
    b_fk = b_beta
    if HAS_DECAY:
        b_fk = b_beta * tl.exp(_vec(b + i_bh * T, o_r, m_r))
    _wu_part(k + (i_b * T * HK + i_h // G) * K, w + (i_b * T * H + i_h) * K, b_a, b_fk, o_r, m_r,
             K, HK * K, H * K, BL, BD, DOT_PREC)  # fmt: skip
    _wu_part(v + (i_b * T * H + i_h) * V, u + (i_b * T * H + i_h) * V, b_a, b_beta, o_r, m_r, V,
             H * V, H * V, BL, BD, DOT_PREC)  # fmt: skip


# The walk holds the state's K rows in up to four blocks of BK rows (b_h1 … b_h4, the ones past
# NKB never created); each helper below does one block's share of a step.


@triton.jit
def _h_start(h0, i_st, kb, o_v, m_v, K, V, BK: tl.constexpr, BV: tl.constexpr,
             HAS_H0: tl.constexpr):  # fmt: skip
    """Block kb of the initial state [BK, BV] fp32 (zeros without one)."""
    if HAS_H0:
        o_k = kb * BK + tl.arange(0, BK)
        return _state_tile(h0 + i_st * K * V, o_k, o_v, V, 1, o_k < K, m_v).to(tl.float32)
    else:
        return tl.zeros([BK, BV], dtype=tl.float32)


@triton.jit
def _h_store(p_h, b_h, kb, o_v, m_v, K, V, BK: tl.constexpr):
    """Store block kb of a state [K, V] at p_h."""
    o_k = kb * BK + tl.arange(0, BK)
    p = p_h + o_k[:, None] * V + o_v[None, :]
    tl.store(p, b_h.to(p_h.dtype.element_ty), mask=(o_k < K)[:, None] & m_v[None, :])


@triton.jit
def _w_h(p_w, o_r, m_r, b_h, kb, K, s_w, BK: tl.constexpr, DOT_PREC: tl.constexpr):
    """W[:, block kb] · S0[block kb, :] [BT, BV] (W at p_w with row stride s_w)."""
    o_k = kb * BK + tl.arange(0, BK)
    b_w = _tile(p_w, o_r, o_k, s_w, m_r, o_k < K)  # [BT, BK]
    return tl.dot(b_w, b_h.to(b_w.dtype), input_precision=DOT_PREC)


@triton.jit
def _h_step(p_k, o_r, m_r, b_h, kb, K, s_k, decay, w_s, b_vn, BK: tl.constexpr,
            DOT_PREC: tl.constexpr):  # fmt: skip
    """Block kb of S' = exp(b_L) S0 + Σ_s exp(b_L − b_s) k_s vn_sᵀ (decay = exp(b_L), w_s the
    per-row weights, 0 past the chunk)."""
    o_k = kb * BK + tl.arange(0, BK)
    b_kt = _tile_t(p_k, o_r, o_k, s_k, m_r, o_k < K).to(tl.float32)  # [BK, BT]
    b_kw = (b_kt * w_s[None, :]).to(b_vn.dtype)
    return b_h * decay + tl.dot(b_kw, b_vn, input_precision=DOT_PREC)


@triton.jit(do_not_specialize=["T", "NT"])
def walk_fwd_kernel(
    k, w, u, b, h0, h, vn, ht, co, chunks,
    T, H, G, K, V, L, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NKB: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_H0: tl.constexpr, DOT_PREC: tl.constexpr,
    VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (V tiles, N·H): walks one sequence's chunks; per chunk stores the entering state
    (h [B·H, NT, K, V] fp32) and vn = U − W S0 (vn [B, T, H, V] in its dtype), then steps the
    state; at the end the final state ht [N, H, K, V]. BT ≥ L: a chunk is one row tile."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, _i_n = _walk(co, i_nh, H, NT, VARLEN)
    i_b, i_h = i_bh // H, i_bh % H
    HK = H // G
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_k = k + (i_b * T * HK + i_h // G) * K
    p_w = w + (i_b * T * H + i_h) * K
    p_u = u + (i_b * T * H + i_h) * V
    p_vn = vn + (i_b * T * H + i_h) * V
    if HAS_DECAY:
        b += i_bh * T

    b_h1 = _h_start(h0, i_st, 0, o_v, m_v, K, V, BK, BV, HAS_H0)
    if NKB > 1:
        b_h2 = _h_start(h0, i_st, 1, o_v, m_v, K, V, BK, BV, HAS_H0)
    if NKB > 2:
        b_h3 = _h_start(h0, i_st, 2, o_v, m_v, K, V, BK, BV, HAS_H0)
    if NKB > 3:
        b_h4 = _h_start(h0, i_st, 3, o_v, m_v, K, V, BK, BV, HAS_H0)

    for i_c in range(c_lo, c_hi):
        c0, c1, _seq = _bounds(chunks, i_c, L, T, VARLEN)
        p_h = h + (i_bh * NT + i_c) * K * V
        o_r = c0 + tl.arange(0, BT)
        m_r = o_r < c1
        b_vn = _tile(p_u, o_r, o_v, H * V, m_r, m_v).to(tl.float32)  # [BT, BV]
        _h_store(p_h, b_h1, 0, o_v, m_v, K, V, BK)
        b_vn -= _w_h(p_w, o_r, m_r, b_h1, 0, K, H * K, BK, DOT_PREC)
        if NKB > 1:
            _h_store(p_h, b_h2, 1, o_v, m_v, K, V, BK)
            b_vn -= _w_h(p_w, o_r, m_r, b_h2, 1, K, H * K, BK, DOT_PREC)
        if NKB > 2:
            _h_store(p_h, b_h3, 2, o_v, m_v, K, V, BK)
            b_vn -= _w_h(p_w, o_r, m_r, b_h3, 2, K, H * K, BK, DOT_PREC)
        if NKB > 3:
            _h_store(p_h, b_h4, 3, o_v, m_v, K, V, BK)
            b_vn -= _w_h(p_w, o_r, m_r, b_h4, 3, K, H * K, BK, DOT_PREC)
        b_vc = b_vn.to(vn.dtype.element_ty)  # the stored vn is what the output reads
        p_o = p_vn + o_r.to(tl.int64)[:, None] * H * V + o_v[None, :]
        tl.store(p_o, b_vc, mask=m_r[:, None] & m_v[None, :])

        if HAS_DECAY:
            b_last = tl.load(b + c1 - 1)
            decay = tl.exp(b_last)
            w_s = tl.exp(tl.where(m_r, b_last - _vec(b, o_r, m_r), float("-inf")))  # [BT] ≤ 1
        else:
            decay = 1.0
            w_s = tl.where(m_r, 1.0, 0.0)
        b_h1 = _h_step(p_k, o_r, m_r, b_h1, 0, K, HK * K, decay, w_s, b_vc, BK, DOT_PREC)
        if NKB > 1:
            b_h2 = _h_step(p_k, o_r, m_r, b_h2, 1, K, HK * K, decay, w_s, b_vc, BK, DOT_PREC)
        if NKB > 2:
            b_h3 = _h_step(p_k, o_r, m_r, b_h3, 2, K, HK * K, decay, w_s, b_vc, BK, DOT_PREC)
        if NKB > 3:
            b_h4 = _h_step(p_k, o_r, m_r, b_h4, 3, K, HK * K, decay, w_s, b_vc, BK, DOT_PREC)

    p_t = ht + i_st * K * V
    _h_store(p_t, b_h1, 0, o_v, m_v, K, V, BK)
    if NKB > 1:
        _h_store(p_t, b_h2, 1, o_v, m_v, K, V, BK)
    if NKB > 2:
        _h_store(p_t, b_h3, 2, o_v, m_v, K, V, BK)
    if NKB > 3:
        _h_store(p_t, b_h4, 3, o_v, m_v, K, V, BK)
