"""Triton kernels of the chunkwise delta rule's forward (docs/DESIGN.md §1b): the WY/UT
preparation of each chunk and the walk over the chunks that turns values into new values.

Per value head and chunk (rows r, columns s chunk-local; b the chunk-local cumulative log decay,
β the write strengths, S0 the state entering the chunk)::

    N_rs = β_r exp(b_r − b_s) (k_r·k_s)   (s < r, else 0)      A = (I + N)⁻¹
    W = A diag(β) diag(exp(b)) K      U = A diag(β) V      vn = U − W S0
    S' = exp(b_L) S0 + Σ_s exp(b_L − b_s) k_s vn_sᵀ

With vn in place of v the output is the scalar engine's (scalar_kernels.out_fwd_kernel). Every
exponent is ≤ 0 (b is non-increasing within a chunk).

* ``wy_fwd_kernel`` — the WY preparation of one chunk: A, W and U. The chunk is NB ≤ 4 block
  rows of BS rows (16-row blocks up to 64-row chunks, 32-row blocks for 128), each block a
  plain 2-D tile in registers:

  1. the lower blocks of K Kᵀ (NB diagonal, NB(NB − 1)/2 below them), accumulated by tl.dot
     products over the key dimension in tiles of BK; β, the decays and the masks make them the
     blocks n_ij of N (exactly 0 above the diagonal and past the chunk);
  2. each diagonal block's inverse x_ii = (I + n_ii)⁻¹ by forward substitution, one row per
     step (the NB blocks side by side in one loop of BS steps);
  3. block forward substitution for the blocks below, x_ij = −x_ii Σ_{j≤m<i} n_im x_mj (block
     row i from the finished rows above it), in fp32 ("ieee" dots);
  4. A stored (the backward reads it), and W, U block row by block row,
     W_i = Σ_{j≤i} x_ij diag(β_j exp(b_j)) K_j, U_i = Σ_{j≤i} x_ij diag(β_j) V_j, over tiles
     of BD columns.

  Forward substitution cancels as it goes; a power series of N (Σ (−N)ⁿ) would sum terms far
  larger than A itself (e.g. with equal keys) and lose it to rounding. A non-finite key, value,
  β or gate at a late step (garbage in right padding) stays in its own and later rows, as in
  the recurrence: forward substitution sums earlier rows by ``where`` and the diagonal blocks'
  products are causal (triton_common._causal_dot).
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

from linrnn.engine.triton_common import (
    _bounds,
    _causal_dot,
    _state_tile,
    _tile,
    _tile_t,
    _vec,
    _walk,
)

# The WY kernel holds a chunk as NB ≤ 4 block rows of BS rows each (BL = NB·BS): block row i
# has token rows r_i, their mask m_i, β_i, the log decays g_i; the lower blocks of N and of its
# inverse are n_ij and x_ij (i ≥ j). Blocks past NB are never created (constexpr branches) or are
# zeros that no product reads.


@triton.jit
def _n_block(kk, beta_r, g_r, g_s, m_r, m_s, BS: tl.constexpr, DIAG: tl.constexpr,
             HAS_DECAY: tl.constexpr):  # fmt: skip
    """A block of N from its block of K Kᵀ: β_r exp(g_r − g_s) (k_r·k_s) where both rows are in
    the chunk (and s < r on a diagonal block), exactly 0 elsewhere. The exponent is ≤ 0 where
    kept; −inf elsewhere, so exp never sees a positive number from rows past the chunk."""
    keep = m_r[:, None] & m_s[None, :]
    if DIAG:
        o_i = tl.arange(0, BS)
        keep = keep & (o_i[:, None] > o_i[None, :])
    b_n = kk * beta_r[:, None]
    if HAS_DECAY:
        b_n = b_n * tl.exp(tl.where(keep, g_r[:, None] - g_s[None, :], float("-inf")))
    return tl.where(keep, b_n, 0.0)


@triton.jit
def _fs_step(b_y, o_i, t):
    """One row of forward substitution for the strictly lower part y of (I + n)⁻¹, y starting
    as −n: y_t = −n_t − Σ_{s<t} n_ts y_s (rows s < t of y final; row t of −n is 0 at s ≥ t).
    The sum takes rows s < t by ``where``: a later row's non-finite n (garbage in right
    padding) times row t's zero there would be NaN."""
    at_t = (o_i == t)[:, None]
    row = tl.sum(tl.where(at_t, b_y, 0.0), 0)  # −n_t
    row += tl.sum(tl.where((o_i < t)[:, None], row[:, None] * b_y, 0.0), 0)
    return tl.where(at_t, row[None, :], b_y)


