"""Per-channel decays with stored intra-chunk scores (GLA with gk alone, RWKV6; chunk mode).

Forming each gated score where it is applied, one 16-step sub-chunk of rows at a time (as
vector_kernels does for calls with gv), the forward and dv would redo the gated products for
every output tile, take M = 16 products and read each chunk's state once per sub-chunk. Here
the scores are formed once and stored, then applied with wide row tiles:

* ``scores_kernel``: A[b, t, h, s − c0] = Σ_d X_t[d] Y_s[d] exp(G^X_t[d] − G^K_s[d]) for the
  keys s ≤ t of t's chunk (RWKV6: s < t, and u on s = t), by sub-chunks of rows: earlier
  keys as tensor-core products around a reference point, the diagonal sub-chunk in log space
  (vector_common). A is ``[B, T, H, L]`` in the inputs' dtype, the rounding the fused path
  gives the scores before its product with Z; zeros above the diagonal.
* the same kernel with ``GATED`` off stores the backward's ungated P = do vᵀ (fp32, diagonal
  included), which dq and dk then load (vector_kernels.dq_bwd_kernel, dk_bwd_kernel) instead
  of forming it again for every output tile;
* ``apply_kernel``: out = scale·(A Z + (X ⊙ e^{G^X}) S) for the forward (Z = v, S the state
  entering the chunk) and, ``REV``, scale·Aᵀ Z + (X ⊙ e^{G_L − G^K}) dS for dv (Z = do, dS the
  state gradient leaving the chunk);
* the same kernel with ``INTER``: the inter-chunk parts of dq and dk, gated over their output
  dimension, with wide row tiles, for the 16-row dq/dk programs to load instead of each
  forming its sub-chunk's rows against the state.

Fast chunks (``FAST``, a limit LIM > 0): a chunk whose gates span less than LIM (SPAN,
vector_cumsum_kernels) needs no sub-chunks. ``fast_scores_kernel`` forms its scores with whole row
tiles as one product around the chunk's middle (factors within exp(±LIM/2)), and
apply_kernel's ``INTER`` finishes its dq or dk there (vector_common._chunk_fast_out) instead
of storing the inter-chunk part alone; scores_kernel and the dq/dk programs skip those chunks
(their ``SKIP``). The others keep the sub-chunk forms, so strong decays stay exact.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import (
    FLAG_BLOCK,
    _any_flag,
    _causal_dot,
    _chunk_rows,
    _not_finite,
    _program_slot,
    _slot_ids,
    _slot_span,
    _tile,
    _tile_t,
)
from linrnn.engine.vector_common import (
    _chunk_fast_out,
    _chunk_ref,
    _dot32,
    _fast_chunk,
    _vec_diag_scores,
    _vec_off_scores,
    _vec_state_part,
    _xp,
)


@triton.jit(do_not_specialize=["T", "NT"])
def scores_kernel(
    X, Y, GX, GK, U, A, SPAN, CHUNKS, T, H, D, L, NT, NQ,
    BQ: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, VARLEN: tl.constexpr,
    EXCL: tl.constexpr, BLOCK_DIAG: tl.constexpr, DOT_PREC: tl.constexpr,
    GATED: tl.constexpr, DIAG_SPAN: tl.constexpr, SKIP: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × sub-chunks, B·H): rows o_r of one sub-chunk of BQ steps against every
    key of their chunk up to the sub-chunk's end; the diagonal sub-chunk walked over its key
    rows (``BLOCK_DIAG``: the interpreter's block form), in the fast form where its gates span
    less than ``DIAG_SPAN`` (0: nowhere). ``GATED`` False: the plain X Yᵀ, diagonal included
    (the backward's do vᵀ; GX, GK, U None). U [H, D]: RWKV6's bonus (``EXCL``, else None).
    ``SKIP`` > 0: not the chunks whose span (SPAN [NT, B·H], else None) is below it
    (fast_scores_kernel's)."""
    i_cq, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    i_c, c0, c1, _i_n, r0, o_r, m_r = _chunk_rows(CHUNKS, i_cq, NQ, L, T, BQ, VARLEN)
    if r0 >= c1:
        return
    if _fast_chunk(SPAN, i_c, i_bh, tl.num_programs(1), SKIP):
        return
    base = i_b * T * H + i_h
    p_x, p_y = X + base * D, Y + base * D
    p_gx, p_gk, p_u = GX, GK, U
    if GATED:
        p_gx, p_gk = GX + base * D, GK + base * D
    if EXCL:
        p_u = U + i_h * D
    p_a = A + base * L + o_r.to(tl.int64)[:, None] * H * L  # [BQ, 1] row starts
    i_z = tl.maximum(r0 - 1, c0)
    for s0 in range(c0, r0, BS):
        o_s = s0 + tl.arange(0, BS)
        m_s = o_s < r0
        b_p = _vec_off_scores(p_x, p_y, p_gx, p_gk, o_r, m_r, o_s, m_s, i_z, D, H * D, BQ, BS,
                              BD, GATED, DOT_PREC)  # fmt: skip
        tl.store(p_a + (o_s - c0)[None, :], b_p.to(A.dtype.element_ty),
                 mask=m_r[:, None] & m_s[None, :])  # fmt: skip
    b_p, _pair, _same = _vec_diag_scores(
        p_x, p_y, p_gx, p_gk, p_u, o_r, m_r, D, H * D, BQ, BD, False, GATED, EXCL, DOT_PREC,
        BLOCK_DIAG, False, True, False, DIAG_SPAN,
    )  # fmt: skip
    tl.store(p_a + (o_r - c0)[None, :], b_p.to(A.dtype.element_ty),
             mask=m_r[:, None] & (o_r < c0 + L)[None, :])  # fmt: skip
    for s0 in range(r0 + BQ, c0 + L, BS):  # zeros after the sub-chunk: every entry is written
        o_s = s0 + tl.arange(0, BS)
        zero = tl.zeros([BQ, BS], dtype=A.dtype.element_ty)
        tl.store(p_a + (o_s - c0)[None, :], zero, mask=m_r[:, None] & (o_s < c0 + L)[None, :])


