"""The @triton.jit helpers every kernel file of the engine shares (scalar, vector, fused and
recurrent kernels): block loads with int64 row offsets, a walking program's chunk range, a chunk's
bounds and row tile, the starting state of a walk, the normalizer's denominator, the causal
product of a diagonal tile, the intra-chunk weights of scalar gates and the gate activations
(log σ, softplus). Kernel files import them from here, never from each other.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine import config

# The kernels' NORM codes (config.norm_code), as constexprs a kernel can compare against.
NORM_NONE = tl.constexpr(config.NORM_NONE)
NORM_SUM = tl.constexpr(config.NORM_SUM)
NORM_MAX1 = tl.constexpr(config.NORM_MAX1)
NORM_MAXM = tl.constexpr(config.NORM_MAXM)
# The largest accumulator [R, O] of _causal_dot_at's recheck form: 64 × 128 fp32 is 64
# registers a thread at 4 warps, twice that with its copy. At 64 × 256 the recheck made the
# scalar output kernel's forward 1.8× as slow as cleaning on an H200 (the copy spills).
RECHECK_MAX = tl.constexpr(8192)
# Flags a fix-pass program reads at once (engine/fix_pass.py): most programs find none set.
FLAG_BLOCK = tl.constexpr(128)
# Mamba2's log Δ takes the form z − e^z/2 below this (linrnn.ops.mamba2._LOG_SOFTPLUS_CUT), and
# softplus(z) rounds to z above the other (linrnn.ops.mamba2._SOFTPLUS_LINEAR_ABOVE).
LOG_SOFTPLUS_CUT = tl.constexpr(-15.0)
SOFTPLUS_LINEAR_ABOVE = tl.constexpr(40.0)


@triton.jit
def _log1p(x):
    """log(1 + x) for 0 ≤ x ≤ 1, accurate where 1 + x rounds (Goldberg: log(u)·x/(u − 1))."""
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def _softplus_parts(z):
    """(Δ = softplus(z), σ(z), e^{−|z|}) in fp32, exponents ≤ 0."""
    e = tl.exp(-tl.abs(z))
    delta = tl.maximum(z, 0.0) + _log1p(e)
    delta = tl.where(z > SOFTPLUS_LINEAR_ABOVE, z, delta)
    sig = tl.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return delta, sig, e


@triton.jit
def _log_sigmoid(x):
    """log σ(x) = min(x, 0) − log(1 + e^{−|x|}) in fp32, the exponent ≤ 0."""
    return tl.minimum(x, 0.0) - _log1p(tl.exp(-tl.abs(x)))


@triton.jit
def _tile(ptr, rows, cols, row_stride, m_rows, m_cols):
    """Load ``ptr[rows, cols]`` as a [len(rows), len(cols)] block (row-major, int64 rows)."""
    p = ptr + rows.to(tl.int64)[:, None] * row_stride + cols[None, :]
    return tl.load(p, mask=m_rows[:, None] & m_cols[None, :], other=0.0)


@triton.jit
def _tile_t(ptr, rows, cols, row_stride, m_rows, m_cols):
    """Load ``ptr[rows, cols]`` transposed, as a [len(cols), len(rows)] block."""
    p = ptr + rows.to(tl.int64)[None, :] * row_stride + cols[:, None]
    return tl.load(p, mask=m_cols[:, None] & m_rows[None, :], other=0.0)


@triton.jit
def _vec(ptr, idx, mask):
    """``ptr[idx]`` as fp32, 0 where masked off."""
    return tl.load(ptr + idx, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _cum(g, idx, mask, c0, PER_HEAD: tl.constexpr):
    """The chunk-local cumulative log decay b at token rows ``idx`` of the chunk starting at
    row ``c0`` (0 where masked off): loaded from the rows ``g``, or, ``PER_HEAD``, formed from
    the head's constant log decay ``g`` (a value): b = (idx − c0 + 1)·g, no load."""
    if PER_HEAD:
        b = tl.where(mask, (idx - c0 + 1).to(tl.float32) * g, 0.0)
    else:
        b = _vec(g, idx, mask)
    return b