@triton.jit
def _tri_dot(b_acc, x, z, BS: tl.constexpr, DOT_PREC: tl.constexpr):
    """b_acc + x z for a diagonal block x (lower triangular) and z of its own rows: a causal
    product (_causal_dot), so a later row's non-finite z reaches no earlier row."""
    o_i = tl.arange(0, BS)
    return _causal_dot(b_acc, x, z, o_i[:, None] >= o_i[None, :], DOT_PREC)


@triton.jit
def _unit(b_y, BS: tl.constexpr):
    """I + y."""
    o_i = tl.arange(0, BS)
    return b_y + tl.where(o_i[:, None] == o_i[None, :], 1.0, 0.0)


@triton.jit
def _mm(a, b):
    """a b in fp32 ("ieee")."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _xmm(x, z, BS: tl.constexpr):
    """x z in fp32 ("ieee") for a diagonal block x of A and z of its block row (_tri_dot)."""
    return _tri_dot(tl.zeros([BS, BS], dtype=tl.float32), x, z, BS, "ieee")


@triton.jit
def _a_block(p_a, x, r_i, m_i, c_j, L):
    """Store block x of A (rows r_i, chunk-local columns c_j; row stride L)."""
    p = p_a + r_i.to(tl.int64)[:, None] * L + c_j[None, :]
    tl.store(p, x, mask=m_i[:, None] & (c_j < L)[None, :])


@triton.jit
def _scaled(p_x, r, o_d, s_x, m, m_d, f):
    """diag(f) x of one block row, fp32 [BS, BD]."""
    return _tile(p_x, r, o_d, s_x, m, m_d).to(tl.float32) * f[:, None]


@triton.jit
def _put(p_y, r, o_d, s_y, m, m_d, y):
    """Store one block row of W or U in the output's dtype."""
    p = p_y + r.to(tl.int64)[:, None] * s_y + o_d[None, :]
    tl.store(p, y.to(p_y.dtype.element_ty), mask=m[:, None] & m_d[None, :])


@triton.jit
def _wu_part(p_x, p_y, D, s_x, s_y, r1, r2, r3, r4, m1, m2, m3, m4, f1, f2, f3, f4,
             x11, x21, x22, x31, x32, x33, x41, x42, x43, x44,
             NB: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr,
             DOT_PREC: tl.constexpr):  # fmt: skip
    """y = A diag(f) x over D columns in tiles of BD, block row by block row:
    y_i = Σ_{j≤i} x_ij (f_j ⊙ x_j) (x at p_x, row stride s_x; y at p_y, row stride s_y); the
    diagonal blocks' products are causal (:func:`_tri_dot`)."""
    zero = tl.zeros([BS, BD], dtype=tl.float32)
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        y1 = _scaled(p_x, r1, o_d, s_x, m1, m_d, f1)
        _put(p_y, r1, o_d, s_y, m1, m_d, _tri_dot(zero, x11, y1, BS, DOT_PREC))
        if NB > 1:
            y2 = _scaled(p_x, r2, o_d, s_x, m2, m_d, f2)
            o2 = tl.dot(x21, y1, input_precision=DOT_PREC)
            o2 = _tri_dot(o2, x22, y2, BS, DOT_PREC)
            _put(p_y, r2, o_d, s_y, m2, m_d, o2)
        if NB > 2:
            y3 = _scaled(p_x, r3, o_d, s_x, m3, m_d, f3)
            y4 = _scaled(p_x, r4, o_d, s_x, m4, m_d, f4)
            o3 = tl.dot(x31, y1, input_precision=DOT_PREC)
            o3 = tl.dot(x32, y2, o3, input_precision=DOT_PREC)
            o3 = _tri_dot(o3, x33, y3, BS, DOT_PREC)
            _put(p_y, r3, o_d, s_y, m3, m_d, o3)
            o4 = tl.dot(x41, y1, input_precision=DOT_PREC)
            o4 = tl.dot(x42, y2, o4, input_precision=DOT_PREC)
            o4 = tl.dot(x43, y3, o4, input_precision=DOT_PREC)
            o4 = _tri_dot(o4, x44, y4, BS, DOT_PREC)
            _put(p_y, r4, o_d, s_y, m4, m_d, o4)


