"""The per-channel log-decay gradient of chunk mode in one pass (GLA's gk, RWKV6's w).

With QD = q ⊙ dq and KD = k ⊙ dk per step ([B, T, H, D] fp32, stored by the dq and dk
kernels), the gradient of the cumulative log decay at step t is the sum over the later steps
of t's chunk, restarted at the chunk end from the exact tail W_c = Σ_v dS_c+1 ⊙ S_c+1
(states_bwd's boundary terms):

    dg_t = Σ_{u ≥ t, u in t's chunk} (QD_u − KD_u) + W_c.

RWKV6 reads the decay exclusively: its query term is q ⊙ dq less the bonus part u ⊙ w_t, with
w_t = scale·q_t ⊙ k_t (do_t·v_t), so dg_t loses QD_t and gains u ⊙ w_t, and ∂L/∂u = Σ w_t.

One program per (chunk, channel tile, b·h) walks its chunk from the end in row tiles, carrying
the running sum, instead of a chain of full-size PyTorch passes (the difference, a padded copy,
two flips, the cumsum, the tail, the bonus terms). The partial sums of w go to one row per
program and are summed on the host side in a fixed order (no atomics: the result is
deterministic).
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import _bounds


@triton.jit(do_not_specialize=["T", "NT"])
def decay_grad_kernel(
    QD, KD, W, Q, K, DOV, U, DG, DU, CHUNKS, T, H, D, L, NT, scale,
    BT: tl.constexpr, BD: tl.constexpr, VARLEN: tl.constexpr, EXCL: tl.constexpr,
):  # fmt: skip
    """Grid (chunks, channel tiles, B·H). QD, KD, DG ``[B, T, H, D]`` fp32; W ``[B·H, NT, D]``
    fp32; ``EXCL``: Q, K ``[B, T, H, D]`` (any float dtype), DOV ``[B, T, H]`` fp32 (do·v), U
    ``[H, D]`` fp32 and DU ``[B·H, NT, D]`` fp32 (the chunk's Σ w), else None."""
    i_c, i_d, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    c0, c1, _seq_c = _bounds(CHUNKS, i_c, L, T, VARLEN)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    row = (i_bh * NT + i_c) * D
    carry = tl.load(W + row + o_d, mask=m_d, other=0.0)  # [BD] the tail after the chunk
    b_u = tl.zeros([BD], dtype=tl.float32)
    du = tl.zeros([BD], dtype=tl.float32)
    if EXCL:
        b_u = tl.load(U + i_h * D + o_d, mask=m_d, other=0.0)
    base = (i_b * T * H + i_h) * D
    for j in range(0, tl.cdiv(c1 - c0, BT)):  # row tiles from the chunk's end
        o_t = c1 - (j + 1) * BT + tl.arange(0, BT)
        m_t = o_t >= c0
        m = m_t[:, None] & m_d[None, :]
        p = base + o_t.to(tl.int64)[:, None] * H * D + o_d[None, :]
        qd = tl.load(QD + p, mask=m, other=0.0)
        x = qd - tl.load(KD + p, mask=m, other=0.0)
        dg = tl.cumsum(x, 0, reverse=True) + carry[None, :]
        carry += tl.sum(x, 0)
        if EXCL:
            dov = tl.load(DOV + (i_b * T + o_t.to(tl.int64)) * H + i_h, mask=m_t, other=0.0)
            b_q = tl.load(Q + p, mask=m, other=0.0).to(tl.float32)
            b_k = tl.load(K + p, mask=m, other=0.0).to(tl.float32)
            w = b_q * b_k * (dov * scale)[:, None]
            dg += b_u[None, :] * w - qd
            du += tl.sum(w, 0)
        tl.store(DG + p, dg, mask=m)
    if EXCL:
        tl.store(DU + row + o_d, du, mask=m_d)