@triton.jit(do_not_specialize=["T", "NT"])
def fast_scores_kernel(
    X, Y, GX, GK, U, A, SPAN, CHUNKS, T, H, D, L, NT, NQ,
    BQ: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, VARLEN: tl.constexpr,
    EXCL: tl.constexpr, DOT_PREC: tl.constexpr, LIM: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × row tiles, B·H): scores_kernel's A for the rows o_r of a fast chunk
    (span below LIM; the others are left to scores_kernel): every key of the chunk at once,
    A = (X ⊙ exp(G^X − z)) (Y ⊙ exp(z − G^K))ᵀ on the causal pairs around the chunk's middle
    z (fp32 operands, tf32 products), u's Σ X_r Y_r u on RWKV6's diagonal, zeros elsewhere."""
    i_cq, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    i_c, c0, c1, _i_n, r0, o_r, m_r = _chunk_rows(CHUNKS, i_cq, NQ, L, T, BQ, VARLEN)
    if r0 >= c1:
        return
    if not _fast_chunk(SPAN, i_c, i_bh, tl.num_programs(1), LIM):
        return
    base = i_b * T * H + i_h
    p_x, p_y = X + base * D, Y + base * D
    p_gx, p_gk = GX + base * D, GK + base * D
    p_a = A + base * L + o_r.to(tl.int64)[:, None] * H * L  # [BQ, 1] row starts
    r_end = tl.minimum(r0 + BQ, c1)
    b_bonus = tl.zeros([BQ], dtype=tl.float32)
    if EXCL:  # Σ_d X_r Y_r u, RWKV6's diagonal
        for d0 in range(0, D, BD):
            o_d = d0 + tl.arange(0, BD)
            m_d = o_d < D
            b_u = tl.load(U + i_h * D + o_d, mask=m_d, other=0.0).to(tl.float32)
            b_xy = (_tile(p_x, o_r, o_d, H * D, m_r, m_d).to(tl.float32)
                    * _tile(p_y, o_r, o_d, H * D, m_r, m_d).to(tl.float32))  # fmt: skip
            b_bonus += tl.sum(b_xy * b_u[None, :], 1)
    for s0 in range(c0, c0 + L, BS):
        o_s = s0 + tl.arange(0, BS)
        m_s = o_s < c1
        b_a = tl.zeros([BQ, BS], dtype=tl.float32)
        if s0 < r_end:
            for d0 in range(0, D, BD):
                o_d = d0 + tl.arange(0, BD)
                m_d = o_d < D
                z = _chunk_ref(p_gx, p_gk, c0, c1, o_d, m_d, H * D)
                g_x = _tile(p_gx, o_r, o_d, H * D, m_r, m_d)
                b_x = _tile(p_x, o_r, o_d, H * D, m_r, m_d).to(tl.float32)
                b_x *= _xp(g_x - z[None, :], m_r[:, None] & m_d[None, :])
                g_k = _tile_t(p_gk, o_s, o_d, H * D, m_s, m_d)  # [BD, BS]
                b_yt = _tile_t(p_y, o_s, o_d, H * D, m_s, m_d).to(tl.float32)
                b_yt *= _xp(z[:, None] - g_k, m_d[:, None] & m_s[None, :])
                b_a += _dot32(b_x, b_yt, DOT_PREC)
            if EXCL:
                b_a = tl.where(o_s[None, :] < o_r[:, None], b_a, 0.0)
                b_a = tl.where(o_s[None, :] == o_r[:, None], b_bonus[:, None], b_a)
            else:
                b_a = tl.where(o_s[None, :] <= o_r[:, None], b_a, 0.0)
            b_a = tl.where(m_s[None, :], b_a, 0.0)
        tl.store(p_a + (o_s - c0)[None, :], b_a.to(A.dtype.element_ty),
                 mask=m_r[:, None] & (o_s < c0 + L)[None, :])  # fmt: skip


@triton.jit(do_not_specialize=["T", "NT", "SLOTS"])
def apply_kernel(
    A, Z, X, ST, G, OUT, CHUNKS, GO, U, FOUT, FD, SPAN, T, H, D, O, L, NT, NQ, scale, s_sd,
    s_so,
    BQ: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    REV: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr, INTER: tl.constexpr,
    FAST: tl.constexpr, EXCL: tl.constexpr, PRE_GATED: tl.constexpr, bad=None, SLOTS=0,
    FIX: tl.constexpr = False,
):  # fmt: skip
    """Grid (chunks × row tiles, output tiles, B·H): rows o_r of a chunk — queries (forward),
    or keys (``REV``, dv) — against the stored scores of their chunk, plus the inter-chunk
    part against the chunk's state (gate G: G^X; ``REV``: G^K).

    ``INTER``: the inter-chunk part alone, gated over the output dimension instead, stored
    fp32 and unscaled (A, Z None unless ``FAST``): dq's (X = do, S = Cᵀ, G = G^X) or,
    ``REV``, dk's (X = v, S the state gradient dCᵀ, gate exp(G_{c1−1} − G^K)).

    ``FAST`` > 0 (with ``INTER``): in a chunk whose span (SPAN) is below it, the whole dq (or
    dk) instead: the intra-chunk part from the stored ungated P (A = do vᵀ, fp32) against
    Z = k (dk: q) with the other side's gate GO and RWKV6's u (``EXCL``), stored to FOUT in
    its dtype, and FD ⊙ it (FD = q, dk: k) to OUT, what the dq/dk programs would store
    there; they skip such chunks. Without ``FAST``, GO, U, FOUT, FD, SPAN are None (U also
    without ``EXCL``).

    ``PRE_GATED`` (not ``INTER``): X is gated already, q ⊙ exp(G^X) (or, ``REV``, k ⊙
    exp(G^K_L − G^K)), as vector_cumsum_kernels stores it: the state part takes it as it
    is.

    Queries (neither ``REV`` nor ``INTER``) launch twice (fix_pass.launch): plain products,
    flagging in bad [SLOTS] whether each program's rows came out finite, then, ``FIX``, a few
    programs that find the flagged tiles and form them again with causal products
    (triton_common._causal_dot), so that a later key's non-finite value reaches no earlier row
    (docs/DESIGN.md §6.1)."""
    if FIX:
        lo, hi = _slot_span(SLOTS)
        for s0 in range(lo, hi, FLAG_BLOCK):
            if _any_flag(bad, s0, hi):
                for slot in range(s0, tl.minimum(s0 + FLAG_BLOCK, hi)):
                    if tl.load(bad + slot) != 0:
                        i_cq, i_o, i_bh = _slot_ids(slot, NT * NQ, tl.cdiv(O, BO))
                        i_c, c0, c1, _i_n, r0, o_r, m_r = _chunk_rows(CHUNKS, i_cq, NQ, L, T, BQ,
                                                                      VARLEN)  # fmt: skip
                        _apply_tile(A, Z, X, ST, G, OUT, GO, U, FOUT, FD, SPAN, bad, slot, i_o,
                                    i_bh, i_c, c0, c1, r0, o_r, m_r, 0, T, H, D, O, L, NT, scale,
                                    s_sd, s_so, BQ, BS, BD, BO, REV, DOT_PREC, INTER, FAST, EXCL,
                                    PRE_GATED, True)  # fmt: skip
    else:
        i_cq, i_o, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        i_c, c0, c1, _i_n, r0, o_r, m_r = _chunk_rows(CHUNKS, i_cq, NQ, L, T, BQ, VARLEN)
        if r0 >= c1:
            return
        _apply_tile(A, Z, X, ST, G, OUT, GO, U, FOUT, FD, SPAN, bad, _program_slot(), i_o, i_bh,
                    i_c, c0, c1, r0, o_r, m_r, tl.num_programs(2), T, H, D, O, L, NT, scale, s_sd,
                    s_so, BQ, BS, BD, BO, REV, DOT_PREC, INTER, FAST, EXCL, PRE_GATED,
                    False)  # fmt: skip


@triton.jit
def _apply_tile(A, Z, X, ST, G, OUT, GO, U, FOUT, FD, SPAN, bad, slot, i_o, i_bh, i_c, c0, c1, r0,
                o_r, m_r, NBH, T, H, D, O, L, NT, scale, s_sd, s_so, BQ: tl.constexpr,
                BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr, REV: tl.constexpr,
                DOT_PREC: tl.constexpr, INTER: tl.constexpr, FAST: tl.constexpr,
                EXCL: tl.constexpr, PRE_GATED: tl.constexpr, FIX: tl.constexpr):  # fmt: skip
    """One tile of :func:`apply_kernel` (rows o_r of chunk i_c, output tile i_o, row i_bh of
    B·H; NBH = B·H for the fast chunks' span table): the first launch's plain products and
    the flag at bad[slot], or (``FIX``) the causal products."""
    i_b, i_h = i_bh // H, i_bh % H
    o_o = i_o * BO + tl.arange(0, BO)
    m_o = o_o < O
    base = i_b * T * H + i_h
    b_acc = tl.zeros([BQ, BO], dtype=tl.float32)
    if not INTER:
        p_z, p_a = Z + base * O, A + base * L
    if REV and not INTER:  # keys r, every later query t of the chunk: Σ_t A[t, r] Z_t
        for t0 in range(r0, c1, BS):
            o_t = t0 + tl.arange(0, BS)
            m_t = o_t < c1
            p = p_a + o_t.to(tl.int64)[None, :] * H * L + (o_r - c0)[:, None]
            causal = m_r[:, None] & m_t[None, :] & (o_t[None, :] >= o_r[:, None])
            b_a = tl.load(p, mask=causal, other=0.0)  # [BQ, BS]
            b_z = _tile(p_z, o_t, o_o, H * O, m_t, m_o)  # [BS, BO]
            b_acc += tl.dot(b_a, b_z, input_precision=DOT_PREC)
    elif not INTER:  # queries r, every earlier key s of the chunk: Σ_s A[r, s] Z_s
        for s0 in range(c0, tl.minimum(r0 + BQ, c1), BS):
            o_s = s0 + tl.arange(0, BS)
            m_s = o_s < c1
            p = p_a + o_r.to(tl.int64)[:, None] * H * L + (o_s - c0)[None, :]
            causal = m_r[:, None] & m_s[None, :] & (o_s[None, :] <= o_r[:, None])
            b_a = tl.load(p, mask=causal, other=0.0)  # [BQ, BS]
            b_z = _tile(p_z, o_s, o_o, H * O, m_s, m_o)  # [BS, BO]
            if FIX:  # a later key's non-finite value must not reach earlier rows
                b_acc = _causal_dot(b_acc, b_a, b_z, causal, DOT_PREC)
            else:
                b_acc += tl.dot(b_a, b_z, input_precision=DOT_PREC)
        if not FIX:
            tl.store(bad + slot, _not_finite(b_acc).to(tl.int8))
    b_int = _vec_state_part(
        X + base * D, ST + (i_bh * NT + i_c) * D * O, G + base * D, G + base * O, o_r, m_r, o_o,
        m_o, c1, D, H * D, H * O, s_sd, s_so, BQ, BD, BO, REV, not (INTER or PRE_GATED), INTER,
        DOT_PREC,
    )  # fmt: skip
    if INTER:
        b_out = b_int
        if FAST > 0:
            if _fast_chunk(SPAN, i_c, i_bh, NBH, FAST):
                p_u = U
                if EXCL:
                    p_u = U + i_h * O
                b_in = _chunk_fast_out(
                    A + base * L - c0, Z + base * O, G + base * O, GO + base * O, p_u, o_r, m_r,
                    r0, c0, c1, o_o, m_o, H * O, H * L, BQ, BS, BO, REV, EXCL, DOT_PREC,
                )  # fmt: skip
                if REV:  # the state gradient carries the scale already
                    b_res = scale * b_in + b_int
                else:
                    b_res = scale * (b_in + b_int)
                m_out = m_r[:, None] & m_o[None, :]
                p_res = base * O + o_r.to(tl.int64)[:, None] * H * O + o_o[None, :]
                tl.store(FOUT + p_res, b_res.to(FOUT.dtype.element_ty), mask=m_out)
                b_out = tl.load(FD + p_res, mask=m_out, other=0.0).to(tl.float32) * b_res
    elif REV:  # the state gradient carries the scale already
        b_out = scale * b_acc + b_int
    else:
        b_out = scale * (b_acc + b_int)
    p_out = OUT + base * O + o_r.to(tl.int64)[:, None] * H * O + o_o[None, :]
    tl.store(p_out, b_out.to(OUT.dtype.element_ty), mask=m_r[:, None] & m_o[None, :])
