"""Triton kernels of the scalar-gate chunk engine's dq and dk for large head groups (Mamba2's B
and C shared by G value heads; docs/DESIGN.md §11), without the max state or a normalizer.

In the notation of scalar_kernels (q = C, k = B), the intra-chunk parts of dq and dk summed over
a group's value heads h go through one matrix per group and chunk::

    M_rs = scale·Σ_h D^h_rs (do^h_r·v^h_s)        (s ≤ r; D^h the head's decay weights)
    Σ_h dq^h_r = scale·Σ_h e^h_r do^h_r C^hᵀ + Σ_s M_rs k_s
    Σ_h dk^h_s = Σ_h w^h_s v^h_s dC^hᵀ + Σ_r M_rs q_r

(mamba_ssm's dCB), so the products with k and q run once per group instead of once per head.
The gate gradients need q·dq^h and k·dk^h per value head: their intra parts are the row and
column sums of M^h_rs (q_r·k_s), with the scores q_r·k_s formed once per tile and group from q
and k (no stored score matrix).

* ``dscores_kernel`` — M ([B·HK, NT, L, L] in q's dtype, the tiles on and below the diagonal:
  the dq and dk kernels cast it to that dtype for their products anyway), and per value head
  the tile's row and column sums of M^h∘(q·k).
* ``dqk_group_kernel`` — dq or dk: the inter-chunk parts per head (with their parts of q·dq,
  k·dk, to which the first K tile adds dscores_kernel's sums) summed over the group, plus the
  one product with M (Mᵀ for dk).
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import _chunk_rows, _state_tile, _tile, _tile_t, _vec


@triton.jit(do_not_specialize=["T", "NT", "NQ"])
def dscores_kernel(
    do, v, q, k, g, gi, dm, qdq, kdk, chunks, T, H, G, K, V, L, NT, NQ, scale,
    BQ: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr, ND: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, DOT_PREC: tl.constexpr,
    VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × row tiles × column tiles, B·HK): dm [B·HK, NT, L, L] (chunk-local rows r,
    columns s) of one tile on or below the diagonal, and per value head the tile's row sums of
    M^h∘(q·k) at qdq [column tiles, B·H, T] (``HAS_DECAY``) and its column sums at kdk [row
    tiles, B·H, T] (with a gate). Tiles above the diagonal (and past a chunk's end) store
    nothing, neither do their slots get read. ``ND`` = cdiv(V, BD), the depth tiles."""
    i_x, i_p = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_cq, i_j = i_x // NQ, i_x % NQ  # (chunk, row tile), column tile
    i_c, c0, c1, _i_n, r0, o_r, m_r = _chunk_rows(chunks, i_cq, NQ, L, T, BQ, VARLEN)
    s0 = c0 + i_j * BQ
    if (r0 >= c1) | (s0 > r0):
        return
    o_s = s0 + tl.arange(0, BQ)
    m_s = o_s < c1
    HK = H // G
    i_b, i_hk = i_p // HK, i_p % HK
    rows = tl.num_programs(1) * G  # B·H
    i_i = (r0 - c0) // BQ  # the row tile
    causal = (o_r[:, None] >= o_s[None, :]) & m_r[:, None] & m_s[None, :]
    if HAS_DECAY or HAS_IGATE:  # the scores q_r·k_s of the tile, for the gate gradients
        qk = (i_b * T * HK + i_hk) * K
        b_qk = tl.zeros([BQ, BQ], dtype=tl.float32)
        for d0 in range(0, K, BK):
            o_d = d0 + tl.arange(0, BK)
            m_d = o_d < K
            b_q = _tile(q + qk, o_r, o_d, HK * K, m_r, m_d)  # [BQ, BK]
            b_qk += tl.dot(b_q, _tile_t(k + qk, o_s, o_d, HK * K, m_s, m_d),
                           input_precision=DOT_PREC)  # fmt: skip
    b_m = tl.zeros([BQ, BQ], dtype=tl.float32)
    for j in range(G):
        i_h = i_hk * G + j
        i_bh = i_b * H + i_h
        p_do = do + (i_b * T * H + i_h) * V
        p_v = v + (i_b * T * H + i_h) * V
        b_p = tl.zeros([BQ, BQ], dtype=tl.float32)
        for i_d in tl.static_range(ND):  # unrolled: the loop over heads is the one pipelined
            o_d = i_d * BD + tl.arange(0, BD)
            m_d = o_d < V
            b_do = _tile(p_do, o_r, o_d, H * V, m_r, m_d)  # [BQ, BD]
            b_p += tl.dot(b_do, _tile_t(p_v, o_s, o_d, H * V, m_s, m_d), input_precision=DOT_PREC)
        lw = tl.zeros([BQ, BQ], dtype=tl.float32)
        if HAS_DECAY:
            lw += (_vec(g + i_bh * T, o_r, m_r))[:, None] - (_vec(g + i_bh * T, o_s, m_s))[None, :]
        if HAS_IGATE:
            lw += (_vec(gi + i_bh * T, o_s, m_s))[None, :]
        b_mh = b_p * tl.exp(tl.where(causal, lw, float("-inf"))) * scale
        b_m += b_mh
        if HAS_DECAY or HAS_IGATE:
            b_w = b_mh * b_qk
            if HAS_DECAY:
                tl.store(qdq + (i_j * rows + i_bh) * T + o_r, tl.sum(b_w, 1), mask=m_r)
            tl.store(kdk + (i_i * rows + i_bh) * T + o_s, tl.sum(b_w, 0), mask=m_s)
    base = dm + (i_p * NT + i_c) * L * L - c0 * (L + 1)  # tiles addressed by absolute tokens
    p_m = base + o_r.to(tl.int64)[:, None] * L + o_s[None, :]
    tl.store(p_m, b_m.to(dm.dtype.element_ty), mask=m_r[:, None] & m_s[None, :])