@triton.jit
def _cum_last(g, c0, c1, PER_HEAD: tl.constexpr):
    """b at the chunk's last row c1 − 1 (:func:`_cum`)."""
    if PER_HEAD:
        b = (c1 - c0).to(tl.float32) * g
    else:
        b = tl.load(g + c1 - 1)
    return b


@triton.jit
def _state_tile(ptr, o_d, o_o, s_d, s_o, m_d, m_o):
    """A [len(o_d), len(o_o)] block of a state with element strides (s_d, s_o)."""
    p = ptr + o_d[:, None] * s_d + o_o[None, :] * s_o
    return tl.load(p, mask=m_d[:, None] & m_o[None, :], other=0.0)


@triton.jit
def _start_state(h, n, i_st, o_k, o_v, K, V, m_k, m_v, HAS_H: tl.constexpr,
                 HAS_N: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):  # fmt: skip
    """A walk's starting slice of state ``i_st`` (h [.., K, V], n [.., K], fp32): C [BK, BV]
    and n [BK] (zeros without the state, n zeros without ``HAS_N``)."""
    if HAS_H:
        b_C = _state_tile(h + i_st * K * V, o_k, o_v, V, 1, m_k, m_v).to(tl.float32)
    else:
        b_C = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_N and HAS_H:
        b_n = _vec(n + i_st * K, o_k, m_k)
    else:
        b_n = tl.zeros([BK], dtype=tl.float32)
    return b_C, b_n


@triton.jit
def _dot_n(b_x, b_n, DOT_PREC: tl.constexpr):
    """x·n per row, for x [BT, BD] in its input dtype and the fp32 normalizer state n [BD], on
    the tensor cores: n as n_hi + n_lo in x's dtype (8 columns each), so the sum keeps about fp32
    precision (den picks the normalizer's branch and scales the backward).

    Not an elementwise product with x: where x is also an operand of a dot in a pipelined loop
    (the forward's depth pass), Triton 3.6 on Hopper read the shared-memory copy of x for that
    product while a later pipeline stage was overwriting it (num_stages ≥ 2), so den differed
    between two runs on the same inputs; and at BD = 256 the [BT, BD] fp32 temporary spills."""
    b_hi = b_n.to(b_x.dtype)
    b_lo = (b_n - b_hi.to(tl.float32)).to(b_x.dtype)
    col = tl.arange(0, 16)[None, :]
    b_nn = tl.where(col < 8, b_hi[:, None], b_lo[:, None])  # [BD, 16]
    return tl.sum(tl.dot(b_x, b_nn, input_precision=DOT_PREC), 1) * (1.0 / 8)


@triton.jit
def _inv_denominator(b_den, b_mr, eps, NORM: tl.constexpr):
    """(1/P, above) for the normalizer's denominator P = f(den) + eps, den = scale·q·n: f(den) =
    den (sum), max(|den|, 1) (mLSTM, sigmoid gate) or max(|den|, exp(−m_r)) (mLSTM, max state);
    ``above``: |den| is above the floor (f'(den) = sign(den) there, 0 below; always for the sum).

    exp(−m_r) is never formed: it overflows fp32 for m_r < −88 (input gates below −88), and
    P = inf then made the backward's 0·inf NaN. Only e = exp(−|m_r|) ≤ 1 is: the floor is e for
    m_r ≥ 0 and 1/e below, where 1/P = e / (1 + eps·e) (the PyTorch path's
    ``max_state_normalize``)."""
    if NORM == NORM_SUM:
        return 1.0 / (b_den + eps), b_den == b_den
    elif NORM == NORM_MAX1:
        above = tl.abs(b_den) > 1.0
        return 1.0 / (tl.maximum(tl.abs(b_den), 1.0) + eps), above
    else:
        e = tl.exp(-tl.abs(b_mr))
        pos = b_mr >= 0
        mag = tl.abs(b_den)
        above = tl.where(pos, mag > e, mag * e > 1.0)
        below = tl.where(pos, 1.0 / (e + eps), e / (1.0 + eps * e))
        return tl.where(above, 1.0 / (mag + eps), below), above


