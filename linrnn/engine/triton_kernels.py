"""Triton kernels of the chunkwise engine (DESIGN.md §3, TFLA two-level).

Per sequence and head, inside chunk c (rows r, columns s, both chunk-local; ``b`` the chunk-local
cumulative log decay, ``a`` the log input gate, ``m`` the mLSTM max state)::

    D_rs  = exp(b_r − b_s + a_s − m_r)                                (s ≤ r, else 0)
    o_r   = scale·[ exp(b_r + m_c − m_r) q_r C_c + Σ_s D_rs (q_r·k_s) v_s ]
    C_c+1 = exp(b_L + m_c − m_c+1) C_c + Σ_s exp(b_L − b_s + a_s − m_c+1) k_s v_sᵀ

Every exponent is ≤ 0: without the stabilizer b is non-increasing and a ≤ 0; with it, m_r and
m_c+1 are the exact maxima of the terms they divide (computed here from the same fp32 values).
The normalizer n rides along as a vector state beside C.

Five kernels serve every family through compile-time switches:

* ``states_fwd_kernel`` — the recurrent inter-chunk kernel: walks the chunks, stores C_c, n_c, m_c.
* ``rows_kernel`` — the parallel kernel tiled over (query tile, output tile), looping over key
  tiles of the chunk and over depth tiles. ``IS_DQ=False``: the forward output (the exact row
  max m_r is found first by a cheap pass over the scalar gates, so the main loop needs no online
  rescaling); ``IS_DQ=True``: dq, the same three products with (q, k, v, C) → (dh, v, k, Cᵀ).
* ``states_bwd_kernel`` — the reverse recurrence of the state gradient dC_c (and dn_c).
* ``cols_kernel`` — the transposed-causal kernel tiled over (key tile, output tile): dv with
  (k, q, dh, dC) and dk with (v, dh, q, dCᵀ).
* ``norm_bwd_kernel`` — per-row factors of the normalizer's backward.

Per-channel decays (GLA's gk/gv, RWKV6's w and u) have kernels of their own: vector_kernels.

Layouts: q, k, v, o and their gradients ``[B, T, H, D]`` contiguous; gates and per-row values
``[B·H, T]`` fp32; chunk states
``[B·H, NT(+1), K, V]``. Offsets are int64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_tiles import _tile, _tile_t

# Normalizer kinds (the NORM switch).
NORM_NONE, NORM_SUM, NORM_MAX1, NORM_MAXM = 0, 1, 2, 3


@triton.jit
def _vec(ptr, idx, mask):
    return tl.load(ptr + idx, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _state_tile(ptr, o_d, o_o, s_d, s_o, m_d, m_o):
    """A [len(o_d), len(o_o)] block of a state with element strides (s_d, s_o)."""
    p = ptr + o_d[:, None] * s_d + o_o[None, :] * s_o
    return tl.load(p, mask=m_d[:, None] & m_o[None, :], other=0.0)


@triton.jit
def _start_state(S, N, i_st, o_k, o_v, K, V, m_k, m_v, HAS: tl.constexpr,
                 TRACK_N: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):  # fmt: skip
    """A walk's starting slice of state ``i_st`` (S [.., K, V], N [.., K], fp32): C [BK, BV]
    and n [BK] (zeros without the state, n zeros without TRACK_N)."""
    if HAS:
        b_C = _state_tile(S + i_st * K * V, o_k, o_v, V, 1, m_k, m_v).to(tl.float32)
    else:
        b_C = tl.zeros([BK, BV], dtype=tl.float32)
    if TRACK_N and HAS:
        b_n = _vec(N + i_st * K, o_k, m_k)
    else:
        b_n = tl.zeros([BK], dtype=tl.float32)
    return b_C, b_n


@triton.jit
def _dot_n(b_x, b_n, DOT_PREC: tl.constexpr):
    """x·n per row, for x [BT, BD] in its input dtype and the fp32 normalizer state n [BD], on
    the tensor cores: n as n_hi + n_lo in x's dtype (8 columns each), so the sum keeps about fp32
    precision (den picks the normalizer's branch and scales the backward).

    Not an elementwise product with x: where x is also an operand of a dot in a pipelined loop
    (rows_kernel), Triton 3.6 on Hopper read the shared-memory copy of x for that product while
    a later stage was overwriting it, with num_stages ≥ 2 (benchmarks/diag_determinism.py: den
    differed between two runs on the same inputs, o by up to 5 % against fp32); and at BD = 256
    the [BT, BD] fp32 temporary spills."""
    b_hi = b_n.to(b_x.dtype)
    b_lo = (b_n - b_hi.to(tl.float32)).to(b_x.dtype)
    col = tl.arange(0, 16)[None, :]
    b_nn = tl.where(col < 8, b_hi[:, None], b_lo[:, None])  # [BD, 16]
    return tl.sum(tl.dot(b_x, b_nn, input_precision=DOT_PREC), 1) * (1.0 / 8)


@triton.jit
def _denominator(b_den, b_mr, eps, NORM: tl.constexpr):
    """The normalizer's denominator from den = scale·q·n: den + eps (sum), max(|den|, 1) + eps
    (mLSTM, sigmoid gate) or max(|den|, exp(−m_r)) + eps (mLSTM, max state)."""
    if NORM == 1:
        return b_den + eps
    elif NORM == 2:
        return tl.maximum(tl.abs(b_den), 1.0) + eps
    else:
        return tl.maximum(tl.abs(b_den), tl.exp(-b_mr)) + eps


@triton.jit
def _walk(CO, i_nh, H, NT, VARLEN: tl.constexpr):
    """A walking program's (row i_bh of the gates and chunk states, state index i_st, first and
    end chunk, sequence). Packed sequences (B = 1): program i_nh = n·H + h walks sequence n's
    chunks CO[n] … CO[n+1]."""
    if VARLEN:
        i_n = i_nh // H
        c_lo = tl.load(CO + i_n)
        c_hi = tl.load(CO + i_n + 1)
        return i_nh % H, i_nh, c_lo, c_hi, i_n
    else:
        return i_nh, i_nh, 0, NT, 0


@triton.jit
def _bounds(CHUNKS, i_c, L, T, VARLEN: tl.constexpr):
    """Chunk i_c's token range [c0, c1) and its sequence (CHUNKS: [NC, 3] int32 rows
    (start, end, sequence) for packed sequences)."""
    if VARLEN:
        c0 = tl.load(CHUNKS + i_c * 3)
        c1 = tl.load(CHUNKS + i_c * 3 + 1)
        return c0, c1, tl.load(CHUNKS + i_c * 3 + 2)
    else:
        c0 = i_c * L
        return c0, tl.minimum(c0 + L, T), 0


@triton.jit
def _chunk_rows(CHUNKS, i_cq, NQ, L, T, BQ: tl.constexpr, VARLEN: tl.constexpr):
    """Row tile i_cq % NQ of chunk i_cq // NQ (a program's first grid index): (i_c, c0, c1,
    i_n, r0, o_r, m_r) with rows o_r = r0 + [0, BQ), m_r = o_r < c1; r0 ≥ c1: an empty tile."""
    i_c = i_cq // NQ
    c0, c1, i_n = _bounds(CHUNKS, i_c, L, T, VARLEN)
    r0 = c0 + (i_cq % NQ) * BQ
    o_r = r0 + tl.arange(0, BQ)
    return i_c, c0, c1, i_n, r0, o_r, o_r < c1


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def states_fwd_kernel(
    K_, V_, ST, NS, MC, S0, N0, M0, ST_T, NS_T, G_B, G_A, CMAX, CO, CHUNKS,
    T, H, K, V, L, NT, NSEQ,
    BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, STAB: tl.constexpr,
    TRACK_N: tl.constexpr, HAS_S0: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (K tiles, V tiles, B·H). Stores the state entering each chunk (ST [BH,NT,K,V],
    NS [BH,NT,K], MC [BH,NT+1]) and the final state (ST_T, NS_T, MC[:, NT]). CMAX [BH,NT]:
    each chunk's max over s of (a_s − b_s), the chunk's own candidate for the max state. The max
    state of chunk i_c of sequence n sits at MC[row, i_c + n] (NSEQ + NT slots per row)."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, i_n = _walk(CO, i_nh, H, NT, VARLEN)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    p_k = K_ + (i_b * T * H + i_h) * K
    p_v = V_ + (i_b * T * H + i_h) * V
    G_B, G_A = G_B + i_bh * T, G_A + i_bh * T
    p_st = ST + i_bh * NT * K * V
    b_C, b_n = _start_state(S0, N0, i_st, o_k, o_v, K, V, m_k, m_v, HAS_S0, TRACK_N, BK, BV)
    if STAB and HAS_S0:
        b_m = tl.load(M0 + i_st).to(tl.float32)
    else:  # m_0 = −∞ (no state yet), as a tensor so the loop carries one type
        b_m = tl.max(tl.full([2], float("-inf"), tl.float32), 0)
    head = (i_k == 0) & (i_v == 0)
    p_mc = MC + i_bh * (NT + NSEQ) + i_n
    for i_c in range(c_lo, c_hi):
        c0, c1, _ = _bounds(CHUNKS, i_c, L, T, VARLEN)
        p_c = p_st + i_c * K * V
        tl.store(
            p_c + o_k[:, None] * V + o_v[None, :], b_C.to(ST.dtype.element_ty),
            mask=m_k[:, None] & m_v[None, :],
        )  # fmt: skip
        if TRACK_N:
            tl.store(NS + (i_bh * NT + i_c) * K + o_k, b_n, mask=m_k & ((o_k * 0 + i_v) == 0))
        b_last = tl.load(G_B + c1 - 1) if HAS_DECAY else 0.0
        if STAB:
            tl.store(p_mc + i_c, b_m, mask=head)
            m_next = b_last + tl.maximum(b_m, tl.load(CMAX + i_bh * NT + i_c))
            decay = tl.exp(b_last + b_m - m_next)
        elif HAS_DECAY:
            m_next = 0.0
            decay = tl.exp(b_last)
        else:
            m_next = 0.0
            decay = 1.0
        b_C *= decay
        b_n *= decay
        for s0 in range(c0, c1, BS):
            o_s = s0 + tl.arange(0, BS)
            m_s = o_s < c1
            b_kt = _tile_t(p_k, o_s, o_k, H * K, m_s, m_k)  # [BK, BS]
            b_vs = _tile(p_v, o_s, o_v, H * V, m_s, m_v)  # [BS, BV]
            w = -m_next + tl.zeros([BS], dtype=tl.float32)
            if HAS_DECAY:
                w += b_last - _vec(G_B, o_s, m_s)
            if HAS_IGATE:
                w += _vec(G_A, o_s, m_s)
            w = tl.exp(tl.where(m_s, w, float("-inf")))  # [BS], ≤ 1
            b_kw = b_kt.to(tl.float32) * w[None, :]
            b_C += tl.dot(b_kw.to(b_vs.dtype), b_vs, input_precision=DOT_PREC)
            if TRACK_N:
                b_n += tl.sum(b_kw, 1)
        b_m = m_next
    tl.store(
        ST_T + i_st * K * V + o_k[:, None] * V + o_v[None, :], b_C.to(ST_T.dtype.element_ty),
        mask=m_k[:, None] & m_v[None, :],
    )  # fmt: skip
    if TRACK_N:
        tl.store(NS_T + i_st * K + o_k, b_n, mask=m_k & ((o_k * 0 + i_v) == 0))
    if STAB:
        tl.store(p_mc + c_hi, b_m, mask=head)


@triton.jit
def _log_weights(b_r, b_s, a_s, m_r, causal, HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr,
                 STAB: tl.constexpr):  # fmt: skip
    """The [R, S] intra-chunk weights D_rs = exp(b_r − b_s + a_s − m_r) on the causal mask."""
    if HAS_DECAY or HAS_IGATE or STAB:
        lw = tl.zeros(causal.shape, dtype=tl.float32)
        if HAS_DECAY:
            lw += b_r[:, None] - b_s[None, :]
        if HAS_IGATE:
            lw += a_s[None, :]
        if STAB:
            lw -= m_r[:, None]
        return tl.exp(tl.where(causal, lw, float("-inf")))
    else:
        return tl.where(causal, 1.0, 0.0)


@triton.jit(do_not_specialize=["T", "NT", "NQ", "NSEQ"])
def rows_kernel(
    X, Y, Z, OUT, ST, NS, MC, G_B, G_A, M_ROW, DEN, R_A, R_D, QD, PART, CHUNKS,
    T, H, D, O, L, NT, NQ, NSEQ, s_sd, s_so, scale, eps,
    BQ: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    IS_DQ: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr,
    STAB: tl.constexpr, TRACK_N: tl.constexpr, NORM: tl.constexpr, DOT_PREC: tl.constexpr,
    VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × query tiles, output tiles, B·H). Rows r of one query tile:

        out_r = scale·[ e_r (A_r X_r S_c + dd_r n_c) + Σ_{s≤r} D_rs (A_r X_r·Y_s + dd_r) Z_s ]

    forward: (X, Y, Z, S) = (q, k, v, C), A = 1, dd = 0, then the normalizer; dq: (dh, v, k,
    Cᵀ) with A = 1/denominator and dd the normalizer's row gradient. e_r = exp(b_r+m_c−m_r).
    The state's element strides (s_sd, s_so) pick C or Cᵀ."""
    i_cq, i_o, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    i_c, c0, c1, i_n, r0, o_r, m_r = _chunk_rows(CHUNKS, i_cq, NQ, L, T, BQ, VARLEN)
    if r0 >= c1:
        return
    o_o = i_o * BO + tl.arange(0, BO)
    m_o = o_o < O
    p_x = X + (i_b * T * H + i_h) * D
    p_y = Y + (i_b * T * H + i_h) * D
    p_z = Z + (i_b * T * H + i_h) * O
    G_B, G_A = G_B + i_bh * T, G_A + i_bh * T
    r_end = tl.minimum(r0 + BQ, c1)

    b_br = _vec(G_B, o_r, m_r) if HAS_DECAY else tl.zeros([BQ], dtype=tl.float32)
    b_mr = tl.zeros([BQ], dtype=tl.float32)
    if STAB:
        m_c = tl.load(MC + i_bh * (NT + NSEQ) + i_c + i_n)
        if IS_DQ:
            b_mr = _vec(M_ROW + i_bh * T, o_r, m_r)
        else:  # the exact row max, from the scalar gates alone (no matmul)
            b_mr = b_br + m_c
            for s0 in range(c0, r_end, BS):
                o_s = s0 + tl.arange(0, BS)
                m_s = o_s < c1
                z = b_br[:, None] + (_vec(G_A, o_s, m_s) - _vec(G_B, o_s, m_s))[None, :]
                causal = (o_r[:, None] >= o_s[None, :]) & m_s[None, :]
                b_mr = tl.maximum(b_mr, tl.max(tl.where(causal, z, float("-inf")), 1))
            b_mr = tl.where(m_r, b_mr, 0.0)
        e_r = tl.exp(b_br + m_c - b_mr)
    else:
        e_r = tl.exp(b_br)
    if IS_DQ and NORM != 0:
        b_A = _vec(R_A + i_bh * T, o_r, m_r)
        b_dd = _vec(R_D + i_bh * T, o_r, m_r)

    # One pass over depth: the inter-chunk product X_r·S_c and the diagonal key tile's X_r·Y_s
    # share each load of X (the key tile s = r0 is the query tile itself: BS == BQ).
    b_acc = tl.zeros([BQ, BO], dtype=tl.float32)
    b_den = tl.zeros([BQ], dtype=tl.float32)
    b_p = tl.zeros([BQ, BQ], dtype=tl.float32)
    p_st = ST + (i_bh * NT + i_c) * D * O
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_r, o_d, H * D, m_r, m_d)  # [BQ, BD]
        b_s = _state_tile(p_st, o_d, o_o, s_sd, s_so, m_d, m_o)  # [BD, BO]
        b_acc += tl.dot(b_x, b_s.to(b_x.dtype), input_precision=DOT_PREC)
        b_p += tl.dot(b_x, _tile_t(p_y, o_r, o_d, H * D, m_r, m_d), input_precision=DOT_PREC)
        if (not IS_DQ) and NORM != 0:
            b_n = _vec(NS + (i_bh * NT + i_c) * D, o_d, m_d)
            b_den += _dot_n(b_x, b_n, DOT_PREC)
    if IS_DQ and NORM != 0:
        b_no = _vec(NS + (i_bh * NT + i_c) * O, o_o, m_o)  # [BO]
        b_acc = b_acc * b_A[:, None] + b_dd[:, None] * b_no[None, :]
    b_acc *= e_r[:, None]
    b_den *= e_r

    # The diagonal tile (causal mask), then the full key tiles before it.
    if IS_DQ and NORM != 0:
        b_p = b_p * b_A[:, None] + b_dd[:, None]
    b_ar = _vec(G_A, o_r, m_r) if HAS_IGATE else tl.zeros([BQ], dtype=tl.float32)
    causal = (o_r[:, None] >= o_r[None, :]) & m_r[:, None]  # s ≤ r < c1
    b_p *= _log_weights(b_br, b_br, b_ar, b_mr, causal, HAS_DECAY, HAS_IGATE, STAB)
    if (not IS_DQ) and NORM != 0:
        b_den += tl.sum(b_p, 1)
    b_z = _tile(p_z, o_r, o_o, H * O, m_r, m_o)  # [BQ, BO]
    b_acc += tl.dot(b_p.to(b_z.dtype), b_z, input_precision=DOT_PREC)
    for s0 in range(c0, r0, BS):
        o_s = s0 + tl.arange(0, BS)
        m_s = o_s < c1
        b_p = tl.zeros([BQ, BS], dtype=tl.float32)
        for d0 in range(0, D, BD):
            o_d = d0 + tl.arange(0, BD)
            m_d = o_d < D
            b_x = _tile(p_x, o_r, o_d, H * D, m_r, m_d)  # [BQ, BD]
            b_yt = _tile_t(p_y, o_s, o_d, H * D, m_s, m_d)  # [BD, BS]
            b_p += tl.dot(b_x, b_yt, input_precision=DOT_PREC)
        if IS_DQ and NORM != 0:
            b_p = b_p * b_A[:, None] + b_dd[:, None]
        b_bs = _vec(G_B, o_s, m_s) if HAS_DECAY else tl.zeros([BS], dtype=tl.float32)
        b_as = _vec(G_A, o_s, m_s) if HAS_IGATE else tl.zeros([BS], dtype=tl.float32)
        full = m_r[:, None] & m_s[None, :]  # every s < r0 ≤ r
        b_p *= _log_weights(b_br, b_bs, b_as, b_mr, full, HAS_DECAY, HAS_IGATE, STAB)
        if (not IS_DQ) and NORM != 0:
            b_den += tl.sum(b_p, 1)
        b_z = _tile(p_z, o_s, o_o, H * O, m_s, m_o)  # [BS, BO]
        b_acc += tl.dot(b_p.to(b_z.dtype), b_z, input_precision=DOT_PREC)
    b_acc *= scale

    p_out = OUT + (i_b * T * H + i_h) * O + o_r.to(tl.int64)[:, None] * H * O + o_o[None, :]
    m_out = m_r[:, None] & m_o[None, :]
    if IS_DQ:
        tl.store(p_out, b_acc.to(OUT.dtype.element_ty), mask=m_out)
        if HAS_DECAY:  # q·dq over this output tile, for the log-decay gradient
            b_q = _tile(QD + (i_b * T * H + i_h) * O, o_r, o_o, H * O, m_r, m_o)
            part = tl.sum(b_q.to(tl.float32) * b_acc, 1)
            tl.store(PART + (i_o * tl.num_programs(2) + i_bh) * T + o_r, part, mask=m_r)
    else:
        if NORM != 0:
            b_den *= scale
            b_acc = b_acc / _denominator(b_den, b_mr, eps, NORM)[:, None]
            tl.store(DEN + i_bh * T + o_r, b_den, mask=m_r & ((o_r * 0 + i_o) == 0))
        if STAB:
            tl.store(M_ROW + i_bh * T + o_r, b_mr, mask=m_r & ((o_r * 0 + i_o) == 0))
        tl.store(p_out, b_acc.to(OUT.dtype.element_ty), mask=m_out)


