"""Chunk-local cumulative sums of a per-channel log decay (GLA's gk and gv, RWKV6's w): the
first step of the vector-gate chunk engine, in one pass.

For each chunk [c0, c1) of a sequence, in fp32:

    inc_t = Σ_{c0 ≤ s ≤ t} g_s            exc_t = Σ_{c0 ≤ s < t} g_s = inc_{t−1}   (exc_{c0} = 0)

The exclusive sum (RWKV6 reads the state before its own step's decay) is the inclusive one
shifted by one step, value for value: each program stores a row tile of inc, then reads it
back one row up, so exp(exc_t − inc_{t−1}) is exactly 1 and no exponent the kernels form
from the pair is above 0. One program per (chunk, channel tile, b·h) walks its chunk in row
tiles, carrying the last row's sum (one pass instead of a PyTorch chain of a padded fp32 copy,
a cumsum and two slices).

``SPAN`` also records each chunk's span, max over channels of (max − min) of every value the
kernels read as G^X or G^K in that chunk (the inclusive sums, and the exclusive form's 0 at
the chunk start): ``[NT, B·H]`` fp32, zero-filled by the caller, raised by each channel tile
with an atomic max. A chunk whose span is small is formed as one product around its middle
(vector_scores_kernels' fast chunks). A non-finite sum (a NaN or inf gate) makes the span +inf:
that middle would carry it to the chunk's earlier rows, the sub-chunk forms do not.

``GATE_QK`` also stores the gated queries and keys that the walking state kernels and the
stored-scores apply kernels take into their products, in the inputs' dtype, computed as
those kernels computed them (vector_common._vec_scale_rows, _vec_to_end), so the result is
the same, bit for bit:

    QG_t = q_t ⊙ exp(G^X_t)          KG_t = k_t ⊙ exp(G^K_{c1−1} − G^K_t)

(G^X the exclusive sum with ``EXCL``, else the inclusive one; G^K the inclusive one, the
chunk's last row as stored). Each factor is ≤ 1. It saves those four kernels their gate
tiles and exponentials (the apply kernels formed them once per output tile).
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import _bounds
from linrnn.engine.vector_common import _gate, _ld_row


@triton.jit(do_not_specialize=["T", "NT"])
def chunk_cumsum_kernel(
    G, INC, EXC, SPAN, CHUNKS, Q, K_, QG, KG, T, H, D, L,
    BT: tl.constexpr, BD: tl.constexpr, VARLEN: tl.constexpr, EXCL: tl.constexpr,
    HAS_SPAN: tl.constexpr, GATE_QK: tl.constexpr,
):  # fmt: skip
    """Grid (chunks, channel tiles, B·H). G ``[B, T, H, D]`` (any float dtype); INC and, with
    ``EXCL``, EXC ``[B, T, H, D]`` fp32; ``HAS_SPAN``: SPAN ``[NT, B·H]`` fp32; ``GATE_QK``:
    QG and KG from Q and K_ (all ``[B, T, H, D]``, the inputs' dtype) (module doc). The
    pointers a call does not use are None."""
    i_c, i_d, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    c0, c1, _seq_c = _bounds(CHUNKS, i_c, L, T, VARLEN)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    base = (i_b * T * H + i_h) * D
    carry = tl.zeros([BD], dtype=tl.float32)
    top = carry  # the exclusive form's 0 at the chunk start counts (G^X_{c0} = 0)
    if not EXCL:
        top = tl.full([BD], float("-inf"), tl.float32)
    bot = tl.full([BD], float("inf"), tl.float32)
    for j in range(0, tl.cdiv(c1 - c0, BT)):  # row tiles from the chunk's start
        o_t = c0 + j * BT + tl.arange(0, BT)
        m_t = o_t < c1
        m = m_t[:, None] & m_d[None, :]
        p = base + o_t.to(tl.int64)[:, None] * H * D + o_d[None, :]
        x = tl.load(G + p, mask=m, other=0.0).to(tl.float32)
        inc = tl.cumsum(x, 0) + carry[None, :]
        tl.store(INC + p, inc, mask=m)
        # the tile's last row, as stored (a full tile's; a partial one ends the chunk)
        carry = tl.sum(tl.where((tl.arange(0, BT) == BT - 1)[:, None], inc, 0.0), 0)
        if HAS_SPAN:
            top = tl.maximum(top, tl.max(tl.where(m, inc, float("-inf")), 0))
            bot = tl.minimum(bot, tl.min(tl.where(m, inc, float("inf")), 0))
        g_x = inc
        if EXCL:
            tl.debug_barrier()  # this tile's inc rows, stored by other threads, are visible
            prev = tl.load(INC + p - H * D, mask=m & (o_t > c0)[:, None], other=0.0)
            tl.store(EXC + p, prev, mask=m)
            g_x = prev
        if GATE_QK:
            tl.store(QG + p, _gate(tl.load(Q + p, mask=m, other=0.0), g_x, m), mask=m)
    if GATE_QK:  # a second walk: the keys' factors need the chunk's last row, as stored
        tl.debug_barrier()  # every inc row stored by this program is visible
        g_last = _ld_row(INC + base, c1 - 1, o_d, H * D, m_d & (o_d * 0 + c1 > c0))
        for j in range(0, tl.cdiv(c1 - c0, BT)):
            o_t = c0 + j * BT + tl.arange(0, BT)
            m = (o_t < c1)[:, None] & m_d[None, :]
            p = base + o_t.to(tl.int64)[:, None] * H * D + o_d[None, :]
            g_k = tl.load(INC + p, mask=m, other=0.0)
            b_k = tl.load(K_ + p, mask=m, other=0.0)
            tl.store(KG + p, _gate(b_k, g_last[None, :] - g_k, m), mask=m)
    if HAS_SPAN and c1 > c0:
        span = tl.max(tl.where(m_d, top - bot, 0.0), 0)
        # A non-finite gate makes its channel's total (carry) non-finite, and 0·x summed over
        # the totals NaN: the span is then +inf, never NaN (unordered in the atomic max), so
        # the chunk takes the exact form.
        fin = tl.sum(carry * 0.0, 0)
        span = tl.where(fin == fin, span, float("inf"))
        tl.atomic_max(SPAN + i_c * tl.num_programs(2) + i_bh, span)
