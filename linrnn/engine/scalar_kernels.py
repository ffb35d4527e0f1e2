"""Triton kernels of the chunkwise engine for scalar gates (docs/DESIGN.md §3, TFLA two-level).

Per sequence and head, inside chunk c (rows r, columns s, both chunk-local; ``b`` the chunk-local
cumulative log decay, ``a`` the log input gate, ``m`` the mLSTM max state)::

    D_rs  = exp(b_r − b_s + a_s − m_r)                                (s ≤ r, else 0)
    o_r   = scale·[ exp(b_r + m_c − m_r) q_r C_c + Σ_s D_rs (q_r·k_s) v_s ]
    C_c+1 = exp(b_L + m_c − m_c+1) C_c + Σ_s exp(b_L − b_s + a_s − m_c+1) k_s v_sᵀ

Every exponent is ≤ 0: without the stabilizer b is non-increasing and a ≤ 0; with it, m_r and
m_c+1 are the exact maxima of the terms they divide (computed here from the same fp32 values).
The normalizer n rides along as a vector state beside C.

One kernel per job (the chunk-state walks ``states_fwd_kernel`` and ``states_bwd_kernel`` and
the normalizer's ``norm_bwd_kernel`` are in :mod:`scalar_state_kernels`, with the same flags and
layouts):

* ``out_fwd_kernel`` — the output, tiled over (query tile, V tile), looping over the chunk's key
  tiles and over depth tiles. The exact row max m_r comes from the chunk's running maximum of
  a − b (the cumulative-sum pass gives it), so the main loop needs no online rescaling.
* ``dq_bwd_kernel`` — dq: the forward's products with (q, k, v, C) → (do, v, k, Cᵀ); it shares
  the forward's body (:func:`_rows_inter`, :func:`_rows_intra`).
* ``dk_bwd_kernel``, ``dv_bwd_kernel`` — the transposed-causal products, tiled over (key tile,
  output tile): dv from (k, q, do, dC), dk from (v, do, q, dCᵀ); one body (:func:`_cols`).
* ``dqk_bwd_kernel`` — dq and dk together for chunks of one time tile: their intra-chunk parts
  are one weighted matrix (rows for dq, columns for dk), formed once.

Optional tensors are None with a ``HAS_*`` flag the host derives from them: ``HAS_DECAY`` (g,
the rows of b), ``HAS_IGATE`` (gi, the rows of a), ``HAS_MAX`` (the max state: mc, m_row),
``HAS_N`` (the normalizer state), ``HAS_NORM`` (the normalizer's row factors ra, rd),
``HAS_H0`` / ``HAS_DHT`` (initial state, final state's gradient). ``NORM`` is the normalizer's
kind (:func:`linrnn.engine.config.norm_code`). ``PER_HEAD`` (a log decay that is one value per
head for every token, retention's): g holds the [H] values, and the kernels form the
chunk-local cumulative decay b_s = (s − c0 + 1)·g of the rows they need instead of loading
them (triton_common._cum): no gate loads, and no layout conversions of loaded gate vectors
in the loops.

Per-channel decays (GLA's gk/gv, RWKV6's w and u) have kernels of their own: vector_kernels.

Layouts: q, k, v, o and their gradients ``[B, T, H, D]`` contiguous; gates and per-row values
``[B·H, T]`` fp32; chunk states and their gradients ``[B·H, NT, K, V]`` in the inputs' 16-bit
dtype (fp32 for fp32 inputs; every reader casts them to that dtype for its products); initial
and final states fp32; max states ``[B·H, NT + NSEQ]``.
Offsets are int64. Grouped value heads (the delta rule, Mamba2's B/C groups): every kernel but
the normalizer's takes G value heads per q/k head; H counts the value heads (rows B·H), q and k
are ``[B, T, H/G, K]`` and value head h reads q/k head h // G; the dq and dk kernels sum HPP
value heads of a group per program into ``[B, T, H/HPP, K]`` (HPP = G: the group's gradient
itself, no per-head copy; the caller sums the G/HPP slots of a group when HPP < G). The other
families pass G = 1. ``HAS_SKIP`` (out and dv): a per-head skip term skip[h]·v_r added to the
output (Mamba2's D·x).
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import (
    FLAG_BLOCK,
    NORM_NONE,
    _any_flag,
    _causal_dot,
    _chunk_rows,
    _cum,
    _cum_last,
    _dot_n,
    _inv_denominator,
    _log_weights,
    _not_finite,
    _program_slot,
    _slot_ids,
    _slot_span,
    _state_tile,
    _tile,
    _tile_t,
    _vec,
)

# The output and dq share one body: rows r of one query tile,
#
#     out_r = scale·[ e_r (A_r x_r S_c + dd_r n_c) + Σ_{s≤r} D_rs (A_r x_r·y_s + dd_r) z_s ],
#
# e_r = exp(b_r + m_c − m_r); forward: (x, y, z, S) = (q, k, v, C), A = 1, dd = 0; dq: (do, v,
# k, Cᵀ) with A = 1/denominator and dd the normalizer's row gradient (``AFFINE``).


@triton.jit
def _rows_inter(p_x, p_y, p_s, p_n, o_r, m_r, o_o, m_o, D, s_x, s_sd, s_so,
                BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr, DEN: tl.constexpr,
                DOT_PREC: tl.constexpr, SCORES: tl.constexpr = True):  # fmt: skip
    """One pass over depth for the rows o_r: the inter-chunk product x_r·S_c [BQ, BO] (S_c at
    p_s with element strides (s_sd, s_so)) and the diagonal key tile's scores x_r·y_s [BQ, BQ]
    (the key tile s = r0 is the query tile itself) share each load of x; ``DEN``: also x_r·n_c
    [BQ] (n_c at p_n). x and y have row stride s_x. Returns (inter, scores, den); without
    ``SCORES`` the scores are zeros, not formed."""
    b_acc = tl.zeros([BQ, BO], dtype=tl.float32)
    b_den = tl.zeros([BQ], dtype=tl.float32)
    b_p = tl.zeros([BQ, BQ], dtype=tl.float32)
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_r, o_d, s_x, m_r, m_d)  # [BQ, BD]
        b_s = _state_tile(p_s, o_d, o_o, s_sd, s_so, m_d, m_o)  # [BD, BO]
        b_acc += tl.dot(b_x, b_s.to(b_x.dtype), input_precision=DOT_PREC)
        if SCORES:
            b_p += tl.dot(b_x, _tile_t(p_y, o_r, o_d, s_x, m_r, m_d), input_precision=DOT_PREC)
        if DEN:
            b_n = _vec(p_n, o_d, m_d)
            b_den += _dot_n(b_x, b_n, DOT_PREC)
    return b_acc, b_p, b_den


@triton.jit
def _diag_weighted(b_p, gi, b_br, b_mr, b_A, b_dd, o_r, m_r, BQ: tl.constexpr,
                   HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
                   AFFINE: tl.constexpr, FIX: tl.constexpr):  # fmt: skip
    """The diagonal tile's scores b_p [BQ, BQ] of the rows o_r times their weights D_rs
    (``AFFINE``: p_rs → A_r p_rs + dd_r first). Returns (weighted scores, causal mask)."""
    if AFFINE:
        b_p = b_p * b_A[:, None] + b_dd[:, None]
    b_ar = _vec(gi, o_r, m_r) if HAS_IGATE else tl.zeros([BQ], dtype=tl.float32)
    causal = (o_r[:, None] >= o_r[None, :]) & m_r[:, None]  # s ≤ r < c1
    w = _log_weights(b_br, b_br, b_ar, b_mr, causal, HAS_DECAY, HAS_IGATE, HAS_MAX)
    if FIX:
        b_p = tl.where(causal, b_p * w, 0.0)  # not b_p·w: a later key's NaN score times 0
    else:  # a later key's NaN score times 0 leaves a NaN row: the caller re-forms the tile
        b_p *= w
    return b_p, causal


@triton.jit
def _rows_intra(b_acc, b_den, b_p, p_x, p_y, p_z, g, gi, b_br, b_mr, b_A, b_dd, o_r, m_r, r0,
                c0, c1, o_o, m_o, D, s_x, s_z, BQ: tl.constexpr, BD: tl.constexpr,
                HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
                DEN: tl.constexpr, AFFINE: tl.constexpr, DOT_PREC: tl.constexpr,
                FIX: tl.constexpr, PER_HEAD: tl.constexpr):  # fmt: skip
    """Adds Σ_{s≤r} D_rs p_rs z_s to b_acc [BQ, BO]: the diagonal key tile from its scores b_p
    (causal mask), then the full key tiles before it. ``AFFINE``: p_rs → A_r p_rs + dd_r (b_A,
    b_dd [BQ]); ``DEN``: also Σ_s D_rs p_rs into b_den. Row strides: s_x of x and y, s_z of
    z. The diagonal tile's product is a plain one: the output kernel's first launch flags a
    result that is not finite (fix_pass.launch) and forms that tile again with ``FIX``, the
    causal product :func:`_causal_dot`; dq needs no causal product (docs/DESIGN.md §6.1,
    "The backward"). Returns (acc, den)."""
    b_p, causal = _diag_weighted(b_p, gi, b_br, b_mr, b_A, b_dd, o_r, m_r, BQ, HAS_DECAY,
                                 HAS_IGATE, HAS_MAX, AFFINE, FIX)  # fmt: skip
    if DEN:
        b_den += tl.sum(b_p, 1)
    b_z = _tile(p_z, o_r, o_o, s_z, m_r, m_o)  # [BQ, BO]
    if FIX:
        b_acc = _causal_dot(b_acc, b_p, b_z, causal, DOT_PREC)
    else:
        b_acc += tl.dot(b_p.to(b_z.dtype), b_z, input_precision=DOT_PREC)
    for s0 in range(c0, r0, BQ):
        o_s = s0 + tl.arange(0, BQ)
        m_s = o_s < c1
        b_p = tl.zeros([BQ, BQ], dtype=tl.float32)
        for d0 in range(0, D, BD):
            o_d = d0 + tl.arange(0, BD)
            m_d = o_d < D
            b_x = _tile(p_x, o_r, o_d, s_x, m_r, m_d)  # [BQ, BD]
            b_yt = _tile_t(p_y, o_s, o_d, s_x, m_s, m_d)  # [BD, BQ]
            b_p += tl.dot(b_x, b_yt, input_precision=DOT_PREC)
        if AFFINE:
            b_p = b_p * b_A[:, None] + b_dd[:, None]
        b_bs = _cum(g, o_s, m_s, c0, PER_HEAD) if HAS_DECAY else tl.zeros([BQ], dtype=tl.float32)
        b_as = _vec(gi, o_s, m_s) if HAS_IGATE else tl.zeros([BQ], dtype=tl.float32)
        full = m_r[:, None] & m_s[None, :]  # every s < r0 ≤ r
        b_p *= _log_weights(b_br, b_bs, b_as, b_mr, full, HAS_DECAY, HAS_IGATE, HAS_MAX)
        if DEN:
            b_den += tl.sum(b_p, 1)
        b_z = _tile(p_z, o_s, o_o, s_z, m_s, m_o)  # [BQ, BO]
        b_acc += tl.dot(b_p.to(b_z.dtype), b_z, input_precision=DOT_PREC)
    return b_acc, b_den


@triton.jit
def _rows_one(p_x, p_y, p_s, p_n, gi, b_br, b_mr, o_r, m_r, o_o, m_o, D, s_x, s_sd, s_so,
              BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr, Z_DTYPE: tl.constexpr,
              HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
              DEN: tl.constexpr, DOT_PREC: tl.constexpr, FIX: tl.constexpr):  # fmt: skip
    """The output's :func:`_rows_inter` and the diagonal tile of :func:`_rows_intra` for a chunk
    that is one query tile (L ≤ BQ): the weighted scores D_rs p_rs first (their row sums with
    ``DEN``), kept as Z_DTYPE operands (what the product casts them to), then the inter-chunk
    product x_r·S_c (``DEN``: x_r·n_c), so a [BQ, BQ] fp32 block is not live beside the
    accumulator. The caller finishes as after :func:`_rows_inter`, then adds the scores' product
    (the same operations in the same order: the results are the two-function path's). Returns
    (inter, den, scores, score sums)."""
    b_p = tl.zeros([BQ, BQ], dtype=tl.float32)
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_r, o_d, s_x, m_r, m_d)  # [BQ, BD]
        b_p += tl.dot(b_x, _tile_t(p_y, o_r, o_d, s_x, m_r, m_d), input_precision=DOT_PREC)
    b_p, _ = _diag_weighted(b_p, gi, b_br, b_mr, None, None, o_r, m_r, BQ, HAS_DECAY, HAS_IGATE,
                            HAS_MAX, False, FIX)  # fmt: skip
    b_psum = tl.sum(b_p, 1) if DEN else tl.zeros([BQ], dtype=tl.float32)
    b_pz = b_p.to(Z_DTYPE)
    b_acc, _, b_den = _rows_inter(p_x, p_y, p_s, p_n, o_r, m_r, o_o, m_o, D, s_x, s_sd, s_so,
                                  BQ, BD, BO, DEN, DOT_PREC, False)  # fmt: skip
    return b_acc, b_den, b_pz, b_psum


@triton.jit
def _rows_one_end(b_acc, b_den, b_pz, b_psum, p_z, o_r, m_r, o_o, m_o, s_z, DEN: tl.constexpr,
                  DOT_PREC: tl.constexpr, FIX: tl.constexpr):  # fmt: skip
    """The diagonal tile's part of :func:`_rows_intra` from :func:`_rows_one`'s scores."""
    if DEN:
        b_den += b_psum
    b_z = _tile(p_z, o_r, o_o, s_z, m_r, m_o)  # [BQ, BO]
    if FIX:
        causal = (o_r[:, None] >= o_r[None, :]) & m_r[:, None]
        b_acc = _causal_dot(b_acc, b_pz, b_z, causal, DOT_PREC)
    else:
        b_acc += tl.dot(b_pz, b_z, input_precision=DOT_PREC)
    return b_acc, b_den


@triton.jit(do_not_specialize=["T", "NT", "NQ", "NSEQ", "SLOTS"])
def out_fwd_kernel(
    q, k, v, h, hn, mc, g, gi, o, den, m_row, chunks,
    T, H, G, K, V, L, NT, NQ, NSEQ, scale, eps,
    BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr, NORM: tl.constexpr,
    DOT_PREC: tl.constexpr, VARLEN: tl.constexpr, skip=None, HAS_SKIP: tl.constexpr = False,
    bad=None, SLOTS=0, FIX: tl.constexpr = False, ONE_TILE: tl.constexpr = False, rmax=None,
    PER_HEAD: tl.constexpr = False,
):  # fmt: skip
    """Grid (chunks × query tiles, V tiles, B·H): o_r = scale·[e_r q_r C_c + Σ_{s≤r} D_rs
    (q_r·k_s) v_s] of one query tile from the chunk states h (and hn, mc). ``NORM``: divided
    by the normalizer's denominator, den [B·H, T] = scale·q·n stored; ``HAS_MAX``: the row max
    m_r = b_r + max(m_c, rmax_r) stored in m_row [B·H, T] (rmax: the running maximum of a − b
    within the chunk, scalar_cumsum_kernels). ``HAS_SKIP``: plus the skip term skip[h]·v_r
    (skip [H] fp32, after the normalizer: Mamba2's D·x).

    Launched twice (fix_pass.launch): each tile with a plain diagonal product, flagging in bad
    [SLOTS] (int8, one per program of that grid) whether it came out finite; then, ``FIX``, a
    few programs that find the flagged tiles and form them again with the causal product
    (triton_common._causal_dot), so that a later step's non-finite value reaches no earlier
    row (docs/DESIGN.md §6.1)."""
    if FIX:
        lo, hi = _slot_span(SLOTS)
        for s0 in range(lo, hi, FLAG_BLOCK):
            if _any_flag(bad, s0, hi):
                for slot in range(s0, tl.minimum(s0 + FLAG_BLOCK, hi)):
                    if tl.load(bad + slot) != 0:
                        i_cq, i_v, i_bh = _slot_ids(slot, NT * NQ, tl.cdiv(V, BO))
                        i_c, c0, c1, i_n, r0, o_r, m_r = _chunk_rows(chunks, i_cq, NQ, L, T, BQ,
                                                                     VARLEN)  # fmt: skip
                        _out_tile(q, k, v, h, hn, mc, g, gi, rmax, o, den, m_row, skip, bad, slot,
                                  i_v, i_bh, i_c, c0, c1, i_n, r0, o_r, m_r, T, H, G, K, V, NT,
                                  NSEQ, scale, eps, BQ, BD, BO, HAS_DECAY, HAS_IGATE, HAS_MAX,
                                  NORM, DOT_PREC, HAS_SKIP, True, ONE_TILE, PER_HEAD)  # fmt: skip
    else:
        i_cq, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        i_c, c0, c1, i_n, r0, o_r, m_r = _chunk_rows(chunks, i_cq, NQ, L, T, BQ, VARLEN)
        if r0 >= c1:
            return
        _out_tile(q, k, v, h, hn, mc, g, gi, rmax, o, den, m_row, skip, bad, _program_slot(), i_v,
                  i_bh, i_c, c0, c1, i_n, r0, o_r, m_r, T, H, G, K, V, NT, NSEQ, scale, eps, BQ,
                  BD, BO, HAS_DECAY, HAS_IGATE, HAS_MAX, NORM, DOT_PREC, HAS_SKIP,
                  False, ONE_TILE, PER_HEAD)  # fmt: skip


@triton.jit
def _row_factor(b_br, m_c, b_mr, HAS_MAX: tl.constexpr):
    """e_r = exp(b_r + m_c − m_r), the inter-chunk part's row factor (exp(b_r) without the max
    state)."""
    if HAS_MAX:
        return tl.exp(b_br + m_c - b_mr)
    else:
        return tl.exp(b_br)


@triton.jit
def _out_tile(q, k, v, h, hn, mc, g, gi, rmax, o, den, m_row, skip, bad, slot, i_v, i_bh, i_c,
              c0, c1, i_n, r0, o_r, m_r, T, H, G, K, V, NT, NSEQ, scale, eps,
              BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr, HAS_DECAY: tl.constexpr,
              HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr, NORM: tl.constexpr,
              DOT_PREC: tl.constexpr, HAS_SKIP: tl.constexpr, FIX: tl.constexpr,
              ONE_TILE: tl.constexpr, PER_HEAD: tl.constexpr):  # fmt: skip
    """One tile of :func:`out_fwd_kernel` (query rows o_r of chunk i_c, V tile i_v, row i_bh
    of the gates): plain diagonal product and its flag stored at bad[slot], or (``FIX``) the
    causal product."""
    i_b, i_h = i_bh // H, i_bh % H
    o_v = i_v * BO + tl.arange(0, BO)
    m_v = o_v < V
    HK = H // G  # q/k heads: value head i_h reads q/k head i_h // G
    p_q = q + (i_b * T * HK + i_h // G) * K
    p_k = k + (i_b * T * HK + i_h // G) * K
    p_v = v + (i_b * T * H + i_h) * V
    if HAS_DECAY:
        if PER_HEAD:  # the head's constant log decay, loaded once (the rows are formed)
            g = tl.load(g + i_h).to(tl.float32)
        else:
            g += i_bh * T
    if HAS_IGATE:
        gi += i_bh * T
    if NORM != NORM_NONE:
        hn += (i_bh * NT + i_c) * K

    b_br = _cum(g, o_r, m_r, c0, PER_HEAD) if HAS_DECAY else tl.zeros([BQ], dtype=tl.float32)
    b_mr = tl.zeros([BQ], dtype=tl.float32)
    m_c = 0.0
    if HAS_MAX:
        m_c = tl.load(mc + i_bh * (NT + NSEQ) + i_c + i_n)
        # the exact max(b_r + m_c, max_{c0≤s≤r} (b_r + (a_s − b_s))): fp32 addition is monotone
        b_mr = tl.where(m_r, b_br + tl.maximum(m_c, _vec(rmax + i_bh * T, o_r, m_r)), 0.0)
    if not ONE_TILE:
        e_r = _row_factor(b_br, m_c, b_mr, HAS_MAX)

    p_h = h + (i_bh * NT + i_c) * K * V
    DEN: tl.constexpr = NORM != NORM_NONE
    if ONE_TILE:
        b_acc, b_den, b_pz, b_psum = _rows_one(
            p_q, p_k, p_h, hn, gi, b_br, b_mr, o_r, m_r, o_v, m_v, K, HK * K, V, 1, BQ, BD, BO,
            v.dtype.element_ty, HAS_DECAY, HAS_IGATE, HAS_MAX, DEN, DOT_PREC, FIX,
        )  # fmt: skip
        # the row factor once the scores and the inter-chunk product are formed: formed before
        # them it was live beside them (with the max state at 64 × 64: 180 → 152 registers,
        # 2 → 3 programs per SM; docs/tuning.md)
        e_r = _row_factor(b_br, m_c, b_mr, HAS_MAX)
        b_acc *= e_r[:, None]
        b_den *= e_r
        b_acc, b_den = _rows_one_end(b_acc, b_den, b_pz, b_psum, p_v, o_r, m_r, o_v, m_v, H * V,
                                     DEN, DOT_PREC, FIX)  # fmt: skip
    else:
        b_acc, b_p, b_den = _rows_inter(p_q, p_k, p_h, hn, o_r, m_r, o_v, m_v, K, HK * K, V, 1,
                                        BQ, BD, BO, DEN, DOT_PREC)  # fmt: skip
        b_acc *= e_r[:, None]
        b_den *= e_r
        b_acc, b_den = _rows_intra(b_acc, b_den, b_p, p_q, p_k, p_v, g, gi, b_br, b_mr, None,
                                   None, o_r, m_r, r0, c0, c1, o_v, m_v, K, HK * K, H * V, BQ, BD,
                                   HAS_DECAY, HAS_IGATE, HAS_MAX, DEN, False, DOT_PREC,
                                   FIX, PER_HEAD)  # fmt: skip
    if not FIX:
        tl.store(bad + slot, _not_finite(b_acc).to(tl.int8))
    b_acc *= scale

    p_o = o + (i_b * T * H + i_h) * V + o_r.to(tl.int64)[:, None] * H * V + o_v[None, :]
    first = m_r & ((o_r * 0 + i_v) == 0)  # the per-row values, from the first V tile
    if NORM != NORM_NONE:
        b_den *= scale
        b_acc = b_acc * _inv_denominator(b_den, b_mr, eps, NORM)[0][:, None]
        tl.store(den + i_bh * T + o_r, b_den, mask=first)
    if HAS_MAX:
        tl.store(m_row + i_bh * T + o_r, b_mr, mask=first)
    if HAS_SKIP:  # one fma, not a mul and an add: which of the two products the compiler fused
        # into the add differed between the two launches (1 ulp, but no longer bitwise causal)
        b_acc = tl.fma(tl.load(skip + i_h), _tile(p_v, o_r, o_v, H * V, m_r, m_v).to(tl.float32),
                       b_acc)  # fmt: skip
    tl.store(p_o, b_acc.to(o.dtype.element_ty), mask=m_r[:, None] & m_v[None, :])


@triton.jit(do_not_specialize=["T", "NT", "NQ", "NSEQ"])
def dq_bwd_kernel(
    do, v, k, q, h, hn, mc, g, gi, m_row, ra, rd, dq, qdq, chunks,
    T, H, G, K: tl.constexpr, V: tl.constexpr, L, NT, NQ, NSEQ, scale,
    BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
    HAS_NORM: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
    STORE_QDQ: tl.constexpr, HPP: tl.constexpr = 1, PER_HEAD: tl.constexpr = False,
):  # fmt: skip
    """Grid (chunks × query tiles, K tiles, B·H / HPP): dq_r = scale·[e_r (A_r do_r C_cᵀ +
    dd_r n_c) + Σ_{s≤r} D_rs (A_r do_r·v_s + dd_r) k_s] of one query tile; ``HAS_NORM``:
    A = ra, dd = rd (:func:`norm_bwd_kernel`), else A = 1, dd = 0. ``STORE_QDQ`` (the log
    decay wants its gradient): also this K tile's part of q·dq per value head, qdq [K tiles,
    B·H, T] fp32.

    A program sums the dq of ``HPP`` consecutive value heads of one group (HPP divides G) and
    stores it in its slot of dq [B, T, H / HPP, K]: HPP = 1 per value head, HPP = G the
    group's whole sum per q/k head (no per-head copy in memory)."""
    i_cq, i_k, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    NP = H // HPP  # dq slots per batch row
    i_b, i_s = i_p // NP, i_p % NP
    i_c, c0, c1, i_n, r0, o_r, m_r = _chunk_rows(chunks, i_cq, NQ, L, T, BQ, VARLEN)
    if r0 >= c1:
        return
    o_k = i_k * BO + tl.arange(0, BO)
    m_k = o_k < K
    HK = H // G  # q/k heads: value head i_h reads q/k head i_h // G
    i_h0 = i_s * HPP  # the program's first value head
    qk = (i_b * T * HK + i_h0 // G) * K
    rows = tl.num_programs(2) * HPP  # B·H
    b_dq = tl.zeros([BQ, BO], dtype=tl.float32)
    for j in tl.static_range(HPP):  # (unrolled: one head for every family but grouped Mamba2)
        b_dq += _dq_head(
            i_h0 + j, do, v, k + qk, q + qk, h, hn, mc, g, gi, m_row, ra, rd, qdq, i_b, i_k,
            rows, i_c, i_n, c0, c1, r0, o_r, m_r, o_k, m_k, T, H, HK, K, V, NT, NSEQ, scale,
            BQ, BD, BO, HAS_DECAY, HAS_IGATE, HAS_MAX, HAS_NORM, DOT_PREC, STORE_QDQ, PER_HEAD,
        )  # fmt: skip
    p_dq = dq + (i_b * T * NP + i_s) * K + o_r.to(tl.int64)[:, None] * NP * K + o_k[None, :]
    tl.store(p_dq, b_dq.to(dq.dtype.element_ty), mask=m_r[:, None] & m_k[None, :])


@triton.jit
def _dq_head(i_h, do, v, p_k, p_q, h, hn, mc, g, gi, m_row, ra, rd, qdq, i_b, i_k, rows, i_c,
             i_n, c0, c1, r0, o_r, m_r, o_k, m_k, T, H, HK, K: tl.constexpr, V: tl.constexpr,
             NT, NSEQ, scale, BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
             HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
             HAS_NORM: tl.constexpr, DOT_PREC: tl.constexpr, STORE_QDQ: tl.constexpr,
             PER_HEAD: tl.constexpr):  # fmt: skip
    """dq [BQ, BO] fp32 of value head i_h on the rows o_r (:func:`dq_bwd_kernel`; p_k, p_q at
    its q/k head), storing its q·dq part (``STORE_QDQ``)."""
    i_bh = i_b * H + i_h
    p_do = do + (i_b * T * H + i_h) * V
    p_v = v + (i_b * T * H + i_h) * V
    if HAS_DECAY:
        if PER_HEAD:  # the head's constant log decay, loaded once (the rows are formed)
            g = tl.load(g + i_h).to(tl.float32)
        else:
            g += i_bh * T
    if HAS_IGATE:
        gi += i_bh * T

    b_br = _cum(g, o_r, m_r, c0, PER_HEAD) if HAS_DECAY else tl.zeros([BQ], dtype=tl.float32)
    b_mr = tl.zeros([BQ], dtype=tl.float32)
    if HAS_MAX:
        m_c = tl.load(mc + i_bh * (NT + NSEQ) + i_c + i_n)
        b_mr = _vec(m_row + i_bh * T, o_r, m_r)
        e_r = tl.exp(b_br + m_c - b_mr)
    else:
        e_r = tl.exp(b_br)
    b_A = None
    b_dd = None
    if HAS_NORM:
        b_A = _vec(ra + i_bh * T, o_r, m_r)
        b_dd = _vec(rd + i_bh * T, o_r, m_r)

    p_h = h + (i_bh * NT + i_c) * K * V
    b_acc, b_p, b_den = _rows_inter(p_do, p_v, p_h, None, o_r, m_r, o_k, m_k, V, H * V, 1, V, BQ,
                                    BD, BO, False, DOT_PREC)  # fmt: skip
    if HAS_NORM:
        b_no = _vec(hn + (i_bh * NT + i_c) * K, o_k, m_k)  # [BO]
        b_acc = b_acc * b_A[:, None] + b_dd[:, None] * b_no[None, :]
    b_acc *= e_r[:, None]
    # (b_den: zeros, unused; a jit helper may not return a None it was given)
    b_acc, b_den = _rows_intra(b_acc, b_den, b_p, p_do, p_v, p_k, g, gi, b_br, b_mr, b_A, b_dd,
                               o_r, m_r, r0, c0, c1, o_k, m_k, V, H * V, HK * K, BQ, BD, HAS_DECAY,
                               HAS_IGATE, HAS_MAX, False, HAS_NORM, DOT_PREC, False,
                               PER_HEAD)  # fmt: skip
    b_acc *= scale
    if STORE_QDQ:  # q·dq over this K tile, for the log-decay gradient
        b_q = _tile(p_q, o_r, o_k, HK * K, m_r, m_k)
        part = tl.sum(b_q.to(tl.float32) * b_acc, 1)
        tl.store(qdq + (i_k * rows + i_bh) * T + o_r, part, mask=m_r)
    return b_acc


@triton.jit
def _cols(p_x, p_y, p_z, p_ds, p_dn, g, gi, mc, m_row, ra, rd, o_s, m_s, s0, c0, c1, o_o, m_o,
          D, s_x, s_z, s_sd, s_so, scale, BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
          HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
          HAS_NORM: tl.constexpr, ADD_DN: tl.constexpr, SHIFT: tl.constexpr,
          DOT_PREC: tl.constexpr, ONE_TILE: tl.constexpr, PER_HEAD: tl.constexpr):  # fmt: skip
    """The columns s of one key tile of dk or dv (pointers at this row, chunk):

        out_s = w_s (x_s dS_c+1 + [ADD_DN] dn_c+1) + scale·Σ_{r≥s} D_rs M_sr z_r,
        M_sr = A_r (x_s·y_r) + [SHIFT] dd_r,   w_s = exp(b_L − b_s + a_s − m_c+1)

    dS_c+1 at p_ds with element strides (s_sd, s_so), dn_c+1 at p_dn; mc at this chunk's max
    state (m_c+1 at mc + 1), g, gi, m_row, ra, rd at this row. A = ra with ``HAS_NORM``, else 1.
    Row strides: s_x of x and y, s_z of z. Returns out [BS, BO] fp32.

    ``ONE_TILE`` (the chunk is one key tile, L ≤ BS; D constexpr): the diagonal query tile is
    the only one, and the intra-chunk part is formed before the inter-chunk product instead of
    beside it, so their two accumulators are never live together (x is loaded twice): the
    same products and sums, in fewer registers."""
    b_bs = _cum(g, o_s, m_s, c0, PER_HEAD) if HAS_DECAY else tl.zeros([BS], dtype=tl.float32)
    b_as = _vec(gi, o_s, m_s) if HAS_IGATE else tl.zeros([BS], dtype=tl.float32)
    lw = b_as - b_bs
    if HAS_DECAY:
        lw += _cum_last(g, c0, c1, PER_HEAD)
    if HAS_MAX:
        lw -= tl.load(mc + 1)
    w_s = tl.exp(tl.where(m_s, lw, float("-inf")))  # [BS], ≤ 1

    if ONE_TILE:
        b_mt = tl.zeros([BS, BS], dtype=tl.float32)
        for d0 in tl.static_range(0, D, BD):
            o_d = d0 + tl.arange(0, BD)
            m_d = o_d < D
            b_x = _tile(p_x, o_s, o_d, s_x, m_s, m_d)  # [BS, BD]
            b_mt += tl.dot(b_x, _tile_t(p_y, o_s, o_d, s_x, m_s, m_d), input_precision=DOT_PREC)
        b_acc = _cols_tile(b_mt, p_z, g, m_row, ra, rd, o_s, m_s, o_s, b_bs, b_as, o_o, m_o,
                           s_z, c0, BS, HAS_DECAY, HAS_IGATE, HAS_MAX, HAS_NORM, SHIFT,
                           DOT_PREC, PER_HEAD)  # fmt: skip
        b_int = tl.zeros([BS, BO], dtype=tl.float32)
        for d0 in tl.static_range(0, D, BD):
            o_d = d0 + tl.arange(0, BD)
            m_d = o_d < D
            b_x = _tile(p_x, o_s, o_d, s_x, m_s, m_d)  # [BS, BD]
            b_st = _state_tile(p_ds, o_d, o_o, s_sd, s_so, m_d, m_o)  # [BD, BO]
            b_int += tl.dot(b_x, b_st.to(b_x.dtype), input_precision=DOT_PREC)
        if ADD_DN:
            b_int += _vec(p_dn, o_o, m_o)[None, :]
        return b_acc * scale + b_int * w_s[:, None]

    # One pass over depth: the inter-chunk product x_s·dS_c+1 and the diagonal query tile's
    # x_s·y_r share each load of x (the query tile r = s0 is the key tile itself).
    b_int = tl.zeros([BS, BO], dtype=tl.float32)
    b_mt = tl.zeros([BS, BS], dtype=tl.float32)
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_s, o_d, s_x, m_s, m_d)  # [BS, BD]
        b_st = _state_tile(p_ds, o_d, o_o, s_sd, s_so, m_d, m_o)  # [BD, BO]
        b_int += tl.dot(b_x, b_st.to(b_x.dtype), input_precision=DOT_PREC)
        b_mt += tl.dot(b_x, _tile_t(p_y, o_s, o_d, s_x, m_s, m_d), input_precision=DOT_PREC)
    if ADD_DN:
        b_int += _vec(p_dn, o_o, m_o)[None, :]

    b_acc = tl.zeros([BS, BO], dtype=tl.float32)
    for r0 in range(s0, c1, BS):
        o_r = r0 + tl.arange(0, BS)
        m_r = o_r < c1
        if r0 > s0:  # a full query tile after the diagonal
            b_mt = tl.zeros([BS, BS], dtype=tl.float32)
            for d0 in range(0, D, BD):
                o_d = d0 + tl.arange(0, BD)
                m_d = o_d < D
                b_x = _tile(p_x, o_s, o_d, s_x, m_s, m_d)  # [BS, BD]
                b_yt = _tile_t(p_y, o_r, o_d, s_x, m_r, m_d)  # [BD, BS]
                b_mt += tl.dot(b_x, b_yt, input_precision=DOT_PREC)
        b_acc += _cols_tile(b_mt, p_z, g, m_row, ra, rd, o_r, m_r, o_s, b_bs, b_as, o_o, m_o,
                            s_z, c0, BS, HAS_DECAY, HAS_IGATE, HAS_MAX, HAS_NORM, SHIFT,
                            DOT_PREC, PER_HEAD)  # fmt: skip
    return b_acc * scale + b_int * w_s[:, None]


