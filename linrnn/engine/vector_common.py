"""The shared @triton.jit helpers of the vector-gate kernels (GLA's gk/gv, RWKV6's w with the
bonus u): vector_kernels, vector_scores_kernels, vector_cumsum_kernels and the fused chunk
kernels (fused_kernels) build on them.

A per-channel decay sits inside the products. With G the chunk-local cumulative log decay of
one channel (G^X on the query side: inclusive, or exclusive for RWKV6; G^K on the key side)
the intra-chunk weight of a pair (r ≥ s) is exp(G^X_r − G^K_s) per channel, so neither a plain
matmul nor a factorization exp(G^X_r)·exp(−G^K_s) works (the second factor is unbounded). GLA's
secondary chunking:

* sub-chunk pairs (a query tile r ∈ [r0, r0+BQ) against key tiles s < r0) are tensor-core
  ``tl.dot`` s against the reference point z = G^K_{r0−1}: (x_r·exp(G^X_r − z))·(y_s·exp(z −
  G^K_s))ᵀ, both factors ≤ 1 because the cumulative decay is non-increasing;
* the diagonal sub-chunk (BQ = 16 positions) is computed in fp32 log space, exp taken only
  of masked differences ≤ 0: on the GPU as a walk over its 16 key rows, each a [16, BD]
  product; under the Triton interpreter, where that walk is ~8x slower, as one [16, 16, BD]
  block (the interpreter's fallback, the same exponentials);
* or (``SPAN`` > 0), per depth or output tile, when the tile's gates span less than ``SPAN``
  (the widest channel's range over every G^X and G^K value of the 16 rows), as one more
  tensor-core product around the reference point z in the middle of that range: every
  factor exp(G^X_i − z), exp(z − G^K_j) then lies within exp(±SPAN/2), bounded whatever the
  rows' order. The operands stay fp32 (tf32 products for bf16 inputs, :func:`_dot32`):
  fp16 could neither hold a factor of e^30 nor keep one of e^−30 that a large partner
  compensates. The causal pairs equal the log-space weights up to the operands' tf32
  rounding (finer than the off-diagonal pairs' bf16); the non-causal pairs it also forms are
  finite and masked away. A tile with a wider span (strong decays) takes the log-space form,
  so extreme gates keep its exactness.
* a whole chunk (vector_scores_kernels' fast chunks) the same way when its gates span less than a
  limit over all its rows: the chunk's scores, dq and dk as plain products around the
  chunk's middle (:func:`_chunk_ref`, :func:`_chunk_fast_out`), no sub-chunks at all.

Every kernel's product has the same shape,

    out_i[o] = Σ_j P_ij · Z_j[o] · E^O_ij[o],    P_ij = Σ_d X_i[d] Y_j[d] E^D_ij[d],

with an optional gate on the depth dimension d (E^D) and on the output dimension o (E^O):
forward (q, k, v) gates K (depth) and V (output, gv); dq (dh, v, k) gates V and K; dk / dv walk
the transposed pairs (``REV``). RWKV6's exclusive form uses a strict mask and puts u on the
diagonal (i = j) of whichever dimension carries the decay. Token tensors and gate cumsums are
``[B, T, H, D]`` with row stride H·D, pointers already at (b, h).

Non-finite inputs (garbage in right padding) reach no earlier output row of a diagonal tile
(docs/DESIGN.md §6.1): masks are ``where``s, never products; with ``CLEAN`` (the forward; the
backward has no such guarantee to keep) its products P·Z take Z with non-finite entries zeroed
and set the paired rows to NaN (triton_common._causal_dot, :func:`_out_log`); a non-finite
gate makes a span +inf, so no reference point formed from a later row is used (the log-space
forms keep a gate's NaN in its own and later rows). The off-diagonal products need nothing:
every key there precedes every row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import _causal_dot, _causal_dot_at, _state_tile, _tile, _tile_t


@triton.jit
def _ld_row(ptr, row, cols, row_stride, m_cols):
    """One row ``ptr[row, cols]`` as fp32."""
    return tl.load(ptr + row.to(tl.int64) * row_stride + cols, mask=m_cols, other=0.0).to(
        tl.float32
    )


@triton.jit
def _xp(x, mask):
    """exp(x) where ``mask``, 0 elsewhere: exp never sees a masked-off (possibly large) value."""
    return tl.exp(tl.where(mask, x, float("-inf")))


@triton.jit
def _ld_p(p_p, o_r, o_s, s_p, mask, TRANS: tl.constexpr):
    """Stored ungated scores P[r, s] ([len(o_r), len(o_s)] fp32; ``TRANS``: the transpose,
    [len(o_s), len(o_r)]) where ``mask``, 0 elsewhere. p_p is the store's (b, h) start moved
    back by the chunk's first token, so P[r, s] sits at p_p + r·s_p + s."""
    if TRANS:
        p = p_p + o_r.to(tl.int64)[None, :] * s_p + o_s[:, None]
    else:
        p = p_p + o_r.to(tl.int64)[:, None] * s_p + o_s[None, :]
    return tl.load(p, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _p_col(p_p, o_t, m_t, t0, j, n_t, s_p, REV: tl.constexpr):
    """Column j of a diagonal tile's stored P ([BT] fp32, pairs and diagonal, else 0): P[o_t,
    t0 + j], or (``REV``: P_ij is the stored P[j, i]) the stored row t0 + j. See :func:`_ld_p`."""
    m = _pair_col(o_t, m_t, t0, j, n_t, REV, True)
    if REV:
        p = p_p + (t0 + j).to(tl.int64) * s_p + o_t
    else:
        p = p_p + o_t.to(tl.int64) * s_p + t0 + j
    return tl.load(p, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _pair_gate(p_gx, p_gk, p_u, o_t, m_t, o_c, m_c, s_c, pair, same,
               REV: tl.constexpr, EXCL: tl.constexpr):  # fmt: skip
    """[BT, BT, BC] weights E_ij[c] = exp(G^X_a[c] − G^K_b[c]) on the pairs (a, b) = (i, j)
    (``REV``: (j, i)) of one tile, u[c] on its diagonal (``EXCL``), 0 elsewhere."""
    gx = _tile(p_gx, o_t, o_c, s_c, m_t, m_c)  # [BT, BC] fp32
    gk = _tile(p_gk, o_t, o_c, s_c, m_t, m_c)
    if REV:
        lw = gx[None, :, :] - gk[:, None, :]
    else:
        lw = gx[:, None, :] - gk[None, :, :]
    e = _xp(lw, pair[:, :, None] & m_c[None, None, :])
    if EXCL:
        b_u = tl.load(p_u + o_c, mask=m_c, other=0.0).to(tl.float32)
        e = tl.where(same[:, :, None], b_u[None, None, :], e)
    return e


@triton.jit
def _col(x, ar, j):
    """Column j of a [BT, BT] tile ([BT]; register tiles have no indexing)."""
    return tl.sum(tl.where(ar[None, :] == j, x, 0), 1)


@triton.jit
def _walk_gates(p_gx, p_gk, p_u, o_t, m_t, o_c, m_c, s_c, REV: tl.constexpr,
                EXCL: tl.constexpr):  # fmt: skip
    """For a walk over a tile's key rows: the rows' own gate ([BT, BC]: G^X, ``REV``: G^K)
    and the bonus u ([BC], ``EXCL``; else 0)."""
    if REV:
        g_t = _tile(p_gk, o_t, o_c, s_c, m_t, m_c)
    else:
        g_t = _tile(p_gx, o_t, o_c, s_c, m_t, m_c)
    b_u = tl.sum(tl.zeros_like(g_t), 0)
    if EXCL:
        b_u = tl.load(p_u + o_c, mask=m_c, other=0.0).to(tl.float32)
    return g_t, b_u


@triton.jit
def _pair_col(o_t, m_t, t0, j, n_t, REV: tl.constexpr, SAME: tl.constexpr):
    """Column j of a tile's pair mask ([BT] bool, rows o_t = t0 + i, the first n_t valid):
    the rows after row j (``REV``: before it), and row j itself with ``SAME``. The mask of
    :func:`_vec_diag_scores` read off the positions, not reduced out of the [BT, BT] tile."""
    tj = t0 + j
    if REV:
        hit = o_t < tj
    else:
        hit = o_t > tj
    if SAME:
        hit = hit | (o_t == tj)
    return hit & m_t & (o_t * 0 + j < n_t)


@triton.jit
def _walk_row(p_a, p_gx, p_gk, g_t, b_u, m_t, t0, n_t, j, o_t, o_c, m_c, s_c,
              REV: tl.constexpr, EXCL: tl.constexpr):  # fmt: skip
    """Step j of the walk: row j of ``p_a`` ([BC] fp32, 0 past the tile's n_t valid rows) and
    its gates against every row i, exp(G^X_i − G^K_j) (``REV``: exp(G^X_j − G^K_i)) on the
    pairs, u on the diagonal (``EXCL``), else 0 ([BT, BC])."""
    m_j = m_c & (o_c * 0 + j < n_t)  # a [BC] mask: the interpreter rejects a block & a scalar
    a_j = _ld_row(p_a, t0 + j, o_c, s_c, m_j)
    if REV:
        lw = _ld_row(p_gx, t0 + j, o_c, s_c, m_j)[None, :] - g_t
    else:
        lw = g_t - _ld_row(p_gk, t0 + j, o_c, s_c, m_j)[None, :]
    e = _xp(lw, _pair_col(o_t, m_t, t0, j, n_t, REV, not EXCL)[:, None] & m_c[None, :])
    if EXCL:
        e = tl.where((o_t == t0 + j)[:, None], b_u[None, :], e)
    return a_j, e


@triton.jit
def _depth_step(b_p, b_x, p_y, p_gdx, p_gdk, g_t, b_u, m_t, t0, n_t, j, ar, o_t, o_d, m_d, sD,
                REV: tl.constexpr, EXCL: tl.constexpr):  # fmt: skip
    """One step of the walk over a depth-gated product: column j of P ([BT, BT] fp32)."""
    y_j, e = _walk_row(p_y, p_gdx, p_gdk, g_t, b_u, m_t, t0, n_t, j, o_t, o_d, m_d, sD, REV,
                       EXCL)  # fmt: skip
    return b_p + tl.where(ar[None, :] == j, tl.sum(b_x * y_j[None, :] * e, 1)[:, None], 0.0)


@triton.jit
def _out_step(b_out, b_p, p_y, p_z, p_gox, p_gok, g_t, b_u, m_t, t0, n_t, j, ar, o_t, o_o, m_o,
              sO, sD, REV: tl.constexpr, EXCL: tl.constexpr, P_MEM: tl.constexpr,
              CLEAN: tl.constexpr):  # fmt: skip
    """One step of the walk over an output-gated product: row j of Z, gated, weighted by
    column j of P (loaded with ``P_MEM``, else taken from the [BT, BT] tile b_p); ``CLEAN``:
    Z's non-finite entries zeroed (:func:`_out_log`)."""
    z_j, e = _walk_row(p_z, p_gox, p_gok, g_t, b_u, m_t, t0, n_t, j, o_t, o_o, m_o, sO, REV,
                       EXCL)  # fmt: skip
    if CLEAN:
        z_j = tl.where(tl.abs(z_j) < float("inf"), z_j, 0.0)
    if P_MEM:  # column j of the stored P (diagonal included)
        p_j = _p_col(p_y, o_t, m_t, t0, j, n_t, sD, REV)
    else:
        p_j = _col(b_p, ar, j)
    return b_out + p_j[:, None] * z_j[None, :] * e


@triton.jit
def _dot32(a, b, DOT_PREC: tl.constexpr):
    """The fast forms' product of fp32 operands: tf32 for 16-bit inputs, fp32 for fp32 ones
    (DOT_PREC). The host runs the fast forms for bf16 inputs only (vector._fast_forms says
    why)."""
    return tl.dot(a, b, input_precision=DOT_PREC)


@triton.jit
def _span_ref(p_gx, p_gk, o_t, m_t, o_c, m_c, s_c, CLEAN: tl.constexpr):
    """A diagonal tile's reference point for its channels o_c: z ([BC]), the middle of the range
    of every G^X and G^K value of the tile's valid rows, and the widest channel's range (a
    scalar), so that every G^X_i − z and z − G^K_j lies within ±range/2. Also the two gate
    tiles ([BT, BC] fp32). ``CLEAN`` (the forward): a non-finite gate (garbage at a later step)
    makes the range +inf, since a z from it would reach every row, so the tile takes the
    log-space form, whose masked exponents keep the gate in its own and later rows."""
    m = m_t[:, None] & m_c[None, :]
    gx = _tile(p_gx, o_t, o_c, s_c, m_t, m_c)
    gk = _tile(p_gk, o_t, o_c, s_c, m_t, m_c)
    inf = float("inf")
    if CLEAN:  # a non-finite pair counts as +inf in the top and −inf in the bottom
        fin = (tl.abs(gx) < inf) & (tl.abs(gk) < inf)  # false for NaN
        hi_x, lo_x = tl.where(fin, gx, inf), tl.where(fin, gx, -inf)
        hi_k, lo_k = tl.where(fin, gk, inf), tl.where(fin, gk, -inf)
    else:  # the backward keeps no such guarantee (docs/DESIGN.md §6.1)
        hi_x, lo_x, hi_k, lo_k = gx, gx, gk, gk
    top = tl.maximum(tl.max(tl.where(m, hi_x, -inf), 0), tl.max(tl.where(m, hi_k, -inf), 0))
    bot = tl.minimum(tl.min(tl.where(m, lo_x, inf), 0), tl.min(tl.where(m, lo_k, inf), 0))
    seen = top >= bot  # a channel with a valid row
    top = tl.where(seen, top, 0.0)
    bot = tl.where(seen, bot, 0.0)
    wide = top - bot  # +inf on a channel with a non-finite gate
    z = 0.5 * (top + bot)
    if CLEAN:
        z = tl.where(wide < inf, z, 0.0)
    return z, tl.max(wide, 0), gx, gk


@triton.jit
def _span_factors(gx, gk, z, m, REV: tl.constexpr):
    """The factors of the diagonal tile's fast form around z ([BT, BC] fp32, 0 off ``m``): the
    rows' exp(G^X_i − z) and the columns' exp(z − G^K_j) (``REV``, rows are keys:
    exp(z − G^K_i) and exp(G^X_j − z)). Each within exp(±range/2) of :func:`_span_ref`."""
    if REV:
        return _xp(z[None, :] - gk, m), _xp(gx - z[None, :], m)
    return _xp(gx - z[None, :], m), _xp(z[None, :] - gk, m)


@triton.jit
def _depth_log(b_p, b_x, p_y, p_gdx, p_gdk, p_u, o_t, m_t, o_d, m_d, sD, pair, same, ar, t0,
               n_t, BT: tl.constexpr, REV: tl.constexpr, EXCL: tl.constexpr,
               BLOCK: tl.constexpr, UNROLL: tl.constexpr):  # fmt: skip
    """One depth tile of the depth-gated diagonal P in fp32 log space, added to b_p: the walk
    over the BT columns (``UNROLL``: unrolled) or (``BLOCK``, the interpreter's fallback) the
    [BT, BT, BD] block."""
    if not BLOCK:
        b_xf = b_x.to(tl.float32)
        g_t, b_u = _walk_gates(p_gdx, p_gdk, p_u, o_t, m_t, o_d, m_d, sD, REV, EXCL)
        if UNROLL:  # the steps' loads and exponentials can overlap
            for j in tl.static_range(BT):
                b_p = _depth_step(b_p, b_xf, p_y, p_gdx, p_gdk, g_t, b_u, m_t, t0, n_t, j, ar,
                                  o_t, o_d, m_d, sD, REV, EXCL)  # fmt: skip
        else:
            for j in range(0, BT):
                b_p = _depth_step(b_p, b_xf, p_y, p_gdx, p_gdk, g_t, b_u, m_t, t0, n_t, j, ar,
                                  o_t, o_d, m_d, sD, REV, EXCL)  # fmt: skip
    else:
        b_y = _tile(p_y, o_t, o_d, sD, m_t, m_d)  # [BT, BD]
        e = _pair_gate(p_gdx, p_gdk, p_u, o_t, m_t, o_d, m_d, sD, pair, same, REV, EXCL)
        b_p += tl.sum(b_x.to(tl.float32)[:, None, :] * b_y.to(tl.float32)[None, :, :] * e, 2)
    return b_p


@triton.jit
def _depth_tile(b_p, b_x, p_y, p_gdx, p_gdk, p_u, o_t, m_t, o_d, m_d, sD, pair, same, ar, t0,
                n_t, BT: tl.constexpr, REV: tl.constexpr, EXCL: tl.constexpr,
                DOT_PREC: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
                SPAN: tl.constexpr, CLEAN: tl.constexpr):  # fmt: skip
    """One depth tile of the depth-gated diagonal P, added to b_p: the fast form (module doc)
    when its gates span less than ``SPAN``, else :func:`_depth_log`."""
    if SPAN > 0:
        z, span, gx, gk = _span_ref(p_gdx, p_gdk, o_t, m_t, o_d, m_d, sD, CLEAN)
        if span < SPAN:
            b_y = _tile(p_y, o_t, o_d, sD, m_t, m_d)  # [BT, BD]
            f_r, f_c = _span_factors(gx, gk, z, m_t[:, None] & m_d[None, :], REV)
            b_f = _dot32(b_x.to(tl.float32) * f_r, tl.trans(b_y.to(tl.float32) * f_c), DOT_PREC)
            b_f = tl.where(pair, b_f, 0.0)
            if EXCL:  # u on the diagonal: Σ_d X_i Y_i u
                b_u = tl.load(p_u + o_d, mask=m_d, other=0.0).to(tl.float32)
                b_f += tl.where(same, tl.sum(b_x.to(tl.float32) * b_y.to(tl.float32)
                                             * b_u[None, :], 1)[:, None], 0.0)  # fmt: skip
            b_p += b_f
        else:
            b_p = _depth_log(b_p, b_x, p_y, p_gdx, p_gdk, p_u, o_t, m_t, o_d, m_d, sD, pair,
                             same, ar, t0, n_t, BT, REV, EXCL, BLOCK, UNROLL)  # fmt: skip
    else:
        b_p = _depth_log(b_p, b_x, p_y, p_gdx, p_gdk, p_u, o_t, m_t, o_d, m_d, sD, pair, same,
                         ar, t0, n_t, BT, REV, EXCL, BLOCK, UNROLL)  # fmt: skip
    return b_p


@triton.jit
def _vec_diag_scores(p_x, p_y, p_gdx, p_gdk, p_u, o_t, m_t, D, sD, BT: tl.constexpr,
                     BD: tl.constexpr, REV: tl.constexpr, VEC_D: tl.constexpr,
                     EXCL: tl.constexpr, DOT_PREC: tl.constexpr,
                     BLOCK: tl.constexpr, UNROLL: tl.constexpr, CLEAN: tl.constexpr,
                     P_MEM: tl.constexpr = False, SPAN: tl.constexpr = 0.0):  # fmt: skip
    """The diagonal sub-chunk's P_ij = Σ_d X_i[d] Y_j[d] E^D_ij[d] on the causal pairs j ≤ i
    (``REV``: j ≥ i), strict with u on the diagonal for ``EXCL`` (E^D only with ``VEC_D``),
    0 elsewhere; also the pair masks. ([BT, BT] fp32, pair, same)

    The gated product is, per depth tile, the fast form when the tile's gates span less than
    ``SPAN`` (module doc), else a walk over the BT columns j, each a [BT, BD] product with row j
    (``UNROLL``: the walk unrolled), or (``BLOCK``, the interpreter's fallback: the walk runs ~8x
    slower there) a [BT, BT, BD] fp32 block (BT× the registers, the same exponentials). ``P_MEM``
    (ungated P only): P is loaded from memory instead, p_y pointing at the stored P with row stride
    sD (see :func:`_ld_p`). ``CLEAN`` (the forward): a later row's non-finite gate or key reaches
    no earlier pair (:func:`_span_ref`; the off-pair entries set by ``where``)."""
    ii = o_t[:, None]
    jj = o_t[None, :]
    valid = m_t[:, None] & m_t[None, :]
    same = (ii == jj) & valid
    if REV:
        later = (jj > ii) & valid
    else:
        later = (ii > jj) & valid
    if EXCL:
        pair = later
    else:
        pair = later | same
    ar = tl.arange(0, BT)
    t0 = tl.min(o_t, 0)
    n_t = tl.sum(m_t.to(tl.int32), 0)  # the tile's valid rows (a prefix)
    b_p = tl.zeros([BT, BT], dtype=tl.float32)
    if P_MEM:  # the stored ungated P
        b_p = _ld_p(p_y, o_t, o_t, sD, pair | same, REV)
    else:
        for d0 in range(0, D, BD):
            o_d = d0 + tl.arange(0, BD)
            m_d = o_d < D
            b_x = _tile(p_x, o_t, o_d, sD, m_t, m_d)  # [BT, BD]
            if VEC_D:
                b_p = _depth_tile(b_p, b_x, p_y, p_gdx, p_gdk, p_u, o_t, m_t, o_d, m_d, sD, pair,
                                  same, ar, t0, n_t, BT, REV, EXCL, DOT_PREC, BLOCK, UNROLL,
                                  SPAN, CLEAN)  # fmt: skip
            else:
                b_y = _tile(p_y, o_t, o_d, sD, m_t, m_d)  # [BT, BD]
                b_p += tl.dot(b_x, tl.trans(b_y), input_precision=DOT_PREC)
    if CLEAN or not VEC_D:  # the gated forms': a later key's NaN times a masked 0 is NaN
        b_p = tl.where(pair | same, b_p, 0.0)
    return b_p, pair, same


@triton.jit
def _out_log(b_p, p_y, p_z, p_gox, p_gok, p_u, o_t, m_t, o_o, m_o, sO, sD, pair, same,
             BT: tl.constexpr, REV: tl.constexpr, EXCL: tl.constexpr, BLOCK: tl.constexpr,
             UNROLL: tl.constexpr, P_MEM: tl.constexpr, CLEAN: tl.constexpr):  # fmt: skip
    """The output-gated diagonal Σ_j P_ij Z_j[o] E^O_ij[o] in fp32 log space: the walk over
    the BT rows of Z (``UNROLL``: unrolled) or (``BLOCK``, the interpreter's fallback) the
    [BT, BT, BO] block. ``CLEAN``: a non-finite entry of Z reaches only the rows paired with
    its own (as :func:`triton_common._causal_dot`): zeroed in the sum (P_ij·0·NaN would be NaN
    in every row), those rows set to NaN. [BT, BO] fp32."""
    if CLEAN or BLOCK:
        b_z = _tile(p_z, o_t, o_o, sO, m_t, m_o).to(tl.float32)  # [BT, BO]
    if CLEAN:
        fin = tl.abs(b_z) < float("inf")  # false for NaN and ±inf
    if not BLOCK:
        ar = tl.arange(0, BT)
        t0 = tl.min(o_t, 0)
        n_t = tl.sum(m_t.to(tl.int32), 0)
        g_t, b_u = _walk_gates(p_gox, p_gok, p_u, o_t, m_t, o_o, m_o, sO, REV, EXCL)
        b_out = tl.zeros_like(g_t)
        if UNROLL:
            for j in tl.static_range(BT):
                b_out = _out_step(b_out, b_p, p_y, p_z, p_gox, p_gok, g_t, b_u, m_t, t0, n_t, j,
                                  ar, o_t, o_o, m_o, sO, sD, REV, EXCL, P_MEM, CLEAN)  # fmt: skip
        else:
            for j in range(0, BT):
                b_out = _out_step(b_out, b_p, p_y, p_z, p_gox, p_gok, g_t, b_u, m_t, t0, n_t, j,
                                  ar, o_t, o_o, m_o, sO, sD, REV, EXCL, P_MEM, CLEAN)  # fmt: skip
    else:
        e = _pair_gate(p_gox, p_gok, p_u, o_t, m_t, o_o, m_o, sO, pair, same, REV, EXCL)
        if CLEAN:
            b_z = tl.where(fin, b_z, 0.0)
        b_out = tl.sum(b_p[:, :, None] * b_z[None, :, :] * e, 1)
    if CLEAN:
        bad_j = tl.max(tl.where(fin, 0, 1), 1)  # [BT]: row j of Z has a non-finite entry
        bad_i = tl.max(tl.where(pair | same, bad_j[None, :], 0), 1)  # [BT]: paired with one
        b_out = tl.where(bad_i[:, None] > 0, float("nan"), b_out)
    return b_out


@triton.jit
def _out_fast(b_p, p_z, p_u, gx, gk, z, o_t, m_t, o_o, m_o, sO, pair, same, REV: tl.constexpr,
              EXCL: tl.constexpr, DOT_PREC: tl.constexpr, CLEAN: tl.constexpr):  # fmt: skip
    """The output-gated diagonal in the fast form (module doc): the rows' factor times
    P (causal pairs) against Z ⊙ the columns' factor, one tensor-core product; u on the
    diagonal (``EXCL``) as P_ii Z_i ⊙ u. [BT, BO] fp32."""
    m = m_t[:, None] & m_o[None, :]
    f_r, f_c = _span_factors(gx, gk, z, m, REV)
    b_z = _tile(p_z, o_t, o_o, sO, m_t, m_o)  # [BT, BO]
    b_zc = b_z.to(tl.float32) * f_c
    if CLEAN:  # fp32 operands as _dot32's; a later row's non-finite Z reaches no earlier row
        b_out = f_r * _causal_dot(tl.zeros_like(f_r), b_p, b_zc, pair, DOT_PREC)
    else:
        b_out = f_r * _dot32(tl.where(pair, b_p, 0.0), b_zc, DOT_PREC)
    if EXCL:
        b_u = tl.load(p_u + o_o, mask=m_o, other=0.0).to(tl.float32)
        p_ii = tl.sum(tl.where(same, b_p, 0.0), 1)  # [BT]
        b_out += p_ii[:, None] * b_z.to(tl.float32) * b_u[None, :]
    return b_out


@triton.jit
def _vec_diag(p_x, p_y, p_z, p_gdx, p_gdk, p_gox, p_gok, p_u, o_t, m_t, o_o, m_o, D, sD, sO,
              BT: tl.constexpr, BD: tl.constexpr, REV: tl.constexpr, VEC_D: tl.constexpr,
              VEC_O: tl.constexpr, EXCL: tl.constexpr, DOT_PREC: tl.constexpr,
              BLOCK: tl.constexpr, UNROLL: tl.constexpr, CLEAN: tl.constexpr,
              P_MEM: tl.constexpr = False, SPAN: tl.constexpr = 0.0):  # fmt: skip
    """The diagonal sub-chunk of one tile of BT positions o_t: out_i[o] = Σ_j P_ij Z_j[o]
    E^O_ij[o] with P from :func:`_vec_diag_scores`; the output gate E^O (``VEC_O``) in the
    fast form when the output tile's gates span less than ``SPAN`` (module doc), else in
    fp32 log space (:func:`_out_log`). [BT, BO] fp32."""
    b_p, pair, same = _vec_diag_scores(p_x, p_y, p_gdx, p_gdk, p_u, o_t, m_t, D, sD, BT, BD,
                                       REV, VEC_D, EXCL, DOT_PREC, BLOCK, UNROLL, CLEAN,
                                       P_MEM, SPAN)  # fmt: skip
    if VEC_O:
        if SPAN > 0:
            z, span, gx, gk = _span_ref(p_gox, p_gok, o_t, m_t, o_o, m_o, sO, CLEAN)
            if span < SPAN:
                b_out = _out_fast(b_p, p_z, p_u, gx, gk, z, o_t, m_t, o_o, m_o, sO, pair, same,
                                  REV, EXCL, DOT_PREC, CLEAN)  # fmt: skip
            else:
                b_out = _out_log(b_p, p_y, p_z, p_gox, p_gok, p_u, o_t, m_t, o_o, m_o, sO, sD,
                                 pair, same, BT, REV, EXCL, BLOCK, UNROLL, P_MEM,
                                 CLEAN)  # fmt: skip
        else:
            b_out = _out_log(b_p, p_y, p_z, p_gox, p_gok, p_u, o_t, m_t, o_o, m_o, sO, sD, pair,
                             same, BT, REV, EXCL, BLOCK, UNROLL, P_MEM, CLEAN)  # fmt: skip
    elif CLEAN:  # a later row's non-finite Z must not reach earlier rows (P's masked zeros)
        b_acc = tl.zeros([BT, o_o.shape[0]], dtype=tl.float32)
        b_out = _causal_dot_at(b_acc, b_p, pair | same, p_z, o_t, o_o, sO, m_t, m_o, DOT_PREC)
    else:
        b_z = _tile(p_z, o_t, o_o, sO, m_t, m_o)  # [BT, BO]
        b_out = tl.dot(b_p.to(b_z.dtype), b_z, input_precision=DOT_PREC)
    return b_out


@triton.jit
def _vec_off_scores(p_x, p_y, p_gdx, p_gdk, o_r, m_r, o_s, m_s, i_z, D, sD, BQ: tl.constexpr,
                    BS: tl.constexpr, BD: tl.constexpr, VEC_D: tl.constexpr,
                    DOT_PREC: tl.constexpr, REV: tl.constexpr = False):  # fmt: skip
    """P_rs = Σ_d X_r[d] Y_s[d] exp(G^X_r[d] − G^K_s[d]) for rows o_r after keys o_s, as one
    tensor-core product of the factors exp(G^X_r − z) and exp(z − G^K_s) around z = G^K at
    i_z (between them: both ≤ 1); without ``VEC_D`` the plain X Yᵀ. ``REV``: the transposed
    pairs, rows o_r keys before the queries o_s, exp(G^X_s − G^K_r) as exp(z − G^K_r) and
    exp(G^X_s − z). [BQ, BS] fp32."""
    b_p = tl.zeros([BQ, BS], dtype=tl.float32)
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_r, o_d, sD, m_r, m_d)  # [BQ, BD]
        b_yt = _tile_t(p_y, o_s, o_d, sD, m_s, m_d)  # [BD, BS]
        if VEC_D:
            z_d = _ld_row(p_gdk, i_z, o_d, sD, m_d)  # [BD]
            if REV:
                gk = _tile(p_gdk, o_r, o_d, sD, m_r, m_d)
                gx = _tile_t(p_gdx, o_s, o_d, sD, m_s, m_d)
                fx = _xp(z_d[None, :] - gk, m_r[:, None] & m_d[None, :])
                fy = _xp(gx - z_d[:, None], m_d[:, None] & m_s[None, :])
            else:
                gx = _tile(p_gdx, o_r, o_d, sD, m_r, m_d)
                gk = _tile_t(p_gdk, o_s, o_d, sD, m_s, m_d)
                fx = _xp(gx - z_d[None, :], m_r[:, None] & m_d[None, :])
                fy = _xp(z_d[:, None] - gk, m_d[:, None] & m_s[None, :])
            b_x = (b_x.to(tl.float32) * fx).to(b_x.dtype)
            b_yt = (b_yt.to(tl.float32) * fy).to(b_yt.dtype)
        b_p += tl.dot(b_x, b_yt, input_precision=DOT_PREC)
    return b_p


@triton.jit
def _vec_rows_off(p_x, p_y, p_z, p_gdx, p_gdk, p_gox, p_gok, o_r, m_r, r0, c0, o_o, m_o,
                  D, sD, sO, BQ: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr,
                  BO: tl.constexpr, VEC_D: tl.constexpr, VEC_O: tl.constexpr,
                  DOT_PREC: tl.constexpr, P_MEM: tl.constexpr = False):  # fmt: skip
    """Query tile o_r (starting at r0) against every key s ∈ [c0, r0) of its chunk, as
    tensor-core products against the reference point z = G^K_{r0−1} (every factor ≤ 1).
    ``P_MEM``: the ungated P loaded (p_y, sD as in :func:`_vec_diag_scores`). [BQ, BO] fp32."""
    b_acc = tl.zeros([BQ, BO], dtype=tl.float32)
    has = r0 > c0
    i_z = tl.maximum(r0 - 1, c0)
    if VEC_O:
        z_o = _ld_row(p_gok, i_z, o_o, sO, m_o)  # [BO]
    for s0 in range(c0, r0, BS):
        o_s = s0 + tl.arange(0, BS)
        m_s = o_s < r0
        if P_MEM:
            b_p = _ld_p(p_y, o_r, o_s, sD, m_r[:, None] & m_s[None, :], False)
        else:
            b_p = _vec_off_scores(p_x, p_y, p_gdx, p_gdk, o_r, m_r, o_s, m_s, i_z, D, sD, BQ,
                                  BS, BD, VEC_D, DOT_PREC)  # fmt: skip
        b_z = _tile(p_z, o_s, o_o, sO, m_s, m_o)  # [BS, BO]
        if VEC_O:
            gk = _tile(p_gok, o_s, o_o, sO, m_s, m_o)
            b_z = (b_z.to(tl.float32) * _xp(z_o[None, :] - gk, m_s[:, None] & m_o[None, :])).to(
                b_z.dtype
            )
        b_acc += tl.dot(b_p.to(b_z.dtype), b_z, input_precision=DOT_PREC)
    if VEC_O:
        gx = _tile(p_gox, o_r, o_o, sO, m_r, m_o)
        b_acc *= _xp(gx - z_o[None, :], m_r[:, None] & m_o[None, :] & has)
    return b_acc


@triton.jit
def _vec_cols_off(p_x, p_y, p_z, p_gdx, p_gdk, p_gox, p_gok, o_s, m_s, s_end, c1, o_o, m_o,
                  D, sD, sO, BS: tl.constexpr, BQ: tl.constexpr, BD: tl.constexpr,
                  BO: tl.constexpr, VEC_D: tl.constexpr, VEC_O: tl.constexpr,
                  DOT_PREC: tl.constexpr, P_MEM: tl.constexpr = False):  # fmt: skip
    """Key tile o_s (ending at s_end) against every query r ∈ [s_end, c1) of its chunk, the
    transposed products of :func:`_vec_rows_off`, against z = G^K_{s_end−1}. [BS, BO] fp32."""
    b_acc = tl.zeros([BS, BO], dtype=tl.float32)
    i_z = s_end - 1
    if VEC_O:
        z_o = _ld_row(p_gok, i_z, o_o, sO, m_o)
    for r0 in range(s_end, c1, BQ):
        o_r = r0 + tl.arange(0, BQ)
        m_r = o_r < c1
        if P_MEM:  # P[r, s] stored: its transpose
            b_pt = _ld_p(p_y, o_r, o_s, sD, m_s[:, None] & m_r[None, :], True)
        else:  # [BS, BQ]
            b_pt = _vec_off_scores(p_x, p_y, p_gdx, p_gdk, o_s, m_s, o_r, m_r, i_z, D, sD, BS,
                                   BQ, BD, VEC_D, DOT_PREC, True)  # fmt: skip
        b_z = _tile(p_z, o_r, o_o, sO, m_r, m_o)  # [BQ, BO]
        if VEC_O:
            gx = _tile(p_gox, o_r, o_o, sO, m_r, m_o)
            b_z = (b_z.to(tl.float32) * _xp(gx - z_o[None, :], m_r[:, None] & m_o[None, :])).to(
                b_z.dtype
            )
        b_acc += tl.dot(b_pt.to(b_z.dtype), b_z, input_precision=DOT_PREC)
    if VEC_O:
        gk = _tile(p_gok, o_s, o_o, sO, m_s, m_o)
        b_acc *= _xp(z_o[None, :] - gk, m_s[:, None] & m_o[None, :])
    return b_acc


@triton.jit
def _gate(b_x, g, mask):
    """x ⊙ exp(g) where ``mask`` (0 elsewhere), in x's dtype: the one form of a gated operand
    (also vector_cumsum_kernels' QG and KG, which must equal it bit for bit)."""
    return (b_x.to(tl.float32) * _xp(g, mask)).to(b_x.dtype)


@triton.jit
def _vec_scale_rows(b_x, p_g, o_t, m_t, o_c, m_c, s_c):
    """x_t[c]·exp(G_t[c]) (G ≤ 0 chunk-locally: a factor ≤ 1), in x's dtype."""
    g = _tile(p_g, o_t, o_c, s_c, m_t, m_c)
    return _gate(b_x, g, m_t[:, None] & m_c[None, :])


@triton.jit
def _vec_to_end(b_x, p_g, o_t, m_t, o_c, m_c, s_c, c1):
    """x_t[c]·exp(G_{c1−1}[c] − G_t[c]): a step's weight in the state leaving its chunk."""
    g_last = _ld_row(p_g, c1 - 1, o_c, s_c, m_c)
    g = _tile(p_g, o_t, o_c, s_c, m_t, m_c)
    return _gate(b_x, g_last[None, :] - g, m_t[:, None] & m_c[None, :])


@triton.jit
def _vec_state_fwd(b_C, p_k, p_v, p_gk, p_gv, c0, c1, o_k, m_k, o_v, m_v, K, V, H,
                   BS: tl.constexpr, VEC_V: tl.constexpr, DOT_PREC: tl.constexpr,
                   PRE_GATED: tl.constexpr = False, ONE_TILE: tl.constexpr = False):  # fmt: skip
    """C ← diag(exp(G^K_L)) C diag(exp(G^V_L)) + Σ_s (k_s ⊙ exp(G^K_L − G^K_s))
    (v_s ⊙ exp(G^V_L − G^V_s))ᵀ over the chunk [c0, c1): the state leaving it. ``PRE_GATED``:
    p_k holds k_s ⊙ exp(G^K_L − G^K_s) already (vector_cumsum_kernels' KG). ``ONE_TILE`` (the
    chunk is one tile of BS steps): no loop, so that a caller's chunk loop is the innermost one
    (the compiler pipelines only innermost loops)."""
    b_C *= tl.exp(_ld_row(p_gk, c1 - 1, o_k, H * K, m_k))[:, None]
    if VEC_V:
        b_C *= tl.exp(_ld_row(p_gv, c1 - 1, o_v, H * V, m_v))[None, :]
    if ONE_TILE:
        b_C = _vec_state_steps(b_C, p_k, p_v, p_gk, p_gv, c0 + tl.arange(0, BS), c1, o_k, m_k,
                               o_v, m_v, K, V, H, VEC_V, DOT_PREC, PRE_GATED)  # fmt: skip
    else:
        for s0 in range(c0, c1, BS):
            b_C = _vec_state_steps(b_C, p_k, p_v, p_gk, p_gv, s0 + tl.arange(0, BS), c1, o_k,
                                   m_k, o_v, m_v, K, V, H, VEC_V, DOT_PREC, PRE_GATED)  # fmt: skip
    return b_C


@triton.jit
def _vec_state_steps(b_C, p_k, p_v, p_gk, p_gv, o_s, c1, o_k, m_k, o_v, m_v, K, V, H,
                     VEC_V: tl.constexpr, DOT_PREC: tl.constexpr,
                     PRE_GATED: tl.constexpr):  # fmt: skip
    """The steps o_s (< c1) of :func:`_vec_state_fwd`'s sum added to C."""
    m_s = o_s < c1
    b_k = _tile(p_k, o_s, o_k, H * K, m_s, m_k)
    if not PRE_GATED:
        b_k = _vec_to_end(b_k, p_gk, o_s, m_s, o_k, m_k, H * K, c1)
    b_v = _tile(p_v, o_s, o_v, H * V, m_s, m_v)
    if VEC_V:
        b_v = _vec_to_end(b_v, p_gv, o_s, m_s, o_v, m_v, H * V, c1)
    b_C += tl.dot(tl.trans(b_k), b_v.to(b_k.dtype), input_precision=DOT_PREC)
    return b_C


@triton.jit
def _vec_state_bwd(b_dC, p_q, p_dh, p_gkx, p_gk, p_gv, c0, c1, o_k, m_k, o_v, m_v, K, V, H,
                   scale, BS: tl.constexpr, VEC_V: tl.constexpr, DOT_PREC: tl.constexpr,
                   PRE_GATED: tl.constexpr = False):  # fmt: skip
    """dC_c = diag(exp(G^K_L)) dC_c+1 diag(exp(G^V_L)) + scale·Σ_r (q_r ⊙ exp(G^X_r))
    (dh_r ⊙ exp(G^V_r))ᵀ: the gradient of the state entering the chunk [c0, c1).
    ``PRE_GATED``: p_q holds q_r ⊙ exp(G^X_r) already (vector_cumsum_kernels' QG)."""
    b_dC *= tl.exp(_ld_row(p_gk, c1 - 1, o_k, H * K, m_k))[:, None]
    if VEC_V:
        b_dC *= tl.exp(_ld_row(p_gv, c1 - 1, o_v, H * V, m_v))[None, :]
    for r0 in range(c0, c1, BS):
        o_r = r0 + tl.arange(0, BS)
        m_r = o_r < c1
        b_q = _tile(p_q, o_r, o_k, H * K, m_r, m_k)
        if not PRE_GATED:
            b_q = _vec_scale_rows(b_q, p_gkx, o_r, m_r, o_k, m_k, H * K)
        b_dh = _tile(p_dh, o_r, o_v, H * V, m_r, m_v)
        if VEC_V:
            b_dh = _vec_scale_rows(b_dh, p_gv, o_r, m_r, o_v, m_v, H * V)
        b_dC += scale * tl.dot(tl.trans(b_q), b_dh.to(b_q.dtype), input_precision=DOT_PREC)
    return b_dC


@triton.jit
def _chunk_ref(p_gx, p_gk, c0, c1, o_c, m_c, s_c):
    """The middle z ([BC]) of a chunk's gate range over channels o_c. Chunk-local cumulative
    log decays never rise (decays ≤ 1, validated), so that range is [min(G^X, G^K) at c1 − 1,
    max(G^X, G^K) at c0], and every G^X_t − z and z − G^K_s of the chunk lies within ±half the
    chunk's span (vector_cumsum_kernels' SPAN)."""
    top = tl.maximum(_ld_row(p_gx, c0, o_c, s_c, m_c), _ld_row(p_gk, c0, o_c, s_c, m_c))
    bot = tl.minimum(_ld_row(p_gx, c1 - 1, o_c, s_c, m_c), _ld_row(p_gk, c1 - 1, o_c, s_c, m_c))
    return 0.5 * (top + bot)


@triton.jit
def _chunk_fast_out(p_p, p_z, p_gr, p_go, p_u, o_r, m_r, r0, c0, c1, o_o, m_o, sO, sP,
                    BQ: tl.constexpr, BS: tl.constexpr, BO: tl.constexpr, REV: tl.constexpr,
                    EXCL: tl.constexpr, DOT_PREC: tl.constexpr):  # fmt: skip
    """The intra-chunk part of dq (or, ``REV``, dk) for the rows o_r of a chunk whose span is
    small, output-gated as in :func:`_vec_diag` but over the whole chunk at once:
    out_r[o] = Σ_s P_rs Z_s[o] exp(G^X_r[o] − G^K_s[o]) on the causal pairs (``EXCL``: strict,
    plus P_rr Z_r ⊙ u), as exp(G^X_r − z) ⊙ (P (Z ⊙ exp(z − G^K)))) around the chunk's middle
    z; ``REV``: rows are keys s, Σ_{t ≥ s} P_ts Z_t exp(G^X_t − G^K_s). P is the stored
    ungated P (p_p at the chunk start as :func:`_ld_p`, row stride sP); p_gr is the rows'
    gate (G^X, ``REV``: G^K), p_go the other side's. fp32 operands (:func:`_dot32`).
    [BQ, BO] fp32."""
    if REV:
        z = _chunk_ref(p_go, p_gr, c0, c1, o_o, m_o, sO)
    else:
        z = _chunk_ref(p_gr, p_go, c0, c1, o_o, m_o, sO)
    g_r = _tile(p_gr, o_r, o_o, sO, m_r, m_o)
    m_ro = m_r[:, None] & m_o[None, :]
    if REV:
        f_r = _xp(z[None, :] - g_r, m_ro)
        lo, hi = r0, c1
    else:
        f_r = _xp(g_r - z[None, :], m_ro)
        lo, hi = c0, tl.minimum(r0 + BQ, c1)
    b_acc = tl.zeros([BQ, BO], dtype=tl.float32)
    for s0 in range(lo, hi, BS):
        o_s = s0 + tl.arange(0, BS)
        m_s = o_s < hi
        if REV:  # P[t, r] for the later queries t = o_s
            causal = o_s[None, :] > o_r[:, None]
        else:
            causal = o_s[None, :] < o_r[:, None]
        if not EXCL:
            causal = causal | (o_s[None, :] == o_r[:, None])
        m_p = causal & m_r[:, None] & m_s[None, :]
        if REV:  # [BQ, BS]: P[o_s, o_r] transposed
            b_p = _ld_p(p_p, o_s, o_r, sP, m_p, True)
        else:
            b_p = _ld_p(p_p, o_r, o_s, sP, m_p, False)
        g_s = _tile(p_go, o_s, o_o, sO, m_s, m_o)
        m_so = m_s[:, None] & m_o[None, :]
        if REV:
            f_s = _xp(g_s - z[None, :], m_so)
        else:
            f_s = _xp(z[None, :] - g_s, m_so)
        b_z = _tile(p_z, o_s, o_o, sO, m_s, m_o).to(tl.float32) * f_s
        b_acc += _dot32(b_p, b_z, DOT_PREC)
    b_acc *= f_r
    if EXCL:  # the bonus on the diagonal: P_rr Z_r ⊙ u
        p_rr = tl.load(p_p + o_r.to(tl.int64) * sP + o_r, mask=m_r, other=0.0).to(tl.float32)
        b_u = tl.load(p_u + o_o, mask=m_o, other=0.0).to(tl.float32)
        b_zr = _tile(p_z, o_r, o_o, sO, m_r, m_o).to(tl.float32)
        b_acc += p_rr[:, None] * b_zr * b_u[None, :]
    return b_acc


@triton.jit
def _vec_state_part(p_x, p_st, p_gd, p_go, o_t, m_t, o_o, m_o, c1, D, sD, sO, s_sd, s_so,
                    BT: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr, TO_END: tl.constexpr,
                    VEC_D: tl.constexpr, VEC_O: tl.constexpr, DOT_PREC: tl.constexpr):  # fmt: skip
    """The inter-chunk part of a tile with per-channel decays, (X_t ⊙ Γ_t) S ⊙ Γ_t with the
    gates on the depth (``VEC_D``) and output (``VEC_O``) sides: Γ_t = exp(G_t) against the
    state entering the chunk, or (``TO_END``) exp(G_{c1−1} − G_t) against the one leaving it.
    The state's element strides (s_sd, s_so) pick S or Sᵀ. [BT, BO] fp32."""
    b_acc = tl.zeros([BT, BO], dtype=tl.float32)
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_t, o_d, sD, m_t, m_d)  # [BT, BD]
        if VEC_D and TO_END:
            b_x = _vec_to_end(b_x, p_gd, o_t, m_t, o_d, m_d, sD, c1)
        elif VEC_D:
            b_x = _vec_scale_rows(b_x, p_gd, o_t, m_t, o_d, m_d, sD)
        b_s = _state_tile(p_st, o_d, o_o, s_sd, s_so, m_d, m_o)  # [BD, BO]
        b_acc += tl.dot(b_x, b_s.to(b_x.dtype), input_precision=DOT_PREC)
    if VEC_O and TO_END:
        b_acc = _vec_to_end(b_acc, p_go, o_t, m_t, o_o, m_o, sO, c1)
    elif VEC_O:
        b_acc = _vec_scale_rows(b_acc, p_go, o_t, m_t, o_o, m_o, sO)
    return b_acc


@triton.jit
def _fast_chunk(spans, i_c, i_bh, n_bh, LIM: tl.constexpr):
    """Whether chunk i_c of row b·h is a fast chunk: its span (spans [NT, B·H] fp32,
    vector_cumsum_kernels) below LIM (vector_scores_kernels' fast chunks; LIM 0: none is, and
    spans is not read)."""
    if LIM > 0:
        return tl.load(spans + i_c * n_bh + i_bh) < LIM
    return i_c < 0