@triton.jit
def _causal_dot(b_acc, b_p, b_z, causal, DOT_PREC: tl.constexpr):
    """b_acc + (b_p on ``causal``)·b_z [R, O] for a product whose rows of z may lie after some
    rows of p: a diagonal tile, p [R, S] over the step pairs (r, s), z [S, O] the steps s,
    ``causal`` [R, S] true where s ≤ r. A non-finite entry of z (garbage in right padding) must
    reach only the rows at or after its own step, as in the recurrence, but the product would
    multiply it by the masked zeros of every earlier row (0·NaN = NaN). So z's non-finite
    entries are zeroed for the product and the rows at or after a step with one are set to NaN
    (every column of such a row; later chunks get NaN through the state in the affected columns
    only). Masked entries of p are replaced by zeros (``where``), never multiplied, for the same
    reason (a later key's NaN score). Earlier rows are bitwise those of the clean product.
    For a z formed in registers; a z read from memory goes through :func:`_causal_dot_at`."""
    fin = tl.abs(b_z.to(tl.float32)) < float("inf")  # false for NaN and ±inf
    b_zc = tl.where(fin, b_z, 0.0).to(b_z.dtype)
    b_pc = tl.where(causal, b_p, 0.0).to(b_z.dtype)
    b_acc += tl.dot(b_pc, b_zc, input_precision=DOT_PREC)
    return _nan_rows(b_acc, fin, causal)


@triton.jit
def _nan_rows(b_acc, fin, causal):
    """b_acc [R, O] with every row at or after a step s whose z row has a non-finite entry
    (``fin`` [S, ·] false) set to NaN; ``causal`` [R, S] true where s ≤ r."""
    bad_s = tl.max(tl.where(fin, 0, 1), 1)  # [S]: step s has a non-finite entry
    bad_r = tl.max(tl.where(causal, bad_s[None, :], 0), 1)  # [R]: some s ≤ r does
    return tl.where(bad_r[:, None] > 0, float("nan"), b_acc)


@triton.jit
def _not_finite(b_acc):
    """Whether the tile b_acc holds a NaN or ±inf (0·x summed over it: NaN iff one does)."""
    flag = tl.sum(tl.sum(b_acc * 0.0, 1), 0)
    return flag != flag


@triton.jit
def _slot_span(SLOTS):
    """The slots [lo, hi) of a fix-pass program (1-D grid): an even share of SLOTS."""
    per = tl.cdiv(SLOTS, tl.num_programs(0))
    lo = tl.program_id(0).to(tl.int64) * per
    return lo, tl.minimum(lo + per, SLOTS)


@triton.jit
def _any_flag(bad, s0, hi):
    """Whether any flag of bad[s0 : min(s0 + FLAG_BLOCK, hi)] is set."""
    o_s = s0 + tl.arange(0, FLAG_BLOCK)
    return tl.max(tl.load(bad + o_s, mask=o_s < hi, other=0), 0) != 0