@triton.jit
def _cols_tile(b_mt, p_z, g, m_row, ra, rd, o_r, m_r, o_s, b_bs, b_as, o_o, m_o, s_z, c0,
               BS: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr,
               HAS_MAX: tl.constexpr, HAS_NORM: tl.constexpr, SHIFT: tl.constexpr,
               DOT_PREC: tl.constexpr, PER_HEAD: tl.constexpr):  # fmt: skip
    """Σ_{r in tile} D_rs M_sr z_r [BS, BO] of one query tile r of :func:`_cols` from its
    products b_mt = x_s·y_r [BS (s), BS (r)]."""
    if HAS_NORM:
        b_mt *= _vec(ra, o_r, m_r)[None, :]
        if SHIFT:
            b_mt += _vec(rd, o_r, m_r)[None, :]
    b_br = _cum(g, o_r, m_r, c0, PER_HEAD) if HAS_DECAY else tl.zeros([BS], dtype=tl.float32)
    b_mr = _vec(m_row, o_r, m_r) if HAS_MAX else tl.zeros([BS], dtype=tl.float32)
    causal = (o_r[:, None] >= o_s[None, :]) & m_r[:, None]  # [BS (r), BS (s)]
    b_d = _log_weights(b_br, b_bs, b_as, b_mr, causal, HAS_DECAY, HAS_IGATE, HAS_MAX)
    b_mt *= tl.trans(b_d)
    b_z = _tile(p_z, o_r, o_o, s_z, m_r, m_o)  # [BS, BO]
    return tl.dot(b_mt.to(b_z.dtype), b_z, input_precision=DOT_PREC)


