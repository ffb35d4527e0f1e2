"""The scalar-gate engine's first pass: each chunk's cumulative log decay, as the kernels read it.

For a scalar log decay g ``[B, T, H]`` and every chunk [c0, c1) of a sequence, in fp32::

    b_t = Σ_{c0 ≤ s ≤ t} g_s                                   (c0 ≤ t < c1)

stored as rows ``[B·H, T]`` (row b·h; packed sequences: B = 1 and the chunks come from the
chunk table). One program per (block of CH chunks, b·h) loads a [CH, BL] tile whose rows are
chunks, scans it along the rows and carries each row's last sum into its next column tile when
L > BL. It replaces a transpose, a padded copy and a PyTorch cumsum over [B·H·NT, L] rows,
whose scan kernel took 0.38 ms at B = 8, T = 8192, H = 64, L = 64 on an H200 (the whole
scalar-gate forward there is about 2 ms).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _max2(x, y):
    return tl.maximum(x, y)


@triton.jit(do_not_specialize=["T", "NT"])
def chunk_cumsum_kernel(
    G, OUT, CHUNKS, T, H, L, NT, s_b, s_t, s_h,
    CH: tl.constexpr, BL: tl.constexpr, VARLEN: tl.constexpr,
    A=None, RMAX=None, HAS_RMAX: tl.constexpr = False,
):  # fmt: skip
    """Grid (cdiv(NT, CH), B·H). G ``[B, T, H]`` (any float dtype, element strides s_b, s_t,
    s_h); OUT ``[B·H, T]`` fp32; CHUNKS the packed chunk table (rows (start, end, sequence),
    int32) with ``VARLEN``, else unused. ``HAS_RMAX`` (mLSTM-exp's max state): also the
    running maximum within each chunk of a_s − b_s (A the log input gate rows ``[B·H, T]``
    fp32), RMAX ``[B·H, T]`` fp32: RMAX_t = max_{c0 ≤ s ≤ t} (a_s − b_s), from the b stored."""
    i_cb, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = i_cb * CH + tl.arange(0, CH)  # this program's chunks
    m_c = o_c < NT
    if VARLEN:
        c0 = tl.load(CHUNKS + o_c * 3, mask=m_c, other=0)
        c1 = tl.load(CHUNKS + o_c * 3 + 1, mask=m_c, other=0)
    else:
        c0 = o_c * L
        c1 = tl.where(m_c, tl.minimum(c0 + L, T), 0)
    c0 = c0.to(tl.int64)
    c1 = c1.to(tl.int64)
    g = G + i_b * s_b + i_h * s_h
    out = OUT + i_bh * T
    carry = tl.zeros([CH], dtype=tl.float32)
    rcarry = tl.full([CH], float("-inf"), dtype=tl.float32)
    last = tl.arange(0, BL)[None, :] == BL - 1
    for j0 in range(0, L, BL):
        o_t = c0[:, None] + j0 + tl.arange(0, BL)[None, :]  # [CH, BL] token indices
        m_t = o_t < c1[:, None]
        x = tl.load(g + o_t * s_t, mask=m_t, other=0.0).to(tl.float32)
        y = tl.cumsum(x, 1) + carry[:, None]
        tl.store(out + o_t, y, mask=m_t)
        # the last column's sum, selected (exact), so the next tile continues from the value
        # stored; masked-out columns add 0 and leave it unchanged
        carry = tl.sum(tl.where(last, y, 0.0), 1)
        if HAS_RMAX:  # masked-out columns: −inf, which leaves the running maximum unchanged
            z = tl.where(m_t, tl.load(A + i_bh * T + o_t, mask=m_t, other=0.0) - y, float("-inf"))
            r = tl.maximum(tl.associative_scan(z, 1, _max2), rcarry[:, None])
            tl.store(RMAX + i_bh * T + o_t, r, mask=m_t)
            rcarry = tl.max(tl.where(last, r, float("-inf")), 1)