@triton.jit(do_not_specialize=["T", "NT"])
def wy_fwd_kernel(
    k, v, beta, b, A, w, u, chunks,
    T, H, G, K, V, L, NT,
    BS: tl.constexpr, NB: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr,
    HAS_DECAY: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks, B·H): the WY preparation of one chunk as NB ∈ {1, 2, 4} block rows of BS
    rows (NB·BS ≥ L): A = (I + N)⁻¹ into A [B·H, T, L], W = A diag(β exp(b)) K into
    w [B, T, H, K] and U = A diag(β) V into u [B, T, H, V]."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    HK = H // G  # q/k heads: value head i_h reads q/k head i_h // G
    c0, c1, _seq = _bounds(chunks, i_c, L, T, VARLEN)
    o_i = tl.arange(0, BS)
    o1, o2, o3, o4 = o_i, o_i + BS, o_i + 2 * BS, o_i + 3 * BS  # chunk-local rows and columns
    r1, r2, r3, r4 = c0 + o1, c0 + o2, c0 + o3, c0 + o4
    m1, m2, m3, m4 = r1 < c1, r2 < c1, r3 < c1, r4 < c1  # false past block row NB (c1 ≤ c0 + L)
    p_beta = beta + i_b * T * H + i_h
    be1, be2, be3, be4 = (_vec(p_beta, r1 * H, m1), _vec(p_beta, r2 * H, m2),
                          _vec(p_beta, r3 * H, m3), _vec(p_beta, r4 * H, m4))  # fmt: skip
    if HAS_DECAY:
        p_b = b + i_bh * T
        g1, g2, g3, g4 = _vec(p_b, r1, m1), _vec(p_b, r2, m2), _vec(p_b, r3, m3), _vec(p_b, r4, m4)
    else:
        g1, g2, g3, g4 = be1, be2, be3, be4  # never read
    p_k = k + (i_b * T * HK + i_h // G) * K
    p_a = A + i_bh * T * L
    zero = tl.zeros([BS, BS], dtype=tl.float32)
    x21, x22, x31, x32, x33, x41, x42, x43, x44 = (zero, zero, zero, zero, zero, zero, zero,
                                                   zero, zero)  # fmt: skip

    # The lower blocks of K Kᵀ, accumulated over the key dimension in tiles of BK
    kk11, kk21, kk22, kk31, kk32, kk33, kk41, kk42, kk43, kk44 = (
        zero, zero, zero, zero, zero, zero, zero, zero, zero, zero)  # fmt: skip
    for d0 in range(0, K, BK):
        o_d = d0 + tl.arange(0, BK)
        m_d = o_d < K
        k1 = _tile(p_k, r1, o_d, HK * K, m1, m_d)  # [BS, BK]
        kk11 = tl.dot(k1, tl.trans(k1), kk11, input_precision=DOT_PREC)
        if NB > 1:
            k2 = _tile(p_k, r2, o_d, HK * K, m2, m_d)
            kk21 = tl.dot(k2, tl.trans(k1), kk21, input_precision=DOT_PREC)
            kk22 = tl.dot(k2, tl.trans(k2), kk22, input_precision=DOT_PREC)
        if NB > 2:
            k3 = _tile(p_k, r3, o_d, HK * K, m3, m_d)
            k4 = _tile(p_k, r4, o_d, HK * K, m4, m_d)
            kk31 = tl.dot(k3, tl.trans(k1), kk31, input_precision=DOT_PREC)
            kk32 = tl.dot(k3, tl.trans(k2), kk32, input_precision=DOT_PREC)
            kk33 = tl.dot(k3, tl.trans(k3), kk33, input_precision=DOT_PREC)
            kk41 = tl.dot(k4, tl.trans(k1), kk41, input_precision=DOT_PREC)
            kk42 = tl.dot(k4, tl.trans(k2), kk42, input_precision=DOT_PREC)
            kk43 = tl.dot(k4, tl.trans(k3), kk43, input_precision=DOT_PREC)
            kk44 = tl.dot(k4, tl.trans(k4), kk44, input_precision=DOT_PREC)

    # The diagonal blocks' inverses (I + n_ii)⁻¹, by forward substitution, all in one loop
    y11 = -_n_block(kk11, be1, g1, g1, m1, m1, BS, True, HAS_DECAY)
    if NB > 1:
        y22 = -_n_block(kk22, be2, g2, g2, m2, m2, BS, True, HAS_DECAY)
    if NB > 2:
        y33 = -_n_block(kk33, be3, g3, g3, m3, m3, BS, True, HAS_DECAY)
        y44 = -_n_block(kk44, be4, g4, g4, m4, m4, BS, True, HAS_DECAY)
    for t in range(1, BS):
        y11 = _fs_step(y11, o_i, t)
        if NB > 1:
            y22 = _fs_step(y22, o_i, t)
        if NB > 2:
            y33 = _fs_step(y33, o_i, t)
            y44 = _fs_step(y44, o_i, t)
    x11 = _unit(y11, BS)

    # Block forward substitution: x_ij = −x_ii Σ_{j≤m<i} n_im x_mj, block row by block row
    if NB > 1:
        x22 = _unit(y22, BS)
        n21 = _n_block(kk21, be2, g2, g1, m2, m1, BS, False, HAS_DECAY)
        x21 = -_xmm(x22, _mm(n21, x11), BS)
    if NB > 2:
        x33 = _unit(y33, BS)
        x44 = _unit(y44, BS)
        n31 = _n_block(kk31, be3, g3, g1, m3, m1, BS, False, HAS_DECAY)
        n32 = _n_block(kk32, be3, g3, g2, m3, m2, BS, False, HAS_DECAY)
        x32 = -_xmm(x33, _mm(n32, x22), BS)
        x31 = -_xmm(x33, _mm(n31, x11) + _mm(n32, x21), BS)
        n41 = _n_block(kk41, be4, g4, g1, m4, m1, BS, False, HAS_DECAY)
        n42 = _n_block(kk42, be4, g4, g2, m4, m2, BS, False, HAS_DECAY)
        n43 = _n_block(kk43, be4, g4, g3, m4, m3, BS, False, HAS_DECAY)
        x43 = -_xmm(x44, _mm(n43, x33), BS)
        x42 = -_xmm(x44, _mm(n42, x22) + _mm(n43, x32), BS)
        x41 = -_xmm(x44, _mm(n41, x11) + _mm(n42, x21) + _mm(n43, x31), BS)

    # A: the lower blocks and the zeros above them
    _a_block(p_a, x11, r1, m1, o1, L)
    if NB > 1:
        _a_block(p_a, zero, r1, m1, o2, L)
        _a_block(p_a, x21, r2, m2, o1, L)
        _a_block(p_a, x22, r2, m2, o2, L)
    if NB > 2:
        _a_block(p_a, zero, r1, m1, o3, L)
        _a_block(p_a, zero, r1, m1, o4, L)
        _a_block(p_a, zero, r2, m2, o3, L)
        _a_block(p_a, zero, r2, m2, o4, L)
        _a_block(p_a, x31, r3, m3, o1, L)
        _a_block(p_a, x32, r3, m3, o2, L)
        _a_block(p_a, x33, r3, m3, o3, L)
        _a_block(p_a, zero, r3, m3, o4, L)
        _a_block(p_a, x41, r4, m4, o1, L)
        _a_block(p_a, x42, r4, m4, o2, L)
        _a_block(p_a, x43, r4, m4, o3, L)
        _a_block(p_a, x44, r4, m4, o4, L)

    if HAS_DECAY:
        f1, f2, f3, f4 = be1 * tl.exp(g1), be2 * tl.exp(g2), be3 * tl.exp(g3), be4 * tl.exp(g4)
    else:
        f1, f2, f3, f4 = be1, be2, be3, be4
    _wu_part(p_k, w + (i_b * T * H + i_h) * K, K, HK * K, H * K, r1, r2, r3, r4, m1, m2, m3,
             m4, f1, f2, f3, f4, x11, x21, x22, x31, x32, x33, x41, x42, x43, x44, NB, BS, BD,
             DOT_PREC)  # fmt: skip
    _wu_part(v + (i_b * T * H + i_h) * V, u + (i_b * T * H + i_h) * V, V, H * V, H * V, r1,
             r2, r3, r4, m1, m2, m3, m4, be1, be2, be3, be4, x11, x21, x22, x31, x32, x33,
             x41, x42, x43, x44, NB, BS, BD, DOT_PREC)  # fmt: skip


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