@triton.jit(do_not_specialize=["T", "NT", "NQ"])
def dqk_group_kernel(
    x, a, b, st, g, gi, dm, out, part, part_in, chunks, T, H, G, K, V, L, NT, NQ, scale,
    BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr, ND: tl.constexpr, BS: tl.constexpr,
    NS: tl.constexpr, DK: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr,
    DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × row tiles, K tiles, B·HK): one row tile (rows r) of

    * dq [B, T, HK, K] (``DK`` false: x = do, a = q, b = k, st = the chunk states h): the sum
      over the group of scale·e^h_r do^h_r C^hᵀ, plus Σ_{s≤r} dm_rs k_s;
    * dk [B, T, HK, K] (``DK``: x = v, a = k, b = q, st = their gradients dh): the sum over the
      group of w^h_r v^h_r dC^hᵀ, w^h_r = exp(b_L − b_r + a_r), plus Σ_{s≥r} dm_sr q_s.

    With a gate (``HAS_DECAY``; for dk also ``HAS_IGATE``): per value head this K tile's part
    of a·out (q·dq, k·dk) at part [K tiles, B·H, T], the first K tile's with the intra-chunk
    sums of dscores_kernel (part_in, in its NS = cdiv(L, BS) tiles of BS rows: its row sums by
    column tile for dq, its column sums by row tile for dk) added, the slots it wrote (on and
    below the diagonal, within the chunk) in tile order. ``ND`` = cdiv(V, BD). The loops over
    depth and part_in's tiles are unrolled, so that the loop over the group's heads is the
    innermost one, which Triton pipelines (the next heads' loads in flight during this one's
    products)."""
    i_cq, i_k, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_c, c0, c1, _i_n, r0, o_r, m_r = _chunk_rows(chunks, i_cq, NQ, L, T, BQ, VARLEN)
    if r0 >= c1:
        return
    o_k = i_k * BO + tl.arange(0, BO)
    m_k = o_k < K
    HK = H // G
    i_b, i_hk = i_p // HK, i_p % HK
    qk = (i_b * T * HK + i_hk) * K
    rows = tl.num_programs(2) * G  # B·H
    t_r = (o_r - c0) // BS  # each row's tile in dscores_kernel's tiling
    b_acc = tl.zeros([BQ, BO], dtype=tl.float32)
    if HAS_DECAY or HAS_IGATE:
        b_a = _tile(a + qk, o_r, o_k, HK * K, m_r, m_k).to(tl.float32)
    for j in range(G):
        i_h = i_hk * G + j
        i_bh = i_b * H + i_h
        p_x = x + (i_b * T * H + i_h) * V
        p_st = st + (i_bh * NT + i_c) * K * V
        b_int = tl.zeros([BQ, BO], dtype=tl.float32)
        for i_d in tl.static_range(ND):
            o_d = i_d * BD + tl.arange(0, BD)
            m_d = o_d < V
            b_x = _tile(p_x, o_r, o_d, H * V, m_r, m_d)  # [BQ, BD]
            b_s = _state_tile(p_st, o_d, o_k, 1, V, m_d, m_k)  # C_cᵀ or dC_c+1ᵀ [BD, BO]
            b_int += tl.dot(b_x, b_s.to(b_x.dtype), input_precision=DOT_PREC)
        if DK:
            if HAS_DECAY or HAS_IGATE:
                lw = tl.zeros([BQ], dtype=tl.float32)
                if HAS_DECAY:
                    lw += tl.load(g + i_bh * T + c1 - 1) - _vec(g + i_bh * T, o_r, m_r)
                if HAS_IGATE:
                    lw += _vec(gi + i_bh * T, o_r, m_r)
                b_int *= tl.exp(tl.where(m_r, lw, float("-inf")))[:, None]  # w_r ≤ 1
        elif HAS_DECAY:
            b_int *= (scale * tl.exp(_vec(g + i_bh * T, o_r, m_r)))[:, None]
        else:
            b_int *= scale
        if HAS_DECAY or HAS_IGATE:
            b_part = tl.sum(b_a * b_int, 1)
            if i_k == 0:  # the intra-chunk parts, one per dscores tile on or below the diagonal
                for i_t in tl.static_range(NS):
                    if DK:  # column sums of row tile i_t: written where it is a later tile
                        # within the chunk (as a vector: the interpreter takes no scalar mask)
                        m_t = m_r & (t_r <= i_t) & (o_r * 0 + c0 + i_t * BS < c1)
                    else:  # row sums of column tile i_t: written where it is an earlier tile
                        m_t = m_r & (t_r >= i_t)
                    b_part += _vec(part_in + (i_t * rows + i_bh) * T, o_r, m_t)
            tl.store(part + (i_k * rows + i_bh) * T + o_r, b_part, mask=m_r)
        b_acc += b_int
    # the partner tiles of the intra-chunk terms: keys up to this tile's last row (dq), queries
    # from its first row on (dk); dm is read on its causal triangle only (dscores_kernel writes
    # no tile above the diagonal)
    if DK:
        p_lo, p_hi = r0, c1
    else:
        p_lo, p_hi = c0, tl.minimum(r0 + BQ, c1)
    base = dm + (i_p * NT + i_c) * L * L - c0 * (L + 1)  # dm's tiles by absolute tokens
    for s0 in range(p_lo, p_hi, BQ):
        o_s = s0 + tl.arange(0, BQ)
        m_s = o_s < c1
        b_b = _tile(b + qk, o_s, o_k, HK * K, m_s, m_k)  # [BQ, BO]
        if DK:
            causal = (o_s[None, :] >= o_r[:, None]) & m_r[:, None] & m_s[None, :]
            p_m = base + o_s.to(tl.int64)[None, :] * L + o_r[:, None]  # dm_sr [BQ (r), BQ (s)]
        else:
            causal = (o_s[None, :] <= o_r[:, None]) & m_r[:, None] & m_s[None, :]
            p_m = base + o_r.to(tl.int64)[:, None] * L + o_s[None, :]  # dm_rs [BQ (r), BQ (s)]
        b_m = tl.load(p_m, mask=causal, other=0.0)
        b_acc += tl.dot(b_m.to(b_b.dtype), b_b, input_precision=DOT_PREC)
    p_out = out + qk + o_r.to(tl.int64)[:, None] * HK * K + o_k[None, :]
    tl.store(p_out, b_acc.to(out.dtype.element_ty), mask=m_r[:, None] & m_k[None, :])