@triton.jit(do_not_specialize=["T"])
def norm_bwd_kernel(
    DH, O_, DEN, M_ROW, R_A, R_D, R_M, T, H, V, eps,
    BT: tl.constexpr, BV: tl.constexpr, NORM: tl.constexpr, STAB: tl.constexpr,
):  # fmt: skip
    """Grid (T tiles, B·H). With h = o / P, P = f(den) + eps: A = 1/P, dd = ∂L/∂den =
    −(dh·h)/P · f'(den) and, for the max state, dm = ∂L/∂m_r = −(dh·h)·eps/P (m enters h only
    through eps once the state's scale cancels)."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    base = (i_b * T * H + i_h) * V
    dot = tl.zeros([BT], dtype=tl.float32)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        m_v = o_v < V
        b_dh = _tile(DH + base, o_t, o_v, H * V, m_t, m_v).to(tl.float32)
        b_h = _tile(O_ + base, o_t, o_v, H * V, m_t, m_v).to(tl.float32)
        dot += tl.sum(b_dh * b_h, 1)
    den = _vec(DEN + i_bh * T, o_t, m_t)
    if NORM == 1:
        p = den + eps
        slope = tl.full([BT], 1.0, tl.float32)
    else:
        if NORM == 2:
            floor = tl.full([BT], 1.0, tl.float32)
        else:
            floor = tl.exp(-_vec(M_ROW + i_bh * T, o_t, m_t))
        p = tl.maximum(tl.abs(den), floor) + eps
        slope = tl.where(tl.abs(den) > floor, tl.where(den >= 0, 1.0, -1.0), 0.0)
    tl.store(R_A + i_bh * T + o_t, 1.0 / p, mask=m_t)
    tl.store(R_D + i_bh * T + o_t, -dot / p * slope, mask=m_t)
    if STAB:
        tl.store(R_M + i_bh * T + o_t, -dot * eps / p, mask=m_t)


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def states_bwd_kernel(
    Q, DH, DST, DNS, DS0, DN0, DS_T, DN_T, MC, G_B, M_ROW, R_A, R_D, CO, CHUNKS,
    ST, NS, ST_T, NS_T, BND,
    T, H, K, V, L, NT, NSEQ, scale,
    BK: tl.constexpr, BV: tl.constexpr, BQ: tl.constexpr,
    HAS_DECAY: tl.constexpr, STAB: tl.constexpr, TRACK_N: tl.constexpr, NORM: tl.constexpr,
    HAS_DST: tl.constexpr, DOT_PREC: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (K tiles, V tiles, B·H). Walks the chunks backwards; stores the gradient of the
    state leaving each chunk (DST [BH,NT,K,V] in its dtype, DNS [BH,NT,K]) and of the initial
    state.

    With decay, also this tile's part of ⟨dC, C⟩ + ⟨dn, n⟩ for the state leaving each chunk
    (BND [BH, NT, K tiles · V tiles]): the exact log-decay gradient at the chunk's end (the
    next chunk's stored state, or the final state ST_T/NS_T after a sequence's last chunk)."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, i_n = _walk(CO, i_nh, H, NT, VARLEN)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    p_q = Q + (i_b * T * H + i_h) * K
    p_dh = DH + (i_b * T * H + i_h) * V
    G_B = G_B + i_bh * T
    b_dC, b_dn = _start_state(DS_T, DN_T, i_st, o_k, o_v, K, V, m_k, m_v, HAS_DST, TRACK_N, BK,
                              BV)  # fmt: skip
    p_mc = MC + i_bh * (NT + NSEQ) + i_n
    for j in range(c_hi - c_lo):
        i_c = c_hi - 1 - j
        c0, c1, _ = _bounds(CHUNKS, i_c, L, T, VARLEN)
        tl.store(
            DST + (i_bh * NT + i_c) * K * V + o_k[:, None] * V + o_v[None, :],
            b_dC.to(DST.dtype.element_ty), mask=m_k[:, None] & m_v[None, :],
        )  # fmt: skip
        if TRACK_N:
            tl.store(DNS + (i_bh * NT + i_c) * K + o_k, b_dn, mask=m_k & ((o_k * 0 + i_v) == 0))
        if HAS_DECAY:
            if i_c + 1 < c_hi:
                p_nx = ST + (i_bh * NT + i_c + 1) * K * V
                p_nn = NS + (i_bh * NT + i_c + 1) * K
            else:
                p_nx = ST_T + i_st * K * V
                p_nn = NS_T + i_st * K
            b_nx = _state_tile(p_nx, o_k, o_v, V, 1, m_k, m_v).to(tl.float32)
            bnd = tl.sum(tl.sum(b_dC * b_nx, 1), 0)
            if TRACK_N:
                bnd += tl.where(i_v == 0, tl.sum(b_dn * _vec(p_nn, o_k, m_k), 0), 0.0)
            n_tiles = tl.num_programs(0) * tl.num_programs(1)
            tl.store(BND + (i_bh * NT + i_c) * n_tiles + i_k * tl.num_programs(1) + i_v, bnd)
        b_last = tl.load(G_B + c1 - 1) if HAS_DECAY else 0.0
        if STAB:
            m_c = tl.load(p_mc + i_c)
            decay = tl.exp(b_last + m_c - tl.load(p_mc + i_c + 1))
        elif HAS_DECAY:
            decay = tl.exp(b_last)
        else:
            decay = 1.0
        b_dC *= decay
        b_dn *= decay
        for r0 in range(c0, c1, BQ):
            o_r = r0 + tl.arange(0, BQ)
            m_r = o_r < c1
            lf = _vec(G_B, o_r, m_r) if HAS_DECAY else tl.zeros([BQ], dtype=tl.float32)
            if STAB:
                lf += m_c - _vec(M_ROW + i_bh * T, o_r, m_r)
            f = scale * tl.exp(tl.where(m_r, lf, float("-inf")))  # [BQ]
            b_qt = _tile_t(p_q, o_r, o_k, H * K, m_r, m_k).to(tl.float32)  # [BK, BQ]
            b_dh = _tile(p_dh, o_r, o_v, H * V, m_r, m_v)  # [BQ, BV]
            if NORM != 0:
                b_dC += tl.dot(
                    (b_qt * (f * _vec(R_A + i_bh * T, o_r, m_r))[None, :]).to(b_dh.dtype), b_dh,
                    input_precision=DOT_PREC,
                )  # fmt: skip
                if TRACK_N:
                    b_dn += tl.sum(b_qt * (f * _vec(R_D + i_bh * T, o_r, m_r))[None, :], 1)
            else:
                b_qf = (b_qt * f[None, :]).to(b_dh.dtype)
                b_dC += tl.dot(b_qf, b_dh, input_precision=DOT_PREC)
    tl.store(
        DS0 + i_st * K * V + o_k[:, None] * V + o_v[None, :], b_dC,
        mask=m_k[:, None] & m_v[None, :],
    )  # fmt: skip
    if TRACK_N:
        tl.store(DN0 + i_st * K + o_k, b_dn, mask=m_k & ((o_k * 0 + i_v) == 0))


@triton.jit(do_not_specialize=["T", "NT", "NS_", "NSEQ"])
def cols_kernel(
    X, Y, Z, OUT, DST, DNS, MC, G_B, G_A, M_ROW, R_A, R_D, KD, PART, CHUNKS,
    T, H, D, O, L, NT, NS_, NSEQ, s_sd, s_so, scale,
    BQ: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr,
    IS_DK: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr,
    STAB: tl.constexpr, TRACK_N: tl.constexpr, NORM: tl.constexpr, DOT_PREC: tl.constexpr,
    VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (chunks × key tiles, output tiles, B·H). Columns s of one key tile:

        out_s = w_s (X_s dS_c+1 + [dk] dn_c+1) + scale·Σ_{r≥s} D_rs M_sr Z_r

    dv: (X, Y, Z, dS) = (k, q, dh, dC), M_sr = A_r (k_s·q_r); dk: (v, dh, q, dCᵀ),
    M_sr = A_r (v_s·dh_r) + dd_r. w_s = exp(b_L − b_s + a_s − m_c+1)."""
    i_cs, i_o, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    i_c, _, c1, i_n, s0, o_s, m_s = _chunk_rows(CHUNKS, i_cs, NS_, L, T, BS, VARLEN)
    if s0 >= c1:
        return
    o_o = i_o * BO + tl.arange(0, BO)
    m_o = o_o < O
    p_x = X + (i_b * T * H + i_h) * D
    p_y = Y + (i_b * T * H + i_h) * D
    p_z = Z + (i_b * T * H + i_h) * O
    G_B, G_A = G_B + i_bh * T, G_A + i_bh * T

    b_bs = _vec(G_B, o_s, m_s) if HAS_DECAY else tl.zeros([BS], dtype=tl.float32)
    b_as = _vec(G_A, o_s, m_s) if HAS_IGATE else tl.zeros([BS], dtype=tl.float32)
    lw = b_as - b_bs
    if HAS_DECAY:
        lw += tl.load(G_B + c1 - 1)
    if STAB:
        lw -= tl.load(MC + i_bh * (NT + NSEQ) + i_c + i_n + 1)
    w_s = tl.exp(tl.where(m_s, lw, float("-inf")))  # [BS], ≤ 1

    # One pass over depth: the inter-chunk product X_s·dS_c+1 and the diagonal query tile's
    # X_s·Y_r share each load of X (the query tile r = s0 is the key tile itself: BQ == BS).
    b_int = tl.zeros([BS, BO], dtype=tl.float32)
    b_mt = tl.zeros([BS, BS], dtype=tl.float32)
    p_dst = DST + (i_bh * NT + i_c) * D * O
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_s, o_d, H * D, m_s, m_d)  # [BS, BD]
        b_st = _state_tile(p_dst, o_d, o_o, s_sd, s_so, m_d, m_o)  # [BD, BO]
        b_int += tl.dot(b_x, b_st.to(b_x.dtype), input_precision=DOT_PREC)
        b_mt += tl.dot(b_x, _tile_t(p_y, o_s, o_d, H * D, m_s, m_d), input_precision=DOT_PREC)
    if IS_DK and TRACK_N:
        b_int += _vec(DNS + (i_bh * NT + i_c) * O, o_o, m_o)[None, :]

    b_acc = tl.zeros([BS, BO], dtype=tl.float32)
    for r0 in range(s0, c1, BQ):
        o_r = r0 + tl.arange(0, BQ)
        m_r = o_r < c1
        if r0 > s0:  # a full query tile after the diagonal
            b_mt = tl.zeros([BS, BQ], dtype=tl.float32)
            for d0 in range(0, D, BD):
                o_d = d0 + tl.arange(0, BD)
                m_d = o_d < D
                b_x = _tile(p_x, o_s, o_d, H * D, m_s, m_d)  # [BS, BD]
                b_yt = _tile_t(p_y, o_r, o_d, H * D, m_r, m_d)  # [BD, BQ]
                b_mt += tl.dot(b_x, b_yt, input_precision=DOT_PREC)
        if NORM != 0:
            b_mt *= _vec(R_A + i_bh * T, o_r, m_r)[None, :]
            if IS_DK:
                b_mt += _vec(R_D + i_bh * T, o_r, m_r)[None, :]
        b_br = _vec(G_B, o_r, m_r) if HAS_DECAY else tl.zeros([BQ], dtype=tl.float32)
        b_mr = _vec(M_ROW + i_bh * T, o_r, m_r) if STAB else tl.zeros([BQ], dtype=tl.float32)
        causal = (o_r[:, None] >= o_s[None, :]) & m_r[:, None]  # [BQ, BS]
        b_d = _log_weights(b_br, b_bs, b_as, b_mr, causal, HAS_DECAY, HAS_IGATE, STAB)
        b_mt *= tl.trans(b_d)
        b_z = _tile(p_z, o_r, o_o, H * O, m_r, m_o)  # [BQ, BO]
        b_acc += tl.dot(b_mt.to(b_z.dtype), b_z, input_precision=DOT_PREC)
    b_acc = b_acc * scale + b_int * w_s[:, None]

    p_out = OUT + (i_b * T * H + i_h) * O + o_s.to(tl.int64)[:, None] * H * O + o_o[None, :]
    tl.store(p_out, b_acc.to(OUT.dtype.element_ty), mask=m_s[:, None] & m_o[None, :])
    if IS_DK and (HAS_DECAY or HAS_IGATE):  # k·dk over this output tile, for the gate gradients
        b_k = _tile(KD + (i_b * T * H + i_h) * O, o_s, o_o, H * O, m_s, m_o)
        part = tl.sum(b_k.to(tl.float32) * b_acc, 1)
        tl.store(PART + (i_o * tl.num_programs(2) + i_bh) * T + o_s, part, mask=m_s)
