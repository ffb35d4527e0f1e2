"""Chunk mode's scalar gate gradients in one pass: the log-decay gradient restarted at every
chunk end, and mLSTM-exp's routing of the max state's gradient (gate_grads.py has the math).

Per row (b·h, or one packed sequence of one head), with D_t = q_t·dq_t − k_t·dk_t and W_c the
exact boundary term of chunk c (states_bwd's ``bnd``):

    dg_t = Σ_{u ≥ t, u in t's chunk} D_u + W_c  (+ the routing part below)
    da_t = k_t·dk_t                              (+ the routing part below)

The max state: m_t = b_t + max(m_c, max_{s ≤ t in chunk} (a_s − b_s)) in chunk c's own frame
(b the chunk-local cumulative log decay, m_c the max state entering the chunk, as the forward
kept it). Step t is a *record* when a_t − b_t reaches that running max (ties go to the later
step, as torch.cummax). ∂L/∂m_t (dm_t) flows to the decays of the steps since the record
behind m_t and to that record's log input gate. With B_t = Σ_{u=t}^{r−1} dm_u, r the first
record after t (the sequence end counts as none, and the final state's term ``tail`` sits just
past the end):

    dg_t += B_t where t is no record,   da_t += B_t where it is one,

and ∂L/∂m_0 collects B at the first step when that step is no record. B is a reverse scan
of affine maps x ↦ dm_t + k_t·x (k_t = 0 when t + 1 is a record), so one program walks its
sequence from the end in tiles of NC chunks × L steps, carrying B: within a chunk the running
max and the maps are scans along the tile's rows (stored latest step first, so that the
non-commutative scan runs forward), across the chunks of a tile a scan of the chunks'
composite maps. Without the max state each tile stands alone and the programs split the
sequence. Everything is fp32, as the kernels' partial sums it reads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import _bounds, _walk


@triton.jit
def _max2(x, y):
    return tl.maximum(x, y)


@triton.jit
def _then(c1, k1, c2, k2):
    """The affine map x ↦ c2 + k2·x after x ↦ c1 + k1·x (the earlier element of the scan is
    the later step of the sequence)."""
    return c2 + k2 * c1, k2 * k1


@triton.jit(do_not_specialize=["T", "NT", "NSEQ"])
def gate_grad_kernel(
    QD, KD, BND, G, GI, MC, DM, TAIL, DG, DA, DM0, CO, CHUNKS, T, H, L, NT, NSEQ,
    NC: tl.constexpr, LP: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_MAX: tl.constexpr,
    HAS_DM: tl.constexpr, HAS_TAIL: tl.constexpr, HAS_M0: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (spans, N·H): ``HAS_MAX``: one span, the whole sequence; else span i_s holds the
    sequence's chunks [NC·i_s, NC·(i_s + 1)). Rows ``[B·H, T]`` fp32: QD (q·dq, with
    ``HAS_DECAY``), KD (k·dk), G (b), GI (a), DM (∂L/∂m_t, ``HAS_DM``), DG, DA (``HAS_MAX``);
    BND ``[B·H, NT]``; MC ``[B·H, NT + NSEQ]`` (the max state entering chunk i_c of sequence n
    at i_c + n); TAIL, DM0 ``[N·H]`` (the final state's term; the routed ∂L/∂m_0)."""
    i_s, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_bh, i_st, c_lo, c_hi, i_n = _walk(CO, i_nh, H, NT, VARLEN)
    # the sequence's first step and end (an empty sequence reads a valid row, unused)
    s_start = _bounds(CHUNKS, tl.minimum(c_lo, NT - 1), L, T, VARLEN)[0]
    s_end = _bounds(CHUNKS, tl.maximum(c_hi - 1, 0), L, T, VARLEN)[1]
    if not HAS_MAX:
        c_lo = c_lo + i_s * NC
        c_hi = tl.minimum(c_hi, c_lo + NC)
    row = i_bh * T
    o_r = tl.arange(0, NC)  # tile rows: chunks, the latest first
    o_p = tl.arange(0, LP)  # tile columns: steps of a chunk, the latest first
    carry = tl.zeros([NC], dtype=tl.float32).sum(0)  # B just past the tile (a scalar tensor)
    if HAS_TAIL:
        carry += tl.load(TAIL + i_st)
    first_rec = carry * 0.0  # 1 when the sequence's first step is a record
    for j in range(0, tl.cdiv(c_hi - c_lo, NC)):
        i_c = c_hi - 1 - j * NC - o_r  # [NC]
        m_c = i_c >= c_lo
        i_c = tl.where(m_c, i_c, c_lo)
        c0, c1, _seq = _bounds(CHUNKS, i_c, L, T, VARLEN)
        t = c1[:, None] - 1 - o_p[None, :]  # [NC, LP]
        m = m_c[:, None] & (t >= c0[:, None])
        t = tl.where(m, t, c0[:, None])
        p = row + t
        kd = tl.load(KD + p, mask=m, other=0.0)
        if HAS_DECAY:  # the chunk-local reverse sums (the tile's rows run backward in time)
            dg = tl.cumsum(tl.load(QD + p, mask=m, other=0.0) - kd, 1)
            dg += tl.load(BND + i_bh * NT + i_c, mask=m_c, other=0.0)[:, None]
        if HAS_MAX:
            z = tl.load(GI + p, mask=m, other=0.0)
            if HAS_DECAY:
                z -= tl.load(G + p, mask=m, other=0.0)
            z = tl.where(m, z, float("-inf"))
            m_in = tl.load(MC + i_bh * (NT + NSEQ) + i_c + i_n, mask=m_c, other=0.0)
            run = tl.maximum(m_in[:, None], tl.associative_scan(z, 1, _max2, reverse=True))
            rec = m & (z >= run)
            # whether the step after t is a record: in t's chunk against the same running
            # max, or the next chunk's first step against the max state entering it
            t1 = t + 1
            m1 = m & (t1 < s_end)
            z1 = tl.load(GI + row + t1, mask=m1, other=0.0)
            if HAS_DECAY:
                z1 -= tl.load(G + row + t1, mask=m1, other=0.0)
            m_next = tl.load(MC + i_bh * (NT + NSEQ) + i_c + 1 + i_n, mask=m_c, other=0.0)
            thr = tl.where(o_p[None, :] == 0, m_next[:, None], run)
            rec1 = m1 & (z1 >= thr)
            dm = tl.zeros([NC, LP], dtype=tl.float32)
            if HAS_DM:
                dm = tl.load(DM + p, mask=m, other=0.0)
            k = tl.where(rec1, 0.0, 1.0)
            c_t, k_t = tl.associative_scan((dm, k), 1, _then)  # B_t = c_t + k_t·B(c1)
            # each chunk's composite map (masked steps are identities), then the B entering
            # each chunk: the scan of the composites from the tile's latest chunk
            last = o_p[None, :] == LP - 1
            c_r = tl.sum(tl.where(last, c_t, 0.0), 1)
            k_r = tl.sum(tl.where(last, k_t, 0.0), 1)
            c_s, k_s = tl.associative_scan((c_r, k_r), 0, _then)
            b_start = c_s + k_s * carry  # [NC] B at each chunk's first step
            prev = o_r[:, None] - 1 == o_r[None, :]
            b_in = tl.sum(tl.where(prev, b_start[None, :], 0.0), 1)
            b_in = tl.where(o_r == 0, carry, b_in)
            b_t = c_t + k_t * b_in[:, None]
            if HAS_DECAY:
                dg += tl.where(rec, 0.0, b_t)
            tl.store(DA + p, kd + tl.where(rec, b_t, 0.0), mask=m)
            carry = tl.sum(tl.where(o_r == NC - 1, b_start, 0.0), 0)
            at_start = m & (t == s_start)
            first_rec += tl.sum(tl.sum(tl.where(at_start & rec, 1.0, 0.0), 1), 0)
        if HAS_DECAY:
            tl.store(DG + p, dg, mask=m)
    if HAS_M0:
        tl.store(DM0 + i_st, tl.where(first_rec > 0, 0.0, carry))