@triton.jit(do_not_specialize=["T", "NT", "NS", "NSEQ"])
def dk_bwd_kernel(
    v, do, q, k, dh, dhn, mc, g, gi, m_row, ra, rd, dk, kdk, chunks,
    T, H, G, K: tl.constexpr, V: tl.constexpr, L, NT, NS, NSEQ, scale,
    BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr, HAS_N: tl.constexpr,
    HAS_NORM: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
    STORE_KDK: tl.constexpr, HPP: tl.constexpr = 1, PER_HEAD: tl.constexpr = False,
):  # fmt: skip
    """Grid (chunks × key tiles, K tiles, B·H / HPP): dk_s = w_s (v_s dC_c+1ᵀ + dn_c+1) +
    scale·Σ_{r≥s} D_rs (A_r v_s·do_r + dd_r) q_r of one key tile (:func:`_cols`), from the
    state gradients dh, dhn. ``STORE_KDK`` (the gates want their gradients): also this K
    tile's part of k·dk per value head, kdk [K tiles, B·H, T] fp32. ``HPP``:
    value heads summed per program, as in :func:`dq_bwd_kernel` (dk [B, T, H / HPP, K])."""
    i_cs, i_k, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    NP = H // HPP  # dk slots per batch row
    i_b, i_s = i_p // NP, i_p % NP
    i_c, c0, c1, i_n, s0, o_s, m_s = _chunk_rows(chunks, i_cs, NS, L, T, BS, VARLEN)
    if s0 >= c1:
        return
    o_k = i_k * BO + tl.arange(0, BO)
    m_k = o_k < K
    HK = H // G  # q/k heads: value head i_h reads q/k head i_h // G
    i_h0 = i_s * HPP  # the program's first value head
    qk = (i_b * T * HK + i_h0 // G) * K
    rows = tl.num_programs(2) * HPP  # B·H
    b_dk = tl.zeros([BS, BO], dtype=tl.float32)
    for j in tl.static_range(HPP):  # (unrolled: one head for every family but grouped Mamba2)
        b_dk += _dk_head(
            i_h0 + j, v, do, q + qk, k + qk, dh, dhn, mc, g, gi, m_row, ra, rd, kdk, i_b, i_k,
            rows, i_c, i_n, s0, c0, c1, o_s, m_s, o_k, m_k, T, H, HK, K, V, NT, NSEQ, scale, BS,
            BD, BO, HAS_DECAY, HAS_IGATE, HAS_MAX, HAS_N, HAS_NORM, DOT_PREC, STORE_KDK,
            PER_HEAD,
        )  # fmt: skip
    p_dk = dk + (i_b * T * NP + i_s) * K + o_s.to(tl.int64)[:, None] * NP * K + o_k[None, :]
    tl.store(p_dk, b_dk.to(dk.dtype.element_ty), mask=m_s[:, None] & m_k[None, :])


@triton.jit
def _dk_head(i_h, v, do, p_q, p_k, dh, dhn, mc, g, gi, m_row, ra, rd, kdk, i_b, i_k, rows, i_c,
             i_n, s0, c0, c1, o_s, m_s, o_k, m_k, T, H, HK, K: tl.constexpr, V: tl.constexpr, NT,
             NSEQ, scale, BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
             HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
             HAS_N: tl.constexpr, HAS_NORM: tl.constexpr, DOT_PREC: tl.constexpr,
             STORE_KDK: tl.constexpr, PER_HEAD: tl.constexpr):  # fmt: skip
    """dk [BS, BO] fp32 of value head i_h on the key rows o_s (:func:`dk_bwd_kernel`; p_q, p_k
    at its q/k head), storing its k·dk part (``STORE_KDK``)."""
    i_bh = i_b * H + i_h
    if HAS_DECAY:
        if PER_HEAD:  # the head's constant log decay, loaded once (the rows are formed)
            g = tl.load(g + i_h).to(tl.float32)
        else:
            g += i_bh * T
    if HAS_IGATE:
        gi += i_bh * T
    if HAS_MAX:
        mc += i_bh * (NT + NSEQ) + i_c + i_n
        m_row += i_bh * T
    if HAS_NORM:
        ra += i_bh * T
        rd += i_bh * T
    if HAS_N:
        dhn += (i_bh * NT + i_c) * K
    b_dk = _cols(
        v + (i_b * T * H + i_h) * V, do + (i_b * T * H + i_h) * V, p_q,
        dh + (i_bh * NT + i_c) * K * V, dhn, g, gi, mc, m_row, ra, rd, o_s, m_s, s0, c0, c1,
        o_k, m_k, V, H * V, HK * K, 1, V, scale, BS, BD, BO, HAS_DECAY, HAS_IGATE, HAS_MAX,
        HAS_NORM, HAS_N, HAS_NORM, DOT_PREC, False, PER_HEAD,
    )  # fmt: skip
    if STORE_KDK:  # k·dk over this K tile, for the gate gradients
        b_k = _tile(p_k, o_s, o_k, HK * K, m_s, m_k)
        part = tl.sum(b_k.to(tl.float32) * b_dk, 1)
        tl.store(kdk + (i_k * rows + i_bh) * T + o_s, part, mask=m_s)
    return b_dk


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def dqk_bwd_kernel(
    do, v, k, q, h, hn, dh, dhn, mc, g, gi, m_row, ra, rd, dq, dk, qdq, kdk, chunks,
    T, H, G, K: tl.constexpr, V: tl.constexpr, L, NT, NSEQ, scale,
    BQ: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr, HAS_N: tl.constexpr,
    HAS_NORM: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
    STORE_QDQ: tl.constexpr, STORE_KDK: tl.constexpr, PER_HEAD: tl.constexpr = False,
):  # fmt: skip
    """Grid (chunks, K tiles, B·H), for chunks of one time tile (L ≤ BQ): dq and dk of one
    chunk (:func:`dq_bwd_kernel`, :func:`dk_bwd_kernel`, one value head a program). Their
    intra-chunk parts are one weighted matrix and its transpose,

        W_rs = D_rs (A_r do_r·v_s + dd_r),   dq_r ∋ scale·Σ_s W_rs k_s,   dk_s ∋ scale·Σ_r W_rs q_r,

    and one pass over V reads each tile of do and v once for three products: the scores
    do·vᵀ of W, dq's inter-chunk product do C_cᵀ and dk's v dC_c+1ᵀ. W is formed once and kept
    as 16-bit operands (the form both kernels cast it to); dq is stored with q·dq
    (``STORE_QDQ``), then dk with k·dk (``STORE_KDK``), per value head, ``[B, T, H, K]`` (the
    caller sums a group's heads). The products and sums of the two kernels' single-tile paths;
    at 64 × 64 heads on an H200 it takes 1.33 ms where dq and dk took 1.38 (linear attention),
    1.59 for 1.97 (mLSTM sigmoid) and 1.64 for 2.64 (mLSTM exp; docs/tuning.md)."""
    i_c, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_c, c0, c1, i_n, r0, o_r, m_r = _chunk_rows(chunks, i_c, 1, L, T, BQ, VARLEN)
    if r0 >= c1:
        return
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BO + tl.arange(0, BO)
    m_k = o_k < K
    HK = H // G  # q/k heads: value head i_h reads q/k head i_h // G
    qk = (i_b * T * HK + i_h // G) * K
    p_q, p_k = q + qk, k + qk
    p_do = do + (i_b * T * H + i_h) * V
    p_v = v + (i_b * T * H + i_h) * V
    if HAS_DECAY:
        if PER_HEAD:  # the head's constant log decay, loaded once (the rows are formed)
            g = tl.load(g + i_h).to(tl.float32)
        else:
            g += i_bh * T
    if HAS_IGATE:
        gi += i_bh * T
    if HAS_MAX:
        mc += i_bh * (NT + NSEQ) + i_c + i_n
        m_row += i_bh * T
    if HAS_NORM:
        ra += i_bh * T
        rd += i_bh * T

    b_br = _cum(g, o_r, m_r, c0, PER_HEAD) if HAS_DECAY else tl.zeros([BQ], dtype=tl.float32)
    b_mr = _vec(m_row, o_r, m_r) if HAS_MAX else tl.zeros([BQ], dtype=tl.float32)
    b_A = _vec(ra, o_r, m_r) if HAS_NORM else None
    b_dd = _vec(rd, o_r, m_r) if HAS_NORM else None
    b_p = tl.zeros([BQ, BQ], dtype=tl.float32)
    b_dq = tl.zeros([BQ, BO], dtype=tl.float32)
    b_int = tl.zeros([BQ, BO], dtype=tl.float32)
    p_h = h + (i_bh * NT + i_c) * K * V
    p_dh = dh + (i_bh * NT + i_c) * K * V
    for d0 in tl.static_range(0, V, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < V
        b_x = _tile(p_do, o_r, o_d, H * V, m_r, m_d)  # [BQ, BD]
        b_vt = _tile_t(p_v, o_r, o_d, H * V, m_r, m_d)  # [BD, BQ]
        b_p += tl.dot(b_x, b_vt, input_precision=DOT_PREC)
        b_s = _state_tile(p_h, o_d, o_k, 1, V, m_d, m_k)
        b_dq += tl.dot(b_x, b_s.to(b_x.dtype), input_precision=DOT_PREC)
        b_s = _state_tile(p_dh, o_d, o_k, 1, V, m_d, m_k)
        b_int += tl.dot(tl.trans(b_vt), b_s.to(b_x.dtype), input_precision=DOT_PREC)
    b_w, _ = _diag_weighted(b_p, gi, b_br, b_mr, b_A, b_dd, o_r, m_r, BQ, HAS_DECAY, HAS_IGATE,
                            HAS_MAX, HAS_NORM, False)  # fmt: skip
    b_wz = b_w.to(k.dtype.element_ty)

    # dq_r = scale·[e_r (A_r do_r C_cᵀ + dd_r n_c) + Σ_s W_rs k_s]
    b_acc = b_dq
    if HAS_NORM:
        b_no = _vec(hn + (i_bh * NT + i_c) * K, o_k, m_k)  # [BO]
        b_acc = b_acc * b_A[:, None] + b_dd[:, None] * b_no[None, :]
    if HAS_MAX:
        b_acc *= tl.exp(b_br + tl.load(mc) - b_mr)[:, None]
    else:
        b_acc *= tl.exp(b_br)[:, None]
    b_acc += tl.dot(b_wz, _tile(p_k, o_r, o_k, HK * K, m_r, m_k), input_precision=DOT_PREC)
    b_acc *= scale
    rows = tl.num_programs(2)  # B·H
    if STORE_QDQ:  # q·dq over this K tile, for the log-decay gradient
        b_q = _tile(p_q, o_r, o_k, HK * K, m_r, m_k)
        tl.store(qdq + (i_k * rows + i_bh) * T + o_r, tl.sum(b_q.to(tl.float32) * b_acc, 1),
                 mask=m_r)  # fmt: skip
    p_out = (i_b * T * H + i_h) * K + o_r.to(tl.int64)[:, None] * H * K + o_k[None, :]
    tl.store(dq + p_out, b_acc.to(dq.dtype.element_ty), mask=m_r[:, None] & m_k[None, :])

    # dk_s = w_s (v_s dC_c+1ᵀ + dn_c+1) + scale·Σ_r W_rs q_r
    lw = (_vec(gi, o_r, m_r) if HAS_IGATE else tl.zeros([BQ], dtype=tl.float32)) - b_br
    if HAS_DECAY:
        lw += _cum_last(g, c0, c1, PER_HEAD)
    if HAS_MAX:
        lw -= tl.load(mc + 1)
    w_s = tl.exp(tl.where(m_r, lw, float("-inf")))  # [BQ], ≤ 1
    b_acc = b_int
    if HAS_N:
        b_acc += _vec(dhn + (i_bh * NT + i_c) * K, o_k, m_k)[None, :]
    b_q = _tile(p_q, o_r, o_k, HK * K, m_r, m_k)
    b_acc = tl.dot(tl.trans(b_wz), b_q, input_precision=DOT_PREC) * scale + b_acc * w_s[:, None]
    if STORE_KDK:  # k·dk over this K tile, for the gate gradients
        b_kk = _tile(p_k, o_r, o_k, HK * K, m_r, m_k)
        tl.store(kdk + (i_k * rows + i_bh) * T + o_r, tl.sum(b_kk.to(tl.float32) * b_acc, 1),
                 mask=m_r)  # fmt: skip
    tl.store(dk + p_out, b_acc.to(dk.dtype.element_ty), mask=m_r[:, None] & m_k[None, :])


@triton.jit(do_not_specialize=["T", "NT", "NS", "NSEQ"])
def dv_bwd_kernel(
    k, q, do, dh, mc, g, gi, m_row, ra, dv, chunks,
    T, H, G, K: tl.constexpr, V: tl.constexpr, L, NT, NS, NSEQ, scale,
    BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
    HAS_NORM: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
    v=None, skip=None, dskip=None, HAS_SKIP: tl.constexpr = False,
    ONE_TILE: tl.constexpr = False, PER_HEAD: tl.constexpr = False,
):  # fmt: skip
    """Grid (chunks × key tiles, V tiles, B·H): dv_s = w_s k_s dC_c+1 + scale·Σ_{r≥s} D_rs A_r
    (k_s·q_r) do_r of one key tile (:func:`_cols`), from the state gradients dh.

    ``HAS_SKIP`` (the output's skip term skip[h]·v_r, :func:`out_fwd_kernel`): plus
    skip[h]·do_s, and this tile's Σ do_s·v_s stored at dskip [B·H, chunks × key tiles, V
    tiles] fp32 (zeros where a tile is empty), whose sum over a head is ∂L/∂skip[h]."""
    i_cs, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    i_c, c0, c1, i_n, s0, o_s, m_s = _chunk_rows(chunks, i_cs, NS, L, T, BS, VARLEN)
    if s0 >= c1:
        return
    o_v = i_v * BO + tl.arange(0, BO)
    m_v = o_v < V
    if HAS_DECAY:
        if PER_HEAD:  # the head's constant log decay, loaded once (the rows are formed)
            g = tl.load(g + i_h).to(tl.float32)
        else:
            g += i_bh * T
    if HAS_IGATE:
        gi += i_bh * T
    if HAS_MAX:
        mc += i_bh * (NT + NSEQ) + i_c + i_n
        m_row += i_bh * T
    if HAS_NORM:
        ra += i_bh * T
    HK = H // G  # q/k heads: value head i_h reads q/k head i_h // G
    qk = (i_b * T * HK + i_h // G) * K
    b_dv = _cols(
        k + qk, q + qk, do + (i_b * T * H + i_h) * V, dh + (i_bh * NT + i_c) * K * V, None, g, gi,
        mc, m_row, ra, None, o_s, m_s, s0, c0, c1, o_v, m_v, K, HK * K, H * V, V, 1, scale, BS,
        BD, BO, HAS_DECAY, HAS_IGATE, HAS_MAX, HAS_NORM, False, False, DOT_PREC, ONE_TILE,
        PER_HEAD,
    )  # fmt: skip
    if HAS_SKIP:
        vo = (i_b * T * H + i_h) * V
        b_do = _tile(do + vo, o_s, o_v, H * V, m_s, m_v).to(tl.float32)
        b_dv = tl.fma(tl.load(skip + i_h), b_do, b_dv)  # one fma: the group dv kernel's bits
        b_x = _tile(v + vo, o_s, o_v, H * V, m_s, m_v).to(tl.float32)
        b_dskip = tl.sum(tl.sum(b_do * b_x, 1), 0)
        tiles = tl.num_programs(0) * tl.num_programs(1)
        tl.store(dskip + i_bh * tiles + i_cs * tl.num_programs(1) + i_v, b_dskip)
    p_dv = dv + (i_b * T * H + i_h) * V + o_s.to(tl.int64)[:, None] * H * V + o_v[None, :]
    tl.store(p_dv, b_dv.to(dv.dtype.element_ty), mask=m_s[:, None] & m_v[None, :])
