"""The scalar engine's dv kernel for q/k groups (Mamba2's B/C groups): one program forms a
chunk's raw intra-chunk scores B_s·C_rᵀ once and applies them to several value heads of the
group (docs/DESIGN.md §11).

In the per-head kernel of :mod:`linrnn.engine.scalar_kernels` (``dv_bwd_kernel``) every value
head forms the scores of its q/k head again, though only the decay weights
D^h_rs = exp(b^h_r − b^h_s + a^h_s) and the output gradients differ per head: at N = K = 128
and P = V = 64 that is about half of its tensor-core work. Here a program takes one (chunk, key
tile, V tile) and ``HPP`` consecutive value heads of one group; it keeps the raw fp32 scores of
the tiles it needs in registers (key tile s: the query tiles r ≥ s of the chunk; a chunk has at
most two time tiles, ``TWO``) and loops over its heads, each with its own gates, chunk state
gradient and output gradients. Per head the numbers are formed as in the per-head kernel (the
same depth order of the fp32 sums, the same exponent forms, every exponent ≤ 0, masks by
where), so the results are that kernel's to the bit where both run the same instructions. (The
output has no such kernel: measured, the per-head output kernel is faster at every group size.)

Scalar gates without the max state and without the normalizer (``HAS_DECAY``: g, the rows of
the chunk-local cumulative log decay b; ``HAS_IGATE``: gi, the rows of the log input gate a);
``HAS_SKIP``: Mamba2's skip term skip[h]·v (D·x) and its gradients. Layouts as in
:mod:`linrnn.engine.scalar_kernels`: q, k ``[B, T, H/G, K]``, v, o, do, dv ``[B, T, H, V]``,
gates ``[B·H, T]`` fp32, chunk states and their gradients ``[B·H, NT, K, V]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import (
    _chunk_rows,
    _log_weights,
    _state_tile,
    _tile,
    _tile_t,
    _vec,
)


@triton.jit
def _scores(p_x, p_y, o_r, m_r, o_s, m_s, D, s_x, BT: tl.constexpr, BD: tl.constexpr,
            DOT_PREC: tl.constexpr):  # fmt: skip
    """x_r·y_s [BT, BT] fp32 over the depth D (row stride s_x of x and y), summed over depth
    tiles in order, as the per-head kernels sum them."""
    b_p = tl.zeros([BT, BT], dtype=tl.float32)
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_r, o_d, s_x, m_r, m_d)  # [BT, BD]
        b_yt = _tile_t(p_y, o_s, o_d, s_x, m_s, m_d)  # [BD, BT]
        b_p += tl.dot(b_x, b_yt, input_precision=DOT_PREC)
    return b_p


@triton.jit
def _inter(p_x, p_s, o_r, m_r, o_o, m_o, D, s_x, s_sd, s_so, BT: tl.constexpr, BO: tl.constexpr,
           BD: tl.constexpr, ND: tl.constexpr, DOT_PREC: tl.constexpr):  # fmt: skip
    """x_r S [BT, BO] fp32: rows o_r of x against a chunk state (or its gradient) S at p_s with
    element strides (s_sd, s_so), S cast to x's dtype for the product; ND = cdiv(D, BD) depth
    tiles, unrolled (so that the kernels' loop over heads is the innermost loop, which Triton
    pipelines)."""
    b_acc = tl.zeros([BT, BO], dtype=tl.float32)
    for i_d in tl.static_range(ND):
        o_d = i_d * BD + tl.arange(0, BD)
        m_d = o_d < D
        b_x = _tile(p_x, o_r, o_d, s_x, m_r, m_d)  # [BT, BD]
        b_s = _state_tile(p_s, o_d, o_o, s_sd, s_so, m_d, m_o)  # [BD, BO]
        b_acc += tl.dot(b_x, b_s.to(b_x.dtype), input_precision=DOT_PREC)
    return b_acc


@triton.jit
def _gate(ptr, i_bh, T, idx, mask, BT: tl.constexpr, HAS: tl.constexpr):
    """Row i_bh of a gate at idx (fp32, 0 where masked off); zeros without the gate."""
    if HAS:
        return _vec(ptr + i_bh * T, idx, mask)
    else:
        return tl.zeros([BT], dtype=tl.float32)


@triton.jit(do_not_specialize=["T", "NT", "NS"])
def group_dv_kernel(
    k, q, do, dh, g, gi, dv, chunks,
    T, H, G, K, V, L, NT, NS, scale,
    BS: tl.constexpr, BD: tl.constexpr, BO: tl.constexpr, ND: tl.constexpr, HPP: tl.constexpr,
    TWO: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_IGATE: tl.constexpr, DOT_PREC: tl.constexpr,
    VARLEN: tl.constexpr, v=None, skip=None, dskip=None, HAS_SKIP: tl.constexpr = False,
):  # fmt: skip
    """Grid (chunks × key tiles, V tiles, B·H / HPP): for each of the program's HPP value heads
    h (one group), dv^h_s = w^h_s k_s dC^h_c+1 + scale·Σ_{r≥s} D^h_rs (k_s·q_r) do^h_r of one
    key tile, w^h_s = exp(b_L − b_s + a_s), from the state gradients dh; the raw scores k_s·q_r
    formed once. ``TWO``: a chunk may have two key tiles (L > BS), so the first one also needs
    the query tile after it.

    ``HAS_SKIP``: plus skip[h]·do^h_s, and this tile's Σ do^h_s·v^h_s stored at dskip [B·H,
    chunks × key tiles, V tiles] fp32 (zeros where a tile is empty), as ``dv_bwd_kernel``."""
    i_cs, i_v, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    NP = H // HPP  # programs per batch row
    i_b, i_h0 = i_p // NP, (i_p % NP) * HPP  # the program's first value head
    i_c, _c0, c1, _i_n, s0, o_s, m_s = _chunk_rows(chunks, i_cs, NS, L, T, BS, VARLEN)
    if s0 >= c1:
        return
    o_v = i_v * BO + tl.arange(0, BO)
    m_v = o_v < V
    HK = H // G  # q/k heads: value head i_h reads q/k head i_h // G
    qk = (i_b * T * HK + i_h0 // G) * K
    p_k, p_q = k + qk, q + qk
    # The group's raw scores [BS (s), BS (r)]: the diagonal query tile, and (first key tile of a
    # two-tile chunk) the one after it
    b_m0 = _scores(p_k, p_q, o_s, m_s, o_s, m_s, K, HK * K, BS, BD, DOT_PREC)
    r1 = s0 + BS
    o_r = r1 + tl.arange(0, BS)
    m_r = o_r < c1
    if TWO:
        if r1 < c1:
            b_m1 = _scores(p_k, p_q, o_s, m_s, o_r, m_r, K, HK * K, BS, BD, DOT_PREC)
        else:
            b_m1 = tl.zeros([BS, BS], dtype=tl.float32)
    diag = (o_s[:, None] >= o_s[None, :]) & m_s[:, None]  # [BS (r), BS (s)]
    after = (o_r[:, None] >= o_s[None, :]) & m_r[:, None]
    b_m = tl.zeros([BS], dtype=tl.float32)  # (no max state)
    tiles = tl.num_programs(0) * tl.num_programs(1)
    for j in range(HPP):
        i_h = i_h0 + j
        i_bh = i_b * H + i_h
        vo = (i_b * T * H + i_h) * V
        b_bs = _gate(g, i_bh, T, o_s, m_s, BS, HAS_DECAY)
        b_as = _gate(gi, i_bh, T, o_s, m_s, BS, HAS_IGATE)
        lw = b_as - b_bs
        if HAS_DECAY:
            lw += tl.load(g + i_bh * T + c1 - 1)
        w_s = tl.exp(tl.where(m_s, lw, float("-inf")))  # [BS], ≤ 1
        b_int = _inter(p_k, dh + (i_bh * NT + i_c) * K * V, o_s, m_s, o_v, m_v, K, HK * K, V, 1,
                       BS, BO, BD, ND, DOT_PREC)  # fmt: skip
        b_d = _log_weights(b_bs, b_bs, b_as, b_m, diag, HAS_DECAY, HAS_IGATE, False)
        b_mt = b_m0 * tl.trans(b_d)
        b_dos = _tile(do + vo, o_s, o_v, H * V, m_s, m_v)  # [BS, BO]
        b_acc = tl.zeros([BS, BO], dtype=tl.float32)
        b_acc += tl.dot(b_mt.to(b_dos.dtype), b_dos, input_precision=DOT_PREC)
        if TWO:
            if r1 < c1:
                b_br = _gate(g, i_bh, T, o_r, m_r, BS, HAS_DECAY)
                b_d = _log_weights(b_br, b_bs, b_as, b_m, after, HAS_DECAY, HAS_IGATE, False)
                b_mt = b_m1 * tl.trans(b_d)
                b_dor = _tile(do + vo, o_r, o_v, H * V, m_r, m_v)
                b_acc += tl.dot(b_mt.to(b_dor.dtype), b_dor, input_precision=DOT_PREC)
        b_dv = b_acc * scale + b_int * w_s[:, None]
        if HAS_SKIP:
            b_dof = b_dos.to(tl.float32)
            b_dv = tl.fma(tl.load(skip + i_h), b_dof, b_dv)  # as the per-head dv kernel
            b_x = _tile(v + vo, o_s, o_v, H * V, m_s, m_v).to(tl.float32)
            b_dskip = tl.sum(tl.sum(b_dof * b_x, 1), 0)
            tl.store(dskip + i_bh * tiles + i_cs * tl.num_programs(1) + i_v, b_dskip)
        p_dv = dv + vo + o_s.to(tl.int64)[:, None] * H * V + o_v[None, :]
        tl.store(p_dv, b_dv.to(dv.dtype.element_ty), mask=m_s[:, None] & m_v[None, :])
