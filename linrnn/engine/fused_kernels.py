"""Triton kernels of the non-materializing chunk mode (``mode="fused_chunk"``, docs/DESIGN.md §3):
one program walks all chunks of a sequence with its slice of the state in registers, so no chunk
state ever reaches HBM (memory O(B·H·K·V) for the state instead of O(T/L · B·H·K·V)). The price
is less parallelism: N·H × (V or K tiles) programs. The chunk is one tile (L ≤ 128).

Same math and notation as scalar_kernels (b the chunk-local cumulative log decay, a the log input
gate, m the max state; every exponent ≤ 0, docs/DESIGN.md §6.1, §6.3). Each kernel keeps one
dimension whole so that every product it needs reduces over a dimension it holds entirely:

* ``fused_fwd_kernel``  grid (V tiles, N·H), state C[K, BV]: outputs, final state.
* ``fused_dq_kernel``   grid (K tiles, N·H), state C[BK, V], walking forward: dq.
* ``fused_dk_kernel``   grid (K tiles, N·H), dC[BK, V], walking backward: dk, dS_0, dn_0.
* ``fused_dv_kernel``   grid (V tiles, N·H), dC[K, BV], walking backward: dv.

The per-row values of the forward (normalizer denominator, row max m_r) and the max state at
chunk boundaries (NT + NSEQ scalars per row) are saved; they are O(T), not O(T·K·V).

Gate kinds. Scalar gates pass g, gi (the rows of b and a, ``[B·H, T]`` fp32) and the tables of
the max state and the normalizer; per-channel gates (``VEC``: gk given) pass the chunk-local
cumulative sums gk, gkx ``[B, T, H, K]`` (G^K, and G^X on the query side), gv ``[B, T, H, V]``
(``VEC_V``: gv given) and RWKV6's bonus u ``[H, K]`` (``EXCL``). The other kind's arguments keep
their defaults (None, False). Optional tensors are None with a ``HAS_*`` flag the host derives
from them, as in scalar_kernels: ``HAS_DECAY`` (g), ``HAS_IGATE`` (gi), ``HAS_MAX`` (mc, m_row,
cmax), ``HAS_N`` (the normalizer state), ``HAS_NORM`` (the row factors ra, rd),
``HAS_H0`` / ``HAS_DHT`` (initial state, final state's gradient); ``NORM`` is the normalizer's
kind; ``PER_HEAD``: g is the per-head log decay [H] (retention's), from which the kernels form
b instead of loading its rows (scalar_kernels' form). Scalar gates may group the q/k heads
(Mamba2's B, C): G value heads per q/k head, q and k ``[B, T, H/G, K]``, value head h reads
q/k head h // G; dq and dk are written per value head (the host sums each group).
Per-channel gates keep G = 1.

With ``VEC`` each walk steps through its chunk in sub-chunks of BC rows with the secondary
chunking of vector_common (the state stays whole in registers). The diagonal sub-chunk is walked
over its key rows, unrolled with gv (``BLOCK_DIAG``: the interpreter's block form), in the fast
form where its gates span less than ``DIAG_SPAN`` (0: nowhere; bf16 inputs only, §6.4). The gate
gradients' parts (q ⊙ dq, k ⊙ dk, o ⊙ do − v ⊙ dv) take their inter-chunk operands rounded as the
state updates round them, so cross-chunk pairs cancel exactly in their sums (§6.5).
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import (
    _bounds,
    _cum,
    _cum_last,
    _dot_n,
    _inv_denominator,
    _log_weights,
    _nan_rows,
    _start_state,
    _tile,
    _tile_t,
    _vec,
    _walk,
)
from linrnn.engine.vector_common import (
    _ld_row,
    _vec_cols_off,
    _vec_diag,
    _vec_rows_off,
    _vec_scale_rows,
    _vec_state_bwd,
    _vec_state_fwd,
    _vec_to_end,
    _xp,
)


@triton.jit
def _program(co, T, H, NT, VARLEN: tl.constexpr):
    """A walking program's place (grid axis 1: N·H walks): the row i_bh of the gates and chunk
    tables, its batch i_b and head i_h, base = i_b·T·H + i_h (the first token's row of the
    ``[B, T, H, ·]`` tensors), the state index i_st, the first and end chunk and the sequence."""
    i_nh = tl.program_id(1).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, i_n = _walk(co, i_nh, H, NT, VARLEN)
    i_b, i_h = i_bh // H, i_bh % H
    return i_bh, i_b, i_h, i_b * T * H + i_h, i_st, c_lo, c_hi, i_n


@triton.jit
def _qk_rows(i_b, i_h, T, H, G):
    """Grouped q/k heads: the first token's row of q, k ``[B, T, H / G, K]`` for value head
    i_h (it reads q/k head i_h // G), and their head count H / G (a row holds H / G · K)."""
    HK = H // G
    return i_b * T * HK + i_h // G, HK


@triton.jit
def _dot_state(a, b_f32, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr):
    """a @ b for an fp32 state b and 16-bit a. SPLIT: b as b_hi + b_lo, both in a's dtype (two
    products), so the state keeps about twice the mantissa. The gate gradients need it: their
    terms q·dq and k·dk largely cancel, and in this mode they are summed over whole sequences,
    where the state's rounding to 16 bits would otherwise dominate their error."""
    b_hi = b_f32.to(a.dtype)
    out = tl.dot(a, b_hi, input_precision=DOT_PREC)
    if SPLIT:
        out += tl.dot(a, (b_f32 - b_hi.to(tl.float32)).to(a.dtype), input_precision=DOT_PREC)
    return out


@triton.jit
def _store_total(tot, b_tot, i_b, i_c, i_h, NT, H, D, o_d, m_d):
    """One chunk's total of a gate gradient's inter-chunk terms, tot [B, NT, H, D] fp32.

    A per-channel gate gradient is a reverse sum over the sequence of per-step terms
    (q⊙dq − k⊙dk, o⊙do − v⊙dv). Each pair of steps in one chunk enters it twice, with opposite
    signs, and cancels only up to rounding, so a whole-sequence sum piles those roundings up
    (~√T). The sum therefore restarts at each chunk end from the tail after it, which is the
    sum over later chunks of the inter-chunk terms alone (their cross-chunk pairs cancel
    exactly: rounding-matched operands, hi + lo states): the vector host's _revsum."""
    p = tot + ((i_b * NT + i_c) * H + i_h) * D + o_d
    tl.store(p, b_tot, mask=m_d)


@triton.jit
def _gates(g, gi, row, o_t, m_t, c0, c1, BT: tl.constexpr, HAS_DECAY: tl.constexpr,
           HAS_IGATE: tl.constexpr, PER_HEAD: tl.constexpr):  # fmt: skip
    """The chunk's b (per row), a (per row) and b_L (its total log decay), from row ``row`` of
    g and gi; ``PER_HEAD``: g is the head's constant log decay (a value), b is formed."""
    if HAS_DECAY:
        if PER_HEAD:
            g_row = g
        else:
            g_row = g + row
        b_b = _cum(g_row, o_t, m_t, c0, PER_HEAD)
        b_last = _cum_last(g_row, c0, c1, PER_HEAD)
    else:
        b_b = tl.zeros([BT], dtype=tl.float32)
        b_last = 0.0
    b_a = _vec(gi + row, o_t, m_t) if HAS_IGATE else tl.zeros([BT], dtype=tl.float32)
    return b_b, b_a, b_last


@triton.jit
def _head_weights(g, BT: tl.constexpr):
    """``PER_HEAD``: the intra-chunk weights exp((r − s)·g) for r ≥ s (0 above) of the head's
    constant log decay g. They depend on r − s alone, so a walk forms them once for all its
    chunks (each step then only masks them) instead of a [BT, BT] exp per chunk."""
    o = tl.arange(0, BT)
    lw = (o[:, None] - o[None, :]).to(tl.float32) * g
    return tl.exp(tl.where(o[:, None] >= o[None, :], lw, float("-inf")))


@triton.jit
def _intra_weights(w_head, b_b, b_a, b_mr, causal, HAS_DECAY: tl.constexpr,
                   HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
                   PER_HEAD: tl.constexpr):  # fmt: skip
    """The chunk's intra-chunk weights D_rs on the causal mask: ``w_head`` (:func:`_head_weights`)
    masked with ``PER_HEAD``, else formed from the gates (triton_common._log_weights)."""
    if PER_HEAD:
        return tl.where(causal, w_head, 0.0)
    else:
        return _log_weights(b_b, b_b, b_a, b_mr, causal, HAS_DECAY, HAS_IGATE, HAS_MAX)


@triton.jit
def _key_weights(b_b, b_a, b_last, m_next, m_t, HAS_DECAY: tl.constexpr, HAS_MAX: tl.constexpr):
    """w_s = exp(b_L − b_s + a_s − m_next): each step's weight in the state leaving the chunk."""
    lw = b_a - b_b
    if HAS_DECAY:
        lw += b_last
    if HAS_MAX:
        lw -= m_next
    return tl.exp(tl.where(m_t, lw, float("-inf")))


@triton.jit
def _chunk_gates_bwd(g, gi, mc, m_row, i_bh, i_mc, T, c0, c1, o_t, m_t, BT: tl.constexpr,
                     HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, HAS_MAX: tl.constexpr,
                     PER_HEAD: tl.constexpr):  # fmt: skip
    """A backward walk's gates of the chunk [c0, c1) (rows o_t): b, a, the row max m_r, the
    log of the inter-chunk row factor b_r + m_c − m_r, the chunk's state decay
    exp(b_L + m_c − m_c+1) and the key weights w (:func:`_key_weights`). The max states m_c,
    m_c+1 sit at slots i_mc, i_mc + 1 of mc; the chunk's row maxima at m_row[i_bh, c0:]."""
    b_b, b_a, b_last = _gates(g, gi, i_bh * T, o_t, m_t, c0, c1, BT, HAS_DECAY, HAS_IGATE,
                              PER_HEAD)  # fmt: skip
    if HAS_MAX:
        m_c = tl.load(mc + i_mc)
        m_next = tl.load(mc + i_mc + 1)
        b_mr = _vec(m_row + i_bh * T + c0, tl.arange(0, BT), m_t)
        lf = b_b + m_c - b_mr
        decay = tl.exp(b_last + m_c - m_next)
    else:
        m_next = 0.0
        b_mr = tl.zeros([BT], dtype=tl.float32)
        lf = b_b
        decay = tl.exp(b_last) if HAS_DECAY else 1.0
    w = _key_weights(b_b, b_a, b_last, m_next, m_t, HAS_DECAY, HAS_MAX)
    return b_b, b_a, b_mr, lf, decay, w


@triton.jit
def _state_grad_step(b_dC, b_dn, b_qt, b_do, f, fd, decay, HAS_N: tl.constexpr,
                     DOT_PREC: tl.constexpr):  # fmt: skip
    """dC_c = decay·dC_c+1 + Σ_r f_r q_r do_rᵀ (and dn with the normalizer's row factors fd)."""
    b_dC = b_dC * decay + tl.dot((b_qt * f[None, :]).to(b_do.dtype), b_do, input_precision=DOT_PREC)
    if HAS_N:
        b_dn = b_dn * decay + tl.sum(b_qt * fd[None, :], 1)
    return b_dC, b_dn


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def fused_fwd_kernel(
    q, k, v, o, h0, ht, co, chunks,
    T, H, K, V, L, NT, NSEQ, scale,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
    DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
    # scalar gates (G: value heads per q/k head)
    G=1,
    g=None, gi=None, cmax=None, n0=None, m0=None, nt=None, mc=None, m_row=None, den=None,
    eps=0.0,
    HAS_DECAY: tl.constexpr = False, HAS_IGATE: tl.constexpr = False,
    PER_HEAD: tl.constexpr = False,
    HAS_MAX: tl.constexpr = False, HAS_N: tl.constexpr = False, NORM: tl.constexpr = 0,
    # per-channel gates
    gk=None, gkx=None, gv=None, u=None, o_in=None, o_x=None,
    VEC: tl.constexpr = False, VEC_V: tl.constexpr = False, EXCL: tl.constexpr = False,
    BLOCK_DIAG: tl.constexpr = False, DIAG_SPAN: tl.constexpr = 0.0,
    BC: tl.constexpr = 16, BD: tl.constexpr = 32, SPLIT: tl.constexpr = False,
):  # fmt: skip
    """Grid (V tiles, N·H): o [B, T, H, V] and the final state (ht [N, H, K, V], nt [N, H, K],
    the last slot of each sequence in mc) from the initial one (h0, n0, m0).

        o_r = scale·[e_r q_r C_c + Σ_{s≤r} D_rs (q_r·k_s) v_s] / denominator,

    storing den, m_row [B·H, T] (the normalizer's den and the row max m_r) and the max state
    entering each chunk into mc [B·H, NT + NSEQ]; cmax [B·H, NT]: each chunk's max over s of
    (a_s − b_s). ``VEC_V``: also o's intra- and inter-chunk parts, fp32 and unscaled by
    exp(G^V_r), into o_in and o_x (for gv's gradient, :func:`fused_dv_kernel`)."""
    i_v = tl.program_id(0)
    i_bh, i_b, i_h, base, i_st, c_lo, c_hi, i_n = _program(co, T, H, NT, VARLEN)
    w_head = 0.0
    if PER_HEAD:  # the head's constant log decay, loaded once (b and the weights are formed)
        g = tl.load(g + i_h).to(tl.float32)
        w_head = _head_weights(g, BT)
    o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    qk, HK = _qk_rows(i_b, i_h, T, H, G)
    p_q, p_k = q + qk * K, k + qk * K
    p_v, p_o = v + base * V, o + base * V
    b_C, b_n = _start_state(h0, n0, i_st, o_k, o_v, K, V, m_k, m_v, HAS_H0, HAS_N, BK, BV)
    if HAS_MAX and HAS_H0:
        b_m = tl.load(m0 + i_st).to(tl.float32)
    else:  # m_0 = −∞ (no state yet), as a tensor so the loop carries one type
        b_m = tl.max(tl.full([2], float("-inf"), tl.float32), 0)
    first = i_v == 0
    for i_c in range(c_lo, c_hi):
        c0, c1, _seq_c = _bounds(chunks, i_c, L, T, VARLEN)
        if VEC:  # per-channel decays: sub-chunks of BC steps (vector_common)
            p_gk, p_gkx = gk + base * K, gkx + base * K
            p_gv = gv + base * V if VEC_V else None
            p_u = u + i_h * K if EXCL else None
            for r0 in range(c0, c1, BC):
                o_r = r0 + tl.arange(0, BC)
                m_r = o_r < c1
                b_q = _vec_scale_rows(
                    _tile(p_q, o_r, o_k, H * K, m_r, m_k), p_gkx, o_r, m_r, o_k, m_k, H * K
                )  # [BC, BK]
                b_x = _dot_state(b_q, b_C, SPLIT, DOT_PREC)  # the inter-chunk part [BC, BV]
                b_in = _vec_diag(
                    p_q, p_k, p_v, p_gkx, p_gk, p_gv, p_gv, p_u, o_r, m_r, o_v, m_v, K, H * K,
                    H * V, BC, BD, False, True, VEC_V, EXCL, DOT_PREC, BLOCK_DIAG, VEC_V, True,
                    False, DIAG_SPAN,
                )  # fmt: skip
                b_in += _vec_rows_off(
                    p_q, p_k, p_v, p_gkx, p_gk, p_gv, p_gv, o_r, m_r, r0, c0, o_v, m_v, K, H * K,
                    H * V, BC, BT, BD, BV, True, VEC_V, DOT_PREC,
                )  # fmt: skip
                if VEC_V:
                    b_o = scale * (_vec_scale_rows(b_x, p_gv, o_r, m_r, o_v, m_v, H * V) + b_in)
                else:
                    b_o = scale * (b_x + b_in)
                p = o_r.to(tl.int64)[:, None] * H * V + o_v[None, :]
                m_rv = m_r[:, None] & m_v[None, :]
                tl.store(p_o + p, b_o.to(o.dtype.element_ty), mask=m_rv)
                if VEC_V:
                    tl.store(o_in + base * V + p, scale * b_in, mask=m_rv)
                    tl.store(o_x + base * V + p, scale * b_x, mask=m_rv)
            b_C = _vec_state_fwd(
                b_C, p_k, p_v, p_gk, p_gv, c0, c1, o_k, m_k, o_v, m_v, K, V, H, BT, VEC_V, DOT_PREC
            )
        else:
            o_t = c0 + tl.arange(0, BT)
            m_t = o_t < c1
            b_q = _tile(p_q, o_t, o_k, HK * K, m_t, m_k)  # [BT, BK]
            b_kt = _tile_t(p_k, o_t, o_k, HK * K, m_t, m_k)  # [BK, BT]
            # One v tile, cleaned, for both products (the diagonal one and the state update), and
            # loaded here, before the first product: loaded after it (or a second copy beside it)
            # the kernel read shared memory out of bounds or computed garbage on sm_90 with
            # Triton 3.6 at 16-bit K = V = 256 (DESIGN §6.1). A later step's NaN v reaches no
            # earlier row: the rows at or after it become NaN below, its state columns too.
            b_v = _tile(p_v, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
            fin = tl.abs(b_v.to(tl.float32)) < float("inf")  # false for NaN and ±inf
            b_v = tl.where(fin, b_v, 0.0).to(b_v.dtype)
            b_b, b_a, b_last = _gates(g, gi, i_bh * T, o_t, m_t, c0, c1, BT, HAS_DECAY,
                                      HAS_IGATE, PER_HEAD)  # fmt: skip
            causal = (o_t[:, None] >= o_t[None, :]) & m_t[:, None]
            b_mr = tl.zeros([BT], dtype=tl.float32)
            if HAS_MAX:
                tl.store(mc + i_bh * (NT + NSEQ) + i_n + i_c, b_m, mask=first)
                z = tl.where(causal, b_b[:, None] - b_b[None, :] + b_a[None, :], float("-inf"))
                b_mr = tl.where(m_t, tl.maximum(b_b + b_m, tl.max(z, 1)), 0.0)
                e_r = tl.exp(b_b + b_m - b_mr)
            else:
                e_r = tl.exp(b_b)
            b_o = tl.dot(b_q, b_C.to(b_q.dtype), input_precision=DOT_PREC) * e_r[:, None]
            b_p = tl.dot(b_q, b_kt, input_precision=DOT_PREC)
            w_d = _intra_weights(w_head, b_b, b_a, b_mr, causal, HAS_DECAY, HAS_IGATE, HAS_MAX,
                                 PER_HEAD)  # fmt: skip
            b_p = tl.where(causal, b_p * w_d, 0.0)  # not b_p·w_d: a later key's NaN score times 0
            b_o += tl.dot(b_p.to(b_v.dtype), b_v, input_precision=DOT_PREC)
            b_o = _nan_rows(b_o, fin, causal)
            b_o *= scale
            if NORM != 0:
                b_den = _dot_n(b_q, b_n, DOT_PREC) * e_r + tl.sum(b_p, 1)
                b_den *= scale
                b_o = b_o * _inv_denominator(b_den, b_mr, eps, NORM)[0][:, None]
                tl.store(den + i_bh * T + o_t, b_den, mask=m_t & ((o_t * 0 + i_v) == 0))
            if HAS_MAX:
                tl.store(m_row + i_bh * T + o_t, b_mr, mask=m_t & ((o_t * 0 + i_v) == 0))
            p = p_o + o_t.to(tl.int64)[:, None] * H * V + o_v[None, :]
            tl.store(p, b_o.to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])

            # The state leaving the chunk, NaN in the columns where some step's v is not finite.
            if HAS_MAX:
                m_next = b_last + tl.maximum(b_m, tl.load(cmax + i_bh * NT + i_c))
                decay = tl.exp(b_last + b_m - m_next)
            else:
                m_next = 0.0
                decay = tl.exp(b_last) if HAS_DECAY else 1.0
            w = _key_weights(b_b, b_a, b_last, m_next, m_t, HAS_DECAY, HAS_MAX)
            b_kw = b_kt.to(tl.float32) * w[None, :]
            b_C = b_C * decay + tl.dot(b_kw.to(b_v.dtype), b_v, input_precision=DOT_PREC)
            bad_v = tl.max(tl.where(fin, 0, 1), 0)  # [BV]: a step's v is not finite there
            b_C = tl.where(bad_v[None, :] > 0, float("nan"), b_C)
            if HAS_N:
                b_n = b_n * decay + tl.sum(b_kw, 1)
            if HAS_MAX:
                b_m = m_next
    p = ht + i_st * K * V + o_k[:, None] * V + o_v[None, :]
    tl.store(p, b_C, mask=m_k[:, None] & m_v[None, :])
    if HAS_N:
        tl.store(nt + i_st * K + o_k, b_n, mask=m_k & ((o_k * 0 + i_v) == 0))
    if HAS_MAX:
        tl.store(mc + i_bh * (NT + NSEQ) + i_n + c_hi, b_m, mask=first)


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def fused_dq_kernel(
    q, k, v, do, dq, h0, qdq, co, chunks,
    T, H, K, V, L, NT, NSEQ, scale,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
    DOT_PREC: tl.constexpr, VARLEN: tl.constexpr, SPLIT: tl.constexpr,
    # scalar gates (G: value heads per q/k head)
    G=1,
    g=None, gi=None, n0=None, mc=None, m_row=None, ra=None, rd=None,
    HAS_DECAY: tl.constexpr = False, HAS_IGATE: tl.constexpr = False,
    PER_HEAD: tl.constexpr = False,
    HAS_MAX: tl.constexpr = False, HAS_N: tl.constexpr = False, HAS_NORM: tl.constexpr = False,
    STORE_QDQ: tl.constexpr = False,
    # per-channel gates
    gk=None, gkx=None, gv=None, u=None, tot=None,
    VEC: tl.constexpr = False, VEC_V: tl.constexpr = False, EXCL: tl.constexpr = False,
    BLOCK_DIAG: tl.constexpr = False, DIAG_SPAN: tl.constexpr = 0.0,
    BC: tl.constexpr = 16, BD: tl.constexpr = 32,
):  # fmt: skip
    """Grid (K tiles, N·H), walking forward with the state rebuilt from h0 (n0):

        dq_r = scale·[e_r (A_r do_r Cᵀ + dd_r n) + Σ_{s≤r} D_rs (A_r do_r·v_s + dd_r) k_s]

    (A = ra, dd = rd: the normalizer's row factors). qdq: q·dq for the decay gradient, per K
    tile as row sums [nK, B·H, T] (scalar gates, ``STORE_QDQ``) or q ⊙ dq [B, T, H, K] fp32
    (``VEC``, with each chunk's inter-chunk total in tot [B, NT, H, K])."""
    i_k = tl.program_id(0)
    i_bh, i_b, i_h, base, i_st, c_lo, c_hi, i_n = _program(co, T, H, NT, VARLEN)
    w_head = 0.0
    if PER_HEAD:  # the head's constant log decay, loaded once (b and the weights are formed)
        g = tl.load(g + i_h).to(tl.float32)
        w_head = _head_weights(g, BT)
    o_k, o_v = i_k * BK + tl.arange(0, BK), tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    qk, HK = _qk_rows(i_b, i_h, T, H, G)
    p_q, p_k = q + qk * K, k + qk * K
    p_v, p_do = v + base * V, do + base * V
    b_C, b_n = _start_state(h0, n0, i_st, o_k, o_v, K, V, m_k, m_v, HAS_H0, HAS_N, BK, BV)
    for i_c in range(c_lo, c_hi):
        c0, c1, _seq_c = _bounds(chunks, i_c, L, T, VARLEN)
        if VEC:  # per-channel decays: sub-chunks of BC steps (vector_common)
            p_gk, p_gkx = gk + base * K, gkx + base * K
            p_gv = gv + base * V if VEC_V else None
            p_u = u + i_h * K if EXCL else None
            b_tot = tl.zeros([BK], dtype=tl.float32)
            for r0 in range(c0, c1, BC):
                o_r = r0 + tl.arange(0, BC)
                m_r = o_r < c1
                b_do = _tile(p_do, o_r, o_v, H * V, m_r, m_v)  # [BC, BV]
                if VEC_V:
                    b_do = _vec_scale_rows(b_do, p_gv, o_r, m_r, o_v, m_v, H * V)
                b_x = _dot_state(b_do, tl.trans(b_C), SPLIT, DOT_PREC)  # do_r Cᵀ [BC, BK]
                m_rk = m_r[:, None] & m_k[None, :]
                f = _xp(_tile(p_gkx, o_r, o_k, H * K, m_r, m_k), m_rk)  # exp(G^X_r) [BC, BK]
                b_dq = _vec_diag(
                    p_do, p_v, p_k, p_gv, p_gv, p_gkx, p_gk, p_u, o_r, m_r, o_k, m_k, V, H * V,
                    H * K, BC, BD, False, VEC_V, True, EXCL, DOT_PREC, BLOCK_DIAG, VEC_V, False,
                    False, DIAG_SPAN,
                )  # fmt: skip
                b_dq += _vec_rows_off(
                    p_do, p_v, p_k, p_gv, p_gv, p_gkx, p_gk, o_r, m_r, r0, c0, o_k, m_k, V, H * V,
                    H * K, BC, BT, BD, BK, VEC_V, True, DOT_PREC,
                )  # fmt: skip
                b_dq *= scale
                b_x *= scale
                p = base * K + o_r.to(tl.int64)[:, None] * H * K + o_k[None, :]
                b_q = _tile(p_q, o_r, o_k, H * K, m_r, m_k).to(tl.float32)
                # q ⊙ dq, its inter-chunk part with q_r·exp(G^X_r) rounded as fused_dk_kernel
                # rounds it into dC (so cross-chunk pairs cancel against k ⊙ dk there).
                b_qf = (b_q * f).to(q.dtype.element_ty).to(tl.float32)
                tl.store(qdq + p, b_qf * b_x + b_q * b_dq, mask=m_rk)
                b_tot += tl.sum(b_qf * b_x, 0)
                b_dq += b_x * f
                tl.store(dq + p, b_dq.to(dq.dtype.element_ty), mask=m_rk)
            _store_total(tot, b_tot, i_b, i_c, i_h, NT, H, K, o_k, m_k)
            b_C = _vec_state_fwd(
                b_C, p_k, p_v, p_gk, p_gv, c0, c1, o_k, m_k, o_v, m_v, K, V, H, BT, VEC_V, DOT_PREC
            )
        else:
            o_t = c0 + tl.arange(0, BT)
            m_t = o_t < c1
            b_k = _tile(p_k, o_t, o_k, HK * K, m_t, m_k)  # [BT, BK]
            b_v = _tile(p_v, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
            b_do = _tile(p_do, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
            b_b, b_a, b_mr, lf, decay, w = _chunk_gates_bwd(
                g, gi, mc, m_row, i_bh, i_bh * (NT + NSEQ) + i_n + i_c, T, c0, c1, o_t, m_t, BT,
                HAS_DECAY, HAS_IGATE, HAS_MAX, PER_HEAD,
            )  # fmt: skip
            causal = (o_t[:, None] >= o_t[None, :]) & m_t[:, None]
            e_r = tl.exp(tl.where(m_t, lf, float("-inf")))
            b_x = _dot_state(b_do, tl.trans(b_C), SPLIT, DOT_PREC)  # do_r Cᵀ [BT, BK]
            f = scale * e_r  # the inter-chunk row factor, as in fused_dk_kernel's dC update
            b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)  # [BT, BT]
            if HAS_NORM:
                b_A = _vec(ra + i_bh * T, o_t, m_t)
                b_dd = _vec(rd + i_bh * T, o_t, m_t)
                f = f * b_A
                b_dp = b_dp * b_A[:, None] + b_dd[:, None]
            b_dp *= _intra_weights(w_head, b_b, b_a, b_mr, causal, HAS_DECAY, HAS_IGATE, HAS_MAX,
                                   PER_HEAD)  # fmt: skip
            b_dq = scale * tl.dot(b_dp.to(b_k.dtype), b_k, input_precision=DOT_PREC)
            if HAS_NORM:
                b_dq += (scale * e_r * b_dd)[:, None] * b_n[None, :]
            if STORE_QDQ:
                # q·dq for the log-decay gradient. Its inter-chunk part takes q_r f_r rounded
                # as fused_dk_kernel rounds it into dC (and C holds k_s w_s rounded as that
                # kernel's k·dk takes it), so each cross-chunk pair enters q·dq and k·dk with
                # the same value and cancels exactly in the whole-sequence sum instead of
                # leaving its rounding there.
                b_q = _tile(p_q, o_t, o_k, HK * K, m_t, m_k).to(tl.float32)
                b_qf = (b_q * f[:, None]).to(q.dtype.element_ty).to(tl.float32)
                part = tl.sum(b_qf * b_x, 1) + tl.sum(b_q * b_dq, 1)
                p_pt = qdq + (i_k * (tl.num_programs(1) // NSEQ) + i_bh) * T
                tl.store(p_pt + o_t, part, mask=m_t)
            b_dq += b_x * f[:, None]
            p = dq + base * K + o_t.to(tl.int64)[:, None] * H * K + o_k[None, :]
            tl.store(p, b_dq.to(dq.dtype.element_ty), mask=m_t[:, None] & m_k[None, :])
            b_kw = tl.trans(b_k.to(tl.float32) * w[:, None])  # [BK, BT]
            b_C = b_C * decay + tl.dot(b_kw.to(b_v.dtype), b_v, input_precision=DOT_PREC)
            if HAS_N:
                b_n = b_n * decay + tl.sum(b_kw, 1)


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def fused_dk_kernel(
    q, k, v, do, dk, dh0, dht, kdk, co, chunks,
    T, H, K, V, L, NT, NSEQ, scale,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_DHT: tl.constexpr,
    DOT_PREC: tl.constexpr, VARLEN: tl.constexpr, SPLIT: tl.constexpr,
    # scalar gates (G: value heads per q/k head)
    G=1,
    g=None, gi=None, dn0=None, dnt=None, mc=None, m_row=None, ra=None, rd=None,
    HAS_DECAY: tl.constexpr = False, HAS_IGATE: tl.constexpr = False,
    PER_HEAD: tl.constexpr = False,
    HAS_MAX: tl.constexpr = False, HAS_N: tl.constexpr = False, HAS_NORM: tl.constexpr = False,
    STORE_KDK: tl.constexpr = False,
    # per-channel gates
    gk=None, gkx=None, gv=None, u=None, tot=None,
    VEC: tl.constexpr = False, VEC_V: tl.constexpr = False, EXCL: tl.constexpr = False,
    BLOCK_DIAG: tl.constexpr = False, DIAG_SPAN: tl.constexpr = 0.0,
    BC: tl.constexpr = 16, BD: tl.constexpr = 32,
):  # fmt: skip
    """Grid (K tiles, N·H), walking backward from the final state's gradient (dht, dnt):

        dk_s = w_s (v_s dCᵀ + dn) + scale·Σ_{r≥s} D_rs (A_r v_s·do_r + dd_r) q_r,

    and the initial state's gradient into dh0 [N, H, K, V], dn0 [N, H, K]. kdk: k·dk for the
    gate gradients, per K tile as row sums [nK, B·H, T] (scalar gates, ``STORE_KDK``) or
    k ⊙ dk [B, T, H, K] fp32 (``VEC``, with the chunk totals in tot)."""
    i_k = tl.program_id(0)
    i_bh, i_b, i_h, base, i_st, c_lo, c_hi, i_n = _program(co, T, H, NT, VARLEN)
    w_head = 0.0
    if PER_HEAD:  # the head's constant log decay, loaded once (b and the weights are formed)
        g = tl.load(g + i_h).to(tl.float32)
        w_head = _head_weights(g, BT)
    o_k, o_v = i_k * BK + tl.arange(0, BK), tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    qk, HK = _qk_rows(i_b, i_h, T, H, G)
    p_q, p_k = q + qk * K, k + qk * K
    p_v, p_do = v + base * V, do + base * V
    b_dC, b_dn = _start_state(dht, dnt, i_st, o_k, o_v, K, V, m_k, m_v, HAS_DHT, HAS_N, BK, BV)
    for j in range(c_hi - c_lo):
        i_c = c_hi - 1 - j
        c0, c1, _seq_c = _bounds(chunks, i_c, L, T, VARLEN)
        if VEC:  # per-channel decays: sub-chunks of BC steps (vector_common)
            p_gk, p_gkx = gk + base * K, gkx + base * K
            p_gv = gv + base * V if VEC_V else None
            p_u = u + i_h * K if EXCL else None
            b_tot = tl.zeros([BK], dtype=tl.float32)
            for s0 in range(c0, c1, BC):
                o_s = s0 + tl.arange(0, BC)
                m_s = o_s < c1
                b_v = _tile(p_v, o_s, o_v, H * V, m_s, m_v)  # [BC, BV]
                if VEC_V:
                    b_v = _vec_to_end(b_v, p_gv, o_s, m_s, o_v, m_v, H * V, c1)
                b_y = _dot_state(b_v, tl.trans(b_dC), SPLIT, DOT_PREC)  # v_s dCᵀ [BC, BK]
                m_sk = m_s[:, None] & m_k[None, :]
                g_last = _ld_row(p_gk, c1 - 1, o_k, H * K, m_k)
                w = _xp(g_last[None, :] - _tile(p_gk, o_s, o_k, H * K, m_s, m_k), m_sk)  # [BC, BK]
                b_in = _vec_diag(
                    p_v, p_do, p_q, p_gv, p_gv, p_gkx, p_gk, p_u, o_s, m_s, o_k, m_k, V, H * V,
                    H * K, BC, BD, True, VEC_V, True, EXCL, DOT_PREC, BLOCK_DIAG, VEC_V, False,
                    False, DIAG_SPAN,
                )  # fmt: skip
                b_in += _vec_cols_off(
                    p_v, p_do, p_q, p_gv, p_gv, p_gkx, p_gk, o_s, m_s, tl.minimum(s0 + BC, c1),
                    c1, o_k, m_k, V, H * V, H * K, BC, BT, BD, BK, VEC_V, True, DOT_PREC,
                )  # fmt: skip
                b_in *= scale
                p = base * K + o_s.to(tl.int64)[:, None] * H * K + o_k[None, :]
                b_k = _tile(p_k, o_s, o_k, H * K, m_s, m_k).to(tl.float32)
                # k ⊙ dk, its inter-chunk part with k_s·exp(G_L − G_s) rounded as
                # fused_dq_kernel rounds it into C (see q ⊙ dq there).
                b_kw = (b_k * w).to(k.dtype.element_ty).to(tl.float32)
                tl.store(kdk + p, b_kw * b_y + b_k * b_in, mask=m_sk)
                b_tot += tl.sum(b_kw * b_y, 0)
                b_dk = b_y * w + b_in
                tl.store(dk + p, b_dk.to(dk.dtype.element_ty), mask=m_sk)
            _store_total(tot, b_tot, i_b, i_c, i_h, NT, H, K, o_k, m_k)
            b_dC = _vec_state_bwd(
                b_dC, p_q, p_do, p_gkx, p_gk, p_gv, c0, c1, o_k, m_k, o_v, m_v, K, V, H, scale,
                BT, VEC_V, DOT_PREC,
            )  # fmt: skip
        else:
            o_t = c0 + tl.arange(0, BT)
            m_t = o_t < c1
            b_qt = _tile_t(p_q, o_t, o_k, HK * K, m_t, m_k)  # [BK, BT]
            b_v = _tile(p_v, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
            b_do = _tile(p_do, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
            b_b, b_a, b_mr, lf, decay, w = _chunk_gates_bwd(
                g, gi, mc, m_row, i_bh, i_bh * (NT + NSEQ) + i_n + i_c, T, c0, c1, o_t, m_t, BT,
                HAS_DECAY, HAS_IGATE, HAS_MAX, PER_HEAD,
            )  # fmt: skip
            b_y = _dot_state(b_v, tl.trans(b_dC), SPLIT, DOT_PREC)  # v_s dCᵀ [BT, BK]
            if HAS_N:
                b_dk = w[:, None] * b_dn[None, :]
            else:
                b_dk = tl.zeros([BT, BK], dtype=tl.float32)
            b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=DOT_PREC)  # [BT(s), BT(r)]
            f = scale * tl.exp(tl.where(m_t, lf, float("-inf")))
            fd = tl.zeros([BT], dtype=tl.float32)
            if HAS_NORM:
                b_A = _vec(ra + i_bh * T, o_t, m_t)
                b_dd = _vec(rd + i_bh * T, o_t, m_t)
                b_dpt = b_dpt * b_A[None, :] + b_dd[None, :]
                fd = f * b_dd
                f = f * b_A
            causal = (o_t[:, None] >= o_t[None, :]) & m_t[:, None]
            b_d = _intra_weights(w_head, b_b, b_a, b_mr, causal, HAS_DECAY, HAS_IGATE, HAS_MAX,
                                 PER_HEAD)  # fmt: skip
            b_dpt *= tl.trans(b_d)
            b_dk += scale * tl.dot(b_dpt.to(b_qt.dtype), tl.trans(b_qt), input_precision=DOT_PREC)
            if STORE_KDK:
                # k·dk with the inter-chunk part's k_s w_s rounded as fused_dq_kernel rounds it into
                # C (see the q·dq there).
                b_k = _tile(p_k, o_t, o_k, HK * K, m_t, m_k).to(tl.float32)
                b_kw = (b_k * w[:, None]).to(k.dtype.element_ty).to(tl.float32)
                part = tl.sum(b_kw * b_y, 1) + tl.sum(b_k * b_dk, 1)
                p_pt = kdk + (i_k * (tl.num_programs(1) // NSEQ) + i_bh) * T
                tl.store(p_pt + o_t, part, mask=m_t)
            b_dk += b_y * w[:, None]
            p = dk + base * K + o_t.to(tl.int64)[:, None] * H * K + o_k[None, :]
            tl.store(p, b_dk.to(dk.dtype.element_ty), mask=m_t[:, None] & m_k[None, :])
            b_dC, b_dn = _state_grad_step(
                b_dC, b_dn, b_qt.to(tl.float32), b_do, f, fd, decay, HAS_N, DOT_PREC
            )
    p = dh0 + i_st * K * V + o_k[:, None] * V + o_v[None, :]
    tl.store(p, b_dC, mask=m_k[:, None] & m_v[None, :])
    if HAS_N:
        tl.store(dn0 + i_st * K + o_k, b_dn, mask=m_k)


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def fused_dv_kernel(
    q, k, do, dv, dht, co, chunks,
    T, H, K, V, L, NT, NSEQ, scale,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_DHT: tl.constexpr,
    DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
    # scalar gates (G: value heads per q/k head)
    G=1,
    g=None, gi=None, mc=None, m_row=None, ra=None,
    HAS_DECAY: tl.constexpr = False, HAS_IGATE: tl.constexpr = False,
    PER_HEAD: tl.constexpr = False,
    HAS_MAX: tl.constexpr = False, HAS_NORM: tl.constexpr = False,
    # per-channel gates
    gk=None, gkx=None, gv=None, u=None, v=None, vdv=None, o_in=None, o_x=None, tot=None,
    VEC: tl.constexpr = False, VEC_V: tl.constexpr = False, EXCL: tl.constexpr = False,
    BLOCK_DIAG: tl.constexpr = False, DIAG_SPAN: tl.constexpr = 0.0,
    BC: tl.constexpr = 16, BD: tl.constexpr = 32, SPLIT: tl.constexpr = False,
):  # fmt: skip
    """Grid (V tiles, N·H), walking backward from dht (dv does not see the normalizer state):

        dv_s = w_s k_s dC + scale·Σ_{r≥s} D_rs A_r (k_s·q_r) do_r.

    ``VEC_V``: also o ⊙ do − v ⊙ dv into vdv [B, T, H, V] fp32 (gv's gradient before its
    reverse sum, from v and the forward's o_in, o_x), with the chunk totals in tot."""
    i_v = tl.program_id(0)
    i_bh, i_b, i_h, base, i_st, c_lo, c_hi, i_n = _program(co, T, H, NT, VARLEN)
    w_head = 0.0
    if PER_HEAD:  # the head's constant log decay, loaded once (b and the weights are formed)
        g = tl.load(g + i_h).to(tl.float32)
        w_head = _head_weights(g, BT)
    o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    qk, HK = _qk_rows(i_b, i_h, T, H, G)
    p_q, p_k, p_do = q + qk * K, k + qk * K, do + base * V
    b_dC, b_dn = _start_state(dht, None, i_st, o_k, o_v, K, V, m_k, m_v, HAS_DHT, False, BK, BV)
    for j in range(c_hi - c_lo):
        i_c = c_hi - 1 - j
        c0, c1, _seq_c = _bounds(chunks, i_c, L, T, VARLEN)
        if VEC:  # per-channel decays: sub-chunks of BC steps (vector_common)
            p_gk, p_gkx = gk + base * K, gkx + base * K
            p_gv = gv + base * V if VEC_V else None
            p_u = u + i_h * K if EXCL else None
            b_tot = tl.zeros([BV], dtype=tl.float32)
            for s0 in range(c0, c1, BC):
                o_s = s0 + tl.arange(0, BC)
                m_s = o_s < c1
                b_k = _vec_to_end(
                    _tile(p_k, o_s, o_k, H * K, m_s, m_k), p_gk, o_s, m_s, o_k, m_k, H * K, c1
                )  # [BC, BK]
                b_y = _dot_state(b_k, b_dC, SPLIT, DOT_PREC)  # the inter-chunk part [BC, BV]
                if VEC_V:
                    b_dv = _vec_to_end(b_y, p_gv, o_s, m_s, o_v, m_v, H * V, c1)
                else:
                    b_dv = b_y
                b_in = _vec_diag(
                    p_k, p_q, p_do, p_gkx, p_gk, p_gv, p_gv, p_u, o_s, m_s, o_v, m_v, K, H * K,
                    H * V, BC, BD, True, True, VEC_V, EXCL, DOT_PREC, BLOCK_DIAG, VEC_V, False,
                    False, DIAG_SPAN,
                )  # fmt: skip
                b_in += _vec_cols_off(
                    p_k, p_q, p_do, p_gkx, p_gk, p_gv, p_gv, o_s, m_s, tl.minimum(s0 + BC, c1),
                    c1, o_v, m_v, K, H * K, H * V, BC, BT, BD, BV, True, VEC_V, DOT_PREC,
                )  # fmt: skip
                b_dv += scale * b_in
                m_sv = m_s[:, None] & m_v[None, :]
                p = base * V + o_s.to(tl.int64)[:, None] * H * V + o_v[None, :]
                tl.store(dv + p, b_dv.to(dv.dtype.element_ty), mask=m_sv)
                if VEC_V:
                    # o ⊙ do − v ⊙ dv at these steps, gv's gradient before its reverse sum
                    # (fp32). The cross-chunk pairs (r later than s) enter o_r ⊙ do_r and
                    # v_s ⊙ dv_s; in exact arithmetic they cancel in the whole-sequence sum,
                    # and they still cancel here because each side takes its 16-bit factor
                    # rounded exactly as the other side's state update rounded it:
                    # do_r·exp(G^V_r) as in dC (_vec_state_bwd), v_s·exp(G^V_L − G^V_s) as in
                    # C (_vec_state_fwd); the states themselves are hi + lo (SPLIT).
                    b_vv = _tile(v + base * V, o_s, o_v, H * V, m_s, m_v)
                    b_vt = _vec_to_end(b_vv, p_gv, o_s, m_s, o_v, m_v, H * V, c1)
                    b_do = _tile(p_do, o_s, o_v, H * V, m_s, m_v)
                    b_dot = _vec_scale_rows(b_do, p_gv, o_s, m_s, o_v, m_v, H * V)
                    b_oin = tl.load(o_in + p, mask=m_sv, other=0.0)
                    b_ox = tl.load(o_x + p, mask=m_sv, other=0.0)
                    b_cross = b_ox * b_dot.to(tl.float32) - b_vt.to(tl.float32) * b_y
                    part = b_cross + b_oin * b_do.to(tl.float32)
                    part -= b_vv.to(tl.float32) * (scale * b_in)
                    tl.store(vdv + p, part, mask=m_sv)
                    b_tot += tl.sum(b_cross, 0)
            if VEC_V:
                _store_total(tot, b_tot, i_b, i_c, i_h, NT, H, V, o_v, m_v)
            b_dC = _vec_state_bwd(
                b_dC, p_q, p_do, p_gkx, p_gk, p_gv, c0, c1, o_k, m_k, o_v, m_v, K, V, H, scale,
                BT, VEC_V, DOT_PREC,
            )  # fmt: skip
        else:
            o_t = c0 + tl.arange(0, BT)
            m_t = o_t < c1
            b_qt = _tile_t(p_q, o_t, o_k, HK * K, m_t, m_k)  # [BK, BT]
            b_k = _tile(p_k, o_t, o_k, HK * K, m_t, m_k)  # [BT, BK]
            b_do = _tile(p_do, o_t, o_v, H * V, m_t, m_v)  # [BT, BV]
            b_b, b_a, b_mr, lf, decay, w = _chunk_gates_bwd(
                g, gi, mc, m_row, i_bh, i_bh * (NT + NSEQ) + i_n + i_c, T, c0, c1, o_t, m_t, BT,
                HAS_DECAY, HAS_IGATE, HAS_MAX, PER_HEAD,
            )  # fmt: skip
            b_dv = tl.dot(b_k, b_dC.to(b_k.dtype), input_precision=DOT_PREC) * w[:, None]
            b_pt = tl.dot(b_k, b_qt, input_precision=DOT_PREC)  # [BT(s), BT(r)]
            f = scale * tl.exp(tl.where(m_t, lf, float("-inf")))
            if HAS_NORM:
                b_A = _vec(ra + i_bh * T, o_t, m_t)
                b_pt *= b_A[None, :]
                f = f * b_A
            causal = (o_t[:, None] >= o_t[None, :]) & m_t[:, None]
            b_d = _intra_weights(w_head, b_b, b_a, b_mr, causal, HAS_DECAY, HAS_IGATE, HAS_MAX,
                                 PER_HEAD)  # fmt: skip
            b_pt *= tl.trans(b_d)
            b_dv += scale * tl.dot(b_pt.to(b_do.dtype), b_do, input_precision=DOT_PREC)
            p = dv + base * V + o_t.to(tl.int64)[:, None] * H * V + o_v[None, :]
            tl.store(p, b_dv.to(dv.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
            b_dC, b_dn = _state_grad_step(
                b_dC, b_dn, b_qt.to(tl.float32), b_do, f, f, decay, False, DOT_PREC
            )
