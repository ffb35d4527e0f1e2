"""Triton kernels of the scalar-gate chunk engine that walk the chunk states (docs/DESIGN.md §3),
and the normalizer's per-row factors; the intra-chunk kernels are in :mod:`scalar_kernels`, whose
docstring gives the math, the flags and the layouts these kernels share.

* ``states_fwd_kernel`` — walks the chunks, stores C_c, n_c, m_c and the final state.
* ``states_bwd_kernel`` — the reverse recurrence of the state gradient dC_c (and dn_c).
* ``norm_bwd_kernel`` — per-row factors of the normalizer's backward (also the recurrent
  engine's).
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import (
    NORM_MAXM,
    NORM_SUM,
    _bounds,
    _cum,
    _cum_last,
    _inv_denominator,
    _start_state,
    _state_tile,
    _tile,
    _tile_t,
    _vec,
    _walk,
)


@triton.jit
def _add_steps(b_C, b_n, p_k, p_v, g, gi, o_s, c0, c1, o_k, o_v, m_k, m_v, s_k, s_v, b_last,
               m_next, HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_N: tl.constexpr,
               DOT_PREC: tl.constexpr, PER_HEAD: tl.constexpr):  # fmt: skip
    """The steps o_s (< c1) of a chunk added to its leaving state: C += Σ_s w_s k_s v_sᵀ and
    n += Σ_s w_s k_s, w_s = exp(b_last − b_s + a_s − m_next) ≤ 1."""
    m_s = o_s < c1
    b_kt = _tile_t(p_k, o_s, o_k, s_k, m_s, m_k)  # [BK, BS]
    b_vs = _tile(p_v, o_s, o_v, s_v, m_s, m_v)  # [BS, BV]
    w = -m_next + tl.zeros(o_s.shape, dtype=tl.float32)
    if HAS_DECAY:
        w += b_last - _cum(g, o_s, m_s, c0, PER_HEAD)
    if HAS_IGATE:
        w += _vec(gi, o_s, m_s)
    w = tl.exp(tl.where(m_s, w, float("-inf")))  # [BS], ≤ 1
    b_kw = b_kt.to(tl.float32) * w[None, :]
    b_C += tl.dot(b_kw.to(b_vs.dtype), b_vs, input_precision=DOT_PREC)
    if HAS_N:
        b_n += tl.sum(b_kw, 1)
    return b_C, b_n


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def states_fwd_kernel(
    k, v, g, gi, cmax, h0, n0, m0, h, hn, mc, ht, nt, co, chunks,
    T, H, G, K, V, L, NT, NSEQ,
    BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr, HAS_N: tl.constexpr,
    HAS_H0: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr, ONE_TILE: tl.constexpr,
    PER_HEAD: tl.constexpr = False,
):  # fmt: skip
    """Grid (K tiles, V tiles, N·H). Stores the state entering each chunk (h [B·H, NT, K, V],
    hn [B·H, NT, K], mc [B·H, NT + NSEQ]) and the final state (ht [N, H, K, V], nt [N, H, K],
    the last slot of each sequence in mc), from the initial one (h0, n0, m0). cmax [B·H, NT]:
    each chunk's max over s of (a_s − b_s), the chunk's own candidate for the max state. The max
    state of chunk i_c of sequence n sits at mc[row, i_c + n].

    ``ONE_TILE`` (L ≤ BS): a chunk is one time tile, so the chunk loop is the innermost loop
    and the compiler's pipelining loads the next chunk's k and v while this one's are summed."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, i_n = _walk(co, i_nh, H, NT, VARLEN)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    HK = H // G  # k heads: value head i_h reads k head i_h // G
    p_k = k + (i_b * T * HK + i_h // G) * K
    p_v = v + (i_b * T * H + i_h) * V
    if HAS_DECAY:
        if PER_HEAD:  # the head's constant log decay, loaded once (the rows are formed)
            g = tl.load(g + i_h).to(tl.float32)
        else:
            g += i_bh * T
    if HAS_IGATE:
        gi += i_bh * T
    p_h = h + i_bh * NT * K * V
    b_C, b_n = _start_state(h0, n0, i_st, o_k, o_v, K, V, m_k, m_v, HAS_H0, HAS_N, BK, BV)
    if HAS_MAX and HAS_H0:
        b_m = tl.load(m0 + i_st).to(tl.float32)
    else:  # m_0 = −∞ (no state yet), as a tensor so the loop carries one type
        b_m = tl.max(tl.full([2], float("-inf"), tl.float32), 0)
    head = (i_k == 0) & (i_v == 0)
    if HAS_MAX:
        p_mc = mc + i_bh * (NT + NSEQ) + i_n
    for i_c in range(c_lo, c_hi):
        c0, c1, _seq_c = _bounds(chunks, i_c, L, T, VARLEN)
        p_c = p_h + i_c * K * V
        tl.store(
            p_c + o_k[:, None] * V + o_v[None, :], b_C.to(h.dtype.element_ty),
            mask=m_k[:, None] & m_v[None, :],
        )  # fmt: skip
        if HAS_N:
            tl.store(hn + (i_bh * NT + i_c) * K + o_k, b_n, mask=m_k & ((o_k * 0 + i_v) == 0))
        b_last = _cum_last(g, c0, c1, PER_HEAD) if HAS_DECAY else 0.0
        if HAS_MAX:
            tl.store(p_mc + i_c, b_m, mask=head)
            m_next = b_last + tl.maximum(b_m, tl.load(cmax + i_bh * NT + i_c))
            decay = tl.exp(b_last + b_m - m_next)
        elif HAS_DECAY:
            m_next = 0.0
            decay = tl.exp(b_last)
        else:
            m_next = 0.0
            decay = 1.0
        b_C *= decay
        b_n *= decay
        if ONE_TILE:
            b_C, b_n = _add_steps(b_C, b_n, p_k, p_v, g, gi, c0 + tl.arange(0, BS), c0, c1, o_k,
                                  o_v, m_k, m_v, HK * K, H * V, b_last, m_next, HAS_DECAY,
                                  HAS_IGATE, HAS_N, DOT_PREC, PER_HEAD)  # fmt: skip
        else:
            for s0 in range(c0, c1, BS):
                b_C, b_n = _add_steps(b_C, b_n, p_k, p_v, g, gi, s0 + tl.arange(0, BS), c0, c1,
                                      o_k, o_v, m_k, m_v, HK * K, H * V, b_last, m_next,
                                      HAS_DECAY, HAS_IGATE, HAS_N, DOT_PREC, PER_HEAD)  # fmt: skip
        b_m = m_next
    tl.store(
        ht + i_st * K * V + o_k[:, None] * V + o_v[None, :], b_C.to(ht.dtype.element_ty),
        mask=m_k[:, None] & m_v[None, :],
    )  # fmt: skip
    if HAS_N:
        tl.store(nt + i_st * K + o_k, b_n, mask=m_k & ((o_k * 0 + i_v) == 0))
    if HAS_MAX:
        tl.store(p_mc + c_hi, b_m, mask=head)


@triton.jit(do_not_specialize=["T"])
def norm_bwd_kernel(
    do, o, den, m_row, ra, rd, dm_row, T, H, V, eps,
    BT: tl.constexpr, BV: tl.constexpr, NORM: tl.constexpr, HAS_MAX: tl.constexpr,
):  # fmt: skip
    """Grid (T tiles, B·H). With h = o / P, P = f(den) + eps: ra = 1/P, rd = ∂L/∂den =
    −(do·h)/P · f'(den) and (``HAS_MAX``) dm_row = ∂L/∂m_r = −(do·h)·eps/P (m enters h only
    through eps once the state's scale cancels); each [B·H, T] fp32."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    base = (i_b * T * H + i_h) * V
    dot = tl.zeros([BT], dtype=tl.float32)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        m_v = o_v < V
        b_do = _tile(do + base, o_t, o_v, H * V, m_t, m_v).to(tl.float32)
        b_h = _tile(o + base, o_t, o_v, H * V, m_t, m_v).to(tl.float32)
        dot += tl.sum(b_do * b_h, 1)
    b_den = _vec(den + i_bh * T, o_t, m_t)
    b_mr = _vec(m_row + i_bh * T, o_t, m_t) if NORM == NORM_MAXM else tl.zeros([BT], tl.float32)
    inv, above = _inv_denominator(b_den, b_mr, eps, NORM)
    if NORM == NORM_SUM:
        slope = tl.full([BT], 1.0, tl.float32)
    else:
        slope = tl.where(above, tl.where(b_den >= 0, 1.0, -1.0), 0.0)
    tl.store(ra + i_bh * T + o_t, inv, mask=m_t)
    tl.store(rd + i_bh * T + o_t, -dot * inv * slope, mask=m_t)
    if HAS_MAX:
        tl.store(dm_row + i_bh * T + o_t, -dot * eps * inv, mask=m_t)


@triton.jit
def _add_rows(b_dC, b_dn, p_q, p_do, g, m_row, ra, rd, row, o_r, c0, c1, o_k, o_v, m_k, m_v,
              s_q, s_do, m_c, scale, HAS_DECAY: tl.constexpr, HAS_MAX: tl.constexpr,
              HAS_N: tl.constexpr, HAS_NORM: tl.constexpr, DOT_PREC: tl.constexpr,
              PER_HEAD: tl.constexpr):  # fmt: skip
    """The rows o_r (< c1) of a chunk added to the gradient of the state entering it:
    dC += Σ_r f_r q_r do_rᵀ (times ra_r with the normalizer), dn += Σ_r f_r rd_r q_r, with
    f_r = scale · exp(b_r + m_c − m_r)."""
    m_r = o_r < c1
    lf = _cum(g, o_r, m_r, c0, PER_HEAD) if HAS_DECAY else tl.zeros(o_r.shape, dtype=tl.float32)
    if HAS_MAX:
        lf += m_c - _vec(m_row + row, o_r, m_r)
    f = scale * tl.exp(tl.where(m_r, lf, float("-inf")))  # [BQ]
    b_qt = _tile_t(p_q, o_r, o_k, s_q, m_r, m_k).to(tl.float32)  # [BK, BQ]
    b_do = _tile(p_do, o_r, o_v, s_do, m_r, m_v)  # [BQ, BV]
    if HAS_NORM:
        b_dC += tl.dot(
            (b_qt * (f * _vec(ra + row, o_r, m_r))[None, :]).to(b_do.dtype), b_do,
            input_precision=DOT_PREC,
        )  # fmt: skip
        if HAS_N:
            b_dn += tl.sum(b_qt * (f * _vec(rd + row, o_r, m_r))[None, :], 1)
    else:
        b_qf = (b_qt * f[None, :]).to(b_do.dtype)
        b_dC += tl.dot(b_qf, b_do, input_precision=DOT_PREC)
    return b_dC, b_dn


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def states_bwd_kernel(
    q, do, g, mc, m_row, ra, rd, h, hn, ht, nt, dht, dnt, dh, dhn, dh0, dn0, bnd, co, chunks,
    T, H, G, K, V, L, NT, NSEQ, scale,
    BK: tl.constexpr, BV: tl.constexpr, BQ: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_MAX: tl.constexpr, HAS_N: tl.constexpr, HAS_NORM: tl.constexpr,
    HAS_DHT: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr, HAS_BND: tl.constexpr,
    ONE_TILE: tl.constexpr, PER_HEAD: tl.constexpr = False,
):  # fmt: skip
    """Grid (K tiles, V tiles, N·H). Walks the chunks backwards from the final state's gradient
    (dht, dnt); stores the gradient of the state leaving each chunk (dh [B·H, NT, K, V] in its
    dtype, dhn [B·H, NT, K]) and of the initial state (dh0 [N, H, K, V], dn0 [N, H, K]).
    ``HAS_NORM``: the outputs' row factors ra, rd of :func:`norm_bwd_kernel`.

    ``HAS_BND`` (a log decay that wants its gradient): also this tile's part of ⟨dC, C⟩ +
    ⟨dn, n⟩ for the state leaving each chunk (bnd [B·H, NT, K tiles · V tiles]): the exact
    log-decay gradient at the chunk's end (the next chunk's stored state h, hn, or the final
    state ht, nt after a sequence's last chunk). ``ONE_TILE`` (L ≤ BQ): as in
    :func:`states_fwd_kernel`, the chunk loop innermost; the host asks for it only where the
    walk carries dC alone (no dn, no boundary sums), the case where it measured faster
    (docs/tuning.md)."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, i_n = _walk(co, i_nh, H, NT, VARLEN)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    HK = H // G  # q heads: value head i_h reads q head i_h // G
    p_q = q + (i_b * T * HK + i_h // G) * K
    p_do = do + (i_b * T * H + i_h) * V
    if HAS_DECAY:
        if PER_HEAD:  # the head's constant log decay, loaded once (the rows are formed)
            g = tl.load(g + i_h).to(tl.float32)
        else:
            g += i_bh * T
    b_dC, b_dn = _start_state(dht, dnt, i_st, o_k, o_v, K, V, m_k, m_v, HAS_DHT, HAS_N, BK, BV)
    if HAS_MAX:
        p_mc = mc + i_bh * (NT + NSEQ) + i_n
    for j in range(c_hi - c_lo):
        i_c = c_hi - 1 - j
        c0, c1, _seq_c = _bounds(chunks, i_c, L, T, VARLEN)
        tl.store(
            dh + (i_bh * NT + i_c) * K * V + o_k[:, None] * V + o_v[None, :],
            b_dC.to(dh.dtype.element_ty), mask=m_k[:, None] & m_v[None, :],
        )  # fmt: skip
        if HAS_N:
            tl.store(dhn + (i_bh * NT + i_c) * K + o_k, b_dn, mask=m_k & ((o_k * 0 + i_v) == 0))
        if HAS_BND:
            # (chunk states in the inputs' dtype, the final state fp32: one load per branch)
            if i_c + 1 < c_hi:
                p_nx = h + (i_bh * NT + i_c + 1) * K * V
                b_nx = _state_tile(p_nx, o_k, o_v, V, 1, m_k, m_v).to(tl.float32)
                if HAS_N:
                    p_nn = hn + (i_bh * NT + i_c + 1) * K
            else:
                b_nx = _state_tile(ht + i_st * K * V, o_k, o_v, V, 1, m_k, m_v)
                if HAS_N:
                    p_nn = nt + i_st * K
            b_bnd = tl.sum(tl.sum(b_dC * b_nx, 1), 0)
            if HAS_N:
                b_bnd += tl.where(i_v == 0, tl.sum(b_dn * _vec(p_nn, o_k, m_k), 0), 0.0)
            n_tiles = tl.num_programs(0) * tl.num_programs(1)
            tl.store(bnd + (i_bh * NT + i_c) * n_tiles + i_k * tl.num_programs(1) + i_v, b_bnd)
        b_last = _cum_last(g, c0, c1, PER_HEAD) if HAS_DECAY else 0.0
        if HAS_MAX:
            m_c = tl.load(p_mc + i_c)
            decay = tl.exp(b_last + m_c - tl.load(p_mc + i_c + 1))
        elif HAS_DECAY:
            m_c = 0.0
            decay = tl.exp(b_last)
        else:
            m_c = 0.0
            decay = 1.0
        b_dC *= decay
        b_dn *= decay
        if ONE_TILE:
            b_dC, b_dn = _add_rows(b_dC, b_dn, p_q, p_do, g, m_row, ra, rd, i_bh * T,
                                   c0 + tl.arange(0, BQ), c0, c1, o_k, o_v, m_k, m_v, HK * K,
                                   H * V, m_c, scale, HAS_DECAY, HAS_MAX, HAS_N, HAS_NORM,
                                   DOT_PREC, PER_HEAD)  # fmt: skip
        else:
            for r0 in range(c0, c1, BQ):
                b_dC, b_dn = _add_rows(b_dC, b_dn, p_q, p_do, g, m_row, ra, rd, i_bh * T,
                                       r0 + tl.arange(0, BQ), c0, c1, o_k, o_v, m_k, m_v,
                                       HK * K, H * V, m_c, scale, HAS_DECAY, HAS_MAX, HAS_N,
                                       HAS_NORM, DOT_PREC, PER_HEAD)  # fmt: skip
    tl.store(
        dh0 + i_st * K * V + o_k[:, None] * V + o_v[None, :], b_dC,
        mask=m_k[:, None] & m_v[None, :],
    )  # fmt: skip
    if HAS_N:
        tl.store(dn0 + i_st * K + o_k, b_dn, mask=m_k & ((o_k * 0 + i_v) == 0))