@triton.jit
def _slot_ids(slot, G0, G1):
    """The program ids (0, 1, 2) of a grid (G0, G1, ·) whose :func:`_program_slot` is slot."""
    return slot % G0, (slot // G0) % G1, slot // (G0 * G1)


@triton.jit
def _program_slot():
    """This program's index in its (up to 3-D) grid: its slot in a per-program flag table."""
    i_p = tl.program_id(2).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
    return i_p * tl.num_programs(0) + tl.program_id(0)


@triton.jit
def _causal_dot_at(b_acc, b_p, causal, p_z, o_s, o_o, s_z, m_s, m_o, DOT_PREC: tl.constexpr):
    """:func:`_causal_dot` with z read here, ``p_z[o_s, o_o]`` (row stride s_z, masks m_s,
    m_o). Cleaning z costs an elementwise pass over every tile between its load and the
    tensor-core product. An accumulator of at most RECHECK_MAX entries skips it: the product is
    formed from the raw tile, and only when the result holds a non-finite value (0·x summed
    over the tile: NaN iff some entry is NaN or ±inf, the rare case) is it formed again by
    :func:`_causal_dot` from a second load of z (never an elementwise read of a ``tl.dot``
    operand, §6.6). That keeps a copy of the accumulator, which a larger one cannot afford."""
    if b_acc.shape[0] * b_acc.shape[1] <= RECHECK_MAX:
        b_z = _tile(p_z, o_s, o_o, s_z, m_s, m_o)
        b_pc = tl.where(causal, b_p, 0.0)
        b_out = b_acc + tl.dot(b_pc.to(b_z.dtype), b_z, input_precision=DOT_PREC)
        flag = tl.sum(tl.sum(b_out * 0.0, 1), 0)
        if flag != flag:
            b_out = _causal_dot(b_acc, b_pc, _tile(p_z, o_s, o_o, s_z, m_s, m_o), causal,
                                DOT_PREC)  # fmt: skip
    else:
        b_out = _causal_dot(b_acc, b_p, _tile(p_z, o_s, o_o, s_z, m_s, m_o), causal, DOT_PREC)
    return b_out


@triton.jit
def _log_weights(b_r, b_s, a_s, m_r, causal, HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr,
                 HAS_MAX: tl.constexpr):  # fmt: skip
    """The [R, S] intra-chunk weights D_rs = exp(b_r − b_s + a_s − m_r) of scalar gates on the
    causal mask (``HAS_MAX``: with the max state's row values m_r)."""
    if HAS_DECAY or HAS_IGATE or HAS_MAX:
        lw = tl.zeros(causal.shape, dtype=tl.float32)
        if HAS_DECAY:
            lw += b_r[:, None] - b_s[None, :]
        if HAS_IGATE:
            lw += a_s[None, :]
        if HAS_MAX:
            lw -= m_r[:, None]
        return tl.exp(tl.where(causal, lw, float("-inf")))
    else:
        return tl.where(causal, 1.0, 0.0)


@triton.jit
def _walk(co, i_nh, H, NT, VARLEN: tl.constexpr):
    """A walking program's (row i_bh of the gates and chunk states, state index i_st, first and
    end chunk, sequence). Packed sequences (B = 1): program i_nh = n·H + h walks sequence n's
    chunks co[n] … co[n+1]."""
    if VARLEN:
        i_n = i_nh // H
        c_lo = tl.load(co + i_n)
        c_hi = tl.load(co + i_n + 1)
        return i_nh % H, i_nh, c_lo, c_hi, i_n
    else:
        return i_nh, i_nh, 0, NT, 0


@triton.jit
def _bounds(chunks, i_c, L, T, VARLEN: tl.constexpr):
    """Chunk i_c's token range [c0, c1) and its sequence (chunks: [NC, 3] int32 rows
    (start, end, sequence) for packed sequences)."""
    if VARLEN:
        c0 = tl.load(chunks + i_c * 3)
        c1 = tl.load(chunks + i_c * 3 + 1)
        return c0, c1, tl.load(chunks + i_c * 3 + 2)
    else:
        c0 = i_c * L
        return c0, tl.minimum(c0 + L, T), 0


@triton.jit
def _chunk_rows(chunks, i_cq, NQ, L, T, BQ: tl.constexpr, VARLEN: tl.constexpr):
    """Row tile i_cq % NQ of chunk i_cq // NQ (a program's first grid index): (i_c, c0, c1,
    i_n, r0, o_r, m_r) with rows o_r = r0 + [0, BQ), m_r = o_r < c1; r0 ≥ c1: an empty tile."""
    i_c = i_cq // NQ
    c0, c1, i_n = _bounds(chunks, i_c, L, T, VARLEN)
    r0 = c0 + (i_cq % NQ) * BQ
    o_r = r0 + tl.arange(0, BQ)
    return i_c, c0, c1, i_n, r0, o_r, o_r < c1
