"""Triton kernels of the recurrent form (``mode="recurrent"`` and the step API for decoding): one
pass over time per (sequence, head, tile) with the state in registers, for every family.

    S_t = diag(α_t) S_{t-1} diag(β_t) + ι_t k_t v_tᵀ,   o_t = scale · q_tᵀ S_t
    (exclusive, RWKV6: o_t = scale · q_tᵀ (S_{t-1} + diag(u) k_t v_tᵀ))

α_t is exp(g_t) (a scalar, ``g`` [B, T, H]) or exp(gk_t) (per key channel, ``gk`` [B, T, H, K]),
β_t = exp(gv_t) (per value channel), ι_t = exp(gi_t) (a log input gate). mLSTM-exp
(``STABILIZE``) keeps the max state m_t = max(g_t + m_{t-1}, gi_t) and scales every term by
exp(−m_t). ``NORM`` picks the normalizer of the output (0 none, 1 sum, 2 mLSTM with a sigmoid
gate, 3 mLSTM with the max state; see ``_inv_denominator``), which tracks
n_t = α_t n_{t-1} + ι_t k_t.

* ``recurrent_fwd_kernel``      grid (V tiles, N·H): the forward, the whole key dimension held.
* ``recurrent_bwd_kernel_dq``   grid (K tiles, N·H), S recomputed walking forward:
  dq_t = scale·(S_t dO_t + dd_t n_t) (exclusive: S_{t-1} dO_t plus the bonus term).
* ``recurrent_bwd_kernel_dk``   grid (K tiles, N·H), dS walking backward with the whole V: dk,
  du and the initial-state gradients.
* ``recurrent_bwd_kernel_dv``   grid (V tiles, N·H), the same walk with the whole K: dv.

In the backward, dS_{t-1} = α_t dS_t β_t (+ scale·q_t dO_tᵀ, added before the read for the
inclusive form and after it for the exclusive one); dO_t is the cotangent of the unnormalized
output (r_a·dh_t, r_a = 1/denominator) and dd_t that of the denominator. The kernels also store
the per-channel pieces of the gate gradients, q⊙dq, k⊙dk and v⊙dv (state parts only for the
exclusive form, q's shifted one step back since q_{t+1} reads the decay of step t), which the
host turns into ∂L/∂g by reverse cumulative sums.

Layout: q, k ``[B, T, H/G, K]`` (G value heads per q/k head: value head h reads q/k head
h // G, Mamba2's B, C groups; G = 1 for the other families), gk, dq, dk and the per-channel
products ``[B, T, H, K]`` (per value head: the host sums dq, dk over each group), v, o, gv
``[B, T, H, V]``, g, gi ``[B, T, H]``, u ``[H, K]``;
states h ``[N, H, K, V]``, n ``[N, H, K]``, m ``[N, H]`` (fp32); per-step rows (den, m_row, r_a,
r_d) ``[B·H, T]`` fp32. Packed sequences (``cu_seqlens``, B = 1): one program row per sequence.
Optional pointers are None when their ``HAS_*``/``STORE_*`` switch is off.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import (
    _inv_denominator,
    _log_sigmoid,
    _softplus_parts,
    _start_state,
)


@triton.jit
def _seq_span(cu_seqlens, i_n, T, IS_VARLEN: tl.constexpr):
    """Sequence i_n's first token row in [B·T] and its number of steps."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        n_steps = (tl.load(cu_seqlens + i_n + 1) - bos).to(tl.int32)
    else:
        bos = i_n * T
        n_steps = T
    return bos, n_steps


@triton.jit
def _program(cu_seqlens, T, H, IS_VARLEN: tl.constexpr):
    """This program's tile (grid axis 0), its state row i_nh (sequence, head) and head i_h,
    and its sequence's first token row in [B·T] and number of steps."""
    i_tile, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_h = i_nh % H
    bos, n_steps = _seq_span(cu_seqlens, i_nh // H, T, IS_VARLEN)
    return i_tile, i_nh, i_h, bos, n_steps


@triton.jit
def _tile(i_tile, K, V, BK: tl.constexpr, BV: tl.constexpr, SPLIT_K: tl.constexpr):
    """Offsets and masks over K [BK] and V [BV]: tile i_tile of K (``SPLIT_K``) or of V, the
    other dimension held whole."""
    if SPLIT_K:
        o_k, o_v = i_tile * BK + tl.arange(0, BK), tl.arange(0, BV)
    else:
        o_k, o_v = tl.arange(0, BK), i_tile * BV + tl.arange(0, BV)
    return o_k, o_v, o_k < K, o_v < V


@triton.jit
def _step_index(bos, t, T, H, G, i_h, K, V):
    """Step t's token row in [B·T], its [B·H, T] row index, and the offsets of its q/k row
    (q/k head i_h // G of H / G), of its K row of head i_h (gk, dq, dk) and of its v row."""
    row = bos + t
    rid = (row // T * H + i_h) * T + row % T
    p_in = (row * (H // G) + i_h // G) * K
    return row, rid, p_in, (row * H + i_h) * K, (row * H + i_h) * V


@triton.jit
def _load_bonus(u, i_h, o_k, m_k, K, HAS_U: tl.constexpr):
    """RWKV6's bonus u of head i_h over this K tile [BK] (zeros without it)."""
    if HAS_U:
        b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    else:
        b_u = tl.zeros(o_k.shape, tl.float32)
    return b_u


@triton.jit
def _store_state(p, b_h, i_nh, o_k, o_v, m_k, m_v, K, V):
    """Write this program's [BK, BV] tile of state i_nh into p [N·H, K, V]."""
    p_h = p + i_nh * K * V + o_k[:, None] * V + o_v[None, :]
    tl.store(p_h, b_h, mask=m_k[:, None] & m_v[None, :])


@triton.jit
def _m_start(m0, i_nh, STABILIZE: tl.constexpr, HAS_H0: tl.constexpr):
    """The initial max state m_0 of head i_nh (−∞ without a state, as a tensor so that a loop
    carries one type)."""
    if STABILIZE and HAS_H0:
        b_m = tl.load(m0 + i_nh).to(tl.float32)
    else:
        b_m = tl.max(tl.full([2], float("-inf"), tl.float32), 0)
    return b_m


@triton.jit
def _load_step(q, k, v, p_in, p_v, o_k, m_k, o_v, m_v):
    """q_t, k_t [BK] and v_t [BV] of one step as fp32."""
    b_q = tl.load(q + p_in + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(k + p_in + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_v = tl.load(v + p_v + o_v, mask=m_v, other=0.0).to(tl.float32)
    return b_q, b_k, b_v


@triton.jit
def _load_dh(do, r_a, r_d, p_v, o_v, m_v, rid, NORM: tl.constexpr):
    """This step's dO (dh times the normalizer's 1/denominator) and the denominator's
    gradient dd (0 without a normalizer)."""
    b_do = tl.load(do + p_v + o_v, mask=m_v, other=0.0).to(tl.float32)
    b_dd = 0.0
    if NORM != 0:
        b_do = b_do * tl.load(r_a + rid)
        b_dd = tl.load(r_d + rid)
    return b_do, b_dd


@triton.jit
def _step_decay(g, gk, gv, gi, m_row, row, rid, i_h, b_m, o_k, m_k, o_v, m_v, H, K, V,
                HAS_G: tl.constexpr, HAS_GK: tl.constexpr, HAS_GV: tl.constexpr,
                HAS_GI: tl.constexpr, STABILIZE: tl.constexpr):  # fmt: skip
    """Step ``row``'s decay over K [BK], over V [BV] and input weight, for the backward (the
    max state m_t comes from the forward's ``m_row``); and m_t (b_m unchanged without it)."""
    a_k = tl.full(o_k.shape, 1.0, tl.float32)
    a_v = tl.full(o_v.shape, 1.0, tl.float32)
    w = 1.0
    if STABILIZE:
        m_new = tl.load(m_row + rid)
        a_k = a_k * tl.exp(tl.load(g + row * H + i_h) + b_m - m_new)
        w = tl.exp(tl.load(gi + row * H + i_h) - m_new)
        b_m = m_new
    else:
        if HAS_G:
            a_k = a_k * tl.exp(tl.load(g + row * H + i_h))
        if HAS_GK:
            a_k = tl.exp(tl.load(gk + (row * H + i_h) * K + o_k, mask=m_k, other=0.0))
        if HAS_GV:
            a_v = tl.exp(tl.load(gv + (row * H + i_h) * V + o_v, mask=m_v, other=0.0))
        if HAS_GI:
            w = tl.exp(tl.load(gi + row * H + i_h))
    return a_k, a_v, w, b_m


@triton.jit
def _m_prev(m_row, rid, t, b_m0):
    """m_{t-1} in a backward walk: the forward's row, or m_0 at t = 0."""
    b_mp = tl.load(m_row + rid - 1, mask=t > 0, other=0.0)
    return tl.where(t > 0, b_mp, b_m0)


@triton.jit
def _bwd_step(q, k, v, do, g, gk, gv, gi, m_row, r_a, r_d, bos, t, i_h, b_m0, o_k, m_k, o_v,
              m_v, T, H, G, K, V, HAS_G: tl.constexpr, HAS_GK: tl.constexpr,
              HAS_GV: tl.constexpr, HAS_GI: tl.constexpr, STABILIZE: tl.constexpr,
              NORM: tl.constexpr):  # fmt: skip
    """What every backward kernel reads at step t: the offsets of head i_h's K row (dq, dk)
    and of its v row, q_t, k_t (of q/k head i_h // G), v_t, dO_t and dd_t
    (:func:`_load_dh`), and the step's decays and input weight (:func:`_step_decay`, m_{t-1}
    from the forward's rows)."""
    row, rid, p_in, p_hk, p_v = _step_index(bos, t, T, H, G, i_h, K, V)
    b_q, b_k, b_v = _load_step(q, k, v, p_in, p_v, o_k, m_k, o_v, m_v)
    b_do, b_dd = _load_dh(do, r_a, r_d, p_v, o_v, m_v, rid, NORM)
    b_mp = b_m0
    if STABILIZE:
        b_mp = _m_prev(m_row, rid, t, b_m0)
    a_k, a_v, w, _b_m = _step_decay(g, gk, gv, gi, m_row, row, rid, i_h, b_mp, o_k, m_k, o_v, m_v,
                                 H, K, V, HAS_G, HAS_GK, HAS_GV, HAS_GI, STABILIZE)  # fmt: skip
    return p_hk, p_v, b_q, b_k, b_v, b_do, b_dd, a_k, a_v, w


@triton.jit
def _scalar_gate(g, off, LOGSIG: tl.constexpr):
    """A step's scalar log gate at g + off in fp32: the value, or log σ of a pre-activation."""
    x = tl.load(g + off).to(tl.float32)
    if LOGSIG:
        x = _log_sigmoid(x)
    return x


@triton.jit(do_not_specialize=["T"])
def recurrent_fwd_kernel(
    q, k, v, o, g, gk, gv, gi, u, h0, n0, m0, ht, nt, mt, den, m_row, cu_seqlens,
    scale, eps, T, H, G, K, V,
    BK: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr, HAS_GK: tl.constexpr,
    HAS_GV: tl.constexpr, HAS_GI: tl.constexpr, HAS_U: tl.constexpr, HAS_H0: tl.constexpr,
    STABILIZE: tl.constexpr, TRACK_N: tl.constexpr, NORM: tl.constexpr,
    STORE_DEN: tl.constexpr, STORE_M: tl.constexpr, IS_VARLEN: tl.constexpr,
    skip=None, HAS_SKIP: tl.constexpr = False, s_g=0, dt=None, dt_bias=None, A=None,
    G_LOGSIG: tl.constexpr = False, HAS_DT: tl.constexpr = False,
    HAS_DT_BIAS: tl.constexpr = False, GI_LOGSIG: tl.constexpr = False,
    M0_FOLD: tl.constexpr = False,
):  # fmt: skip
    """Grid (V tiles, N·H), BK ≥ K. Writes o, the final state ht (and nt with ``TRACK_N``, mt
    with ``STABILIZE``; nt/mt only from the first V tile), and for the backward each step's
    denominator (``STORE_DEN``) and max state (``STORE_M``) in [B·H, T] rows. ht may be h0
    itself: each program reads its tile of the state before the loop and writes it after.
    ``HAS_SKIP``: plus the skip term skip[h]·v_t (skip [H] fp32, after the normalizer: Mamba2's
    D·x), as the chunk engine's output kernel adds it. ``s_g``: the token-row stride of the
    scalar decay g, H for a [B, T, H] tensor, 0 for one decay per head broadcast over B and T
    (retention: read in place, not copied per token).

    Gates formed here from their pre-activations (a decode step's one launch): ``G_LOGSIG``,
    g holds a forget gate's pre-activation f in any float dtype and the log decay is log σ(f)
    (mLSTM); ``GI_LOGSIG``, gi likewise an input gate's, log σ(i) (mLSTM's sigmoid gate);
    ``HAS_DT``, Mamba2's step sizes dt [B, T, H] with dt_bias (``HAS_DT_BIAS``) and A [H]:
    Δ = softplus(dt + dt_bias), the decay exp(Δ·A) and the input weight Δ (no g, gi).
    ``M0_FOLD`` (without ``STABILIZE``; mLSTM's sigmoid form from a state with a max part): the
    initial state is h0·exp(m0), and m0 joins each sequence's first log decay; mt gets 0 (m0 for
    a sequence without steps, whose state passes through unscaled)."""
    i_v, i_nh, i_h, bos, n_steps = _program(cu_seqlens, T, H, IS_VARLEN)
    o_k, o_v, m_k, m_v = _tile(i_v, K, V, BK, BV, False)
    b_h, b_n = _start_state(h0, n0, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_H0, TRACK_N, BK, BV)
    b_m = _m_start(m0, i_nh, STABILIZE, HAS_H0)
    b_u = _load_bonus(u, i_h, o_k, m_k, K, HAS_U)
    if HAS_DT:
        b_A = tl.load(A + i_h).to(tl.float32)
        b_bias = tl.load(dt_bias + i_h).to(tl.float32) if HAS_DT_BIAS else 0.0
    if M0_FOLD:
        b_m0 = tl.load(m0 + i_nh).to(tl.float32)
    for t in range(n_steps):
        row, rid, p_in, p_hk, p_v = _step_index(bos, t, T, H, G, i_h, K, V)
        b_q, b_k, b_v = _load_step(q, k, v, p_in, p_v, o_k, m_k, o_v, m_v)
        w_in = 1.0
        if STABILIZE:  # m_t = max(g_t + m_{t-1}, gi_t); all exponents ≤ 0
            b_g = _scalar_gate(g, row * s_g + i_h, G_LOGSIG)
            b_i = tl.load(gi + row * H + i_h)
            m_new = tl.maximum(b_g + b_m, b_i)
            b_f = tl.exp(b_g + b_m - m_new)
            b_h *= b_f
            b_n *= b_f
            w_in = tl.exp(b_i - m_new)
            b_m = m_new
            if STORE_M:
                tl.store(m_row + rid, b_m, mask=i_v == 0)
        else:
            if HAS_U:  # RWKV6 reads the state before this step's update, plus the bonus
                b_o = tl.sum(b_q[:, None] * b_h, 0) + tl.sum(b_q * b_u * b_k) * b_v
            if HAS_GI:
                w_in = tl.exp(_scalar_gate(gi, row * H + i_h, GI_LOGSIG))
            if HAS_G:
                b_lg = _scalar_gate(g, row * s_g + i_h, G_LOGSIG)
                if M0_FOLD:
                    b_lg += tl.where(t == 0, b_m0, 0.0)
                b_a = tl.exp(b_lg)
                b_h *= b_a
                b_n *= b_a
            if HAS_DT:
                w_in = _softplus_parts(tl.load(dt + row * H + i_h).to(tl.float32) + b_bias)[0]
                b_a = tl.exp(w_in * b_A)
                b_h *= b_a
                b_n *= b_a
            if HAS_GK:
                b_ak = tl.exp(tl.load(gk + p_hk + o_k, mask=m_k, other=0.0))
                b_h *= b_ak[:, None]
                b_n *= b_ak
            if HAS_GV:
                b_av = tl.exp(tl.load(gv + p_v + o_v, mask=m_v, other=0.0))
                b_h *= b_av[None, :]
        b_kw = b_k * w_in
        b_h += b_kw[:, None] * b_v[None, :]
        if TRACK_N:
            b_n += b_kw
        if not HAS_U:
            b_o = tl.sum(b_q[:, None] * b_h, 0)
        b_o *= scale  # [BV]
        if NORM != 0:
            b_den = tl.sum(b_q * b_n) * scale
            if STORE_DEN:
                tl.store(den + rid, b_den, mask=i_v == 0)
            b_o = b_o * _inv_denominator(b_den, b_m, eps, NORM)[0]
        if HAS_SKIP:
            b_o = tl.fma(tl.load(skip + i_h), b_v, b_o)
        tl.store(o + p_v + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    _store_state(ht, b_h, i_nh, o_k, o_v, m_k, m_v, K, V)
    if TRACK_N:
        tl.store(nt + i_nh * K + o_k, b_n, mask=m_k & ((o_k * 0 + i_v) == 0))
    if STABILIZE:
        tl.store(mt + i_nh, b_m, mask=i_v == 0)
    if M0_FOLD:
        tl.store(mt + i_nh, tl.where(n_steps == 0, b_m0, 0.0), mask=i_v == 0)


@triton.jit(do_not_specialize=["T"])
def recurrent_bwd_kernel_dq(
    q, k, v, do, g, gk, gv, gi, u, h0, n0, m0, m_row, r_a, r_d, dq, qdq, cu_seqlens,
    scale, T, H, G, K, V,
    BK: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr, HAS_GK: tl.constexpr,
    HAS_GV: tl.constexpr, HAS_GI: tl.constexpr, HAS_U: tl.constexpr, HAS_H0: tl.constexpr,
    STABILIZE: tl.constexpr, TRACK_N: tl.constexpr, NORM: tl.constexpr,
    STORE_QDQ: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (K tiles, N·H), BV ≥ V: dq, and q⊙dq (``STORE_QDQ``, zeros where not written)."""
    i_k, i_nh, i_h, bos, n_steps = _program(cu_seqlens, T, H, IS_VARLEN)
    o_k, o_v, m_k, m_v = _tile(i_k, K, V, BK, BV, True)
    b_h, b_n = _start_state(h0, n0, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_H0, TRACK_N, BK, BV)
    b_m0 = _m_start(m0, i_nh, STABILIZE, HAS_H0)
    b_u = _load_bonus(u, i_h, o_k, m_k, K, HAS_U)
    for t in range(n_steps):
        p_hk, _p_v, b_q, b_k, b_v, b_do, b_dd, a_k, a_v, w = _bwd_step(
            q, k, v, do, g, gk, gv, gi, m_row, r_a, r_d, bos, t, i_h, b_m0, o_k, m_k, o_v, m_v,
            T, H, G, K, V, HAS_G, HAS_GK, HAS_GV, HAS_GI, STABILIZE, NORM,
        )  # fmt: skip
        if HAS_U:
            b_dqs = tl.sum(b_h * b_do[None, :], 1) * scale
            b_dq = b_dqs + b_u * b_k * (tl.sum(b_v * b_do) * scale)
            if STORE_QDQ:  # q_t reads the decays up to t−1: stored at the previous token
                tl.store(qdq + p_hk - H * K + o_k, b_q * b_dqs, mask=m_k & (t > 0))
        b_h = b_h * a_k[:, None] * a_v[None, :] + (b_k * w)[:, None] * b_v[None, :]
        if TRACK_N:
            b_n = b_n * a_k + b_k * w
        if not HAS_U:
            b_dq = (tl.sum(b_h * b_do[None, :], 1) + b_dd * b_n) * scale
            if STORE_QDQ:
                tl.store(qdq + p_hk + o_k, b_q * b_dq, mask=m_k)
        tl.store(dq + p_hk + o_k, b_dq, mask=m_k)


@triton.jit(do_not_specialize=["T"])
def recurrent_bwd_kernel_dk(
    q, k, v, do, g, gk, gv, gi, u, m0, m_row, r_a, r_d, dht, dnt, dk, kdk, du, dh0, dn0,
    cu_seqlens, scale, T, H, G, K, V,
    BK: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr, HAS_GK: tl.constexpr,
    HAS_GV: tl.constexpr, HAS_GI: tl.constexpr, HAS_U: tl.constexpr, HAS_H0: tl.constexpr,
    STABILIZE: tl.constexpr, TRACK_N: tl.constexpr, NORM: tl.constexpr,
    HAS_DHT: tl.constexpr, STORE_KDK: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (K tiles, N·H), BV ≥ V, walking backward from the final state's cotangents (dht,
    dnt; zeros without ``HAS_DHT``): dk, k⊙dk (``STORE_KDK``), the bonus's per-head partial du
    [N·H, K] (``HAS_U``) and the initial state's gradients dh0, dn0."""
    i_k, i_nh, i_h, bos, n_steps = _program(cu_seqlens, T, H, IS_VARLEN)
    o_k, o_v, m_k, m_v = _tile(i_k, K, V, BK, BV, True)
    b_dh, b_dn = _start_state(dht, dnt, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_DHT, TRACK_N, BK,
                              BV)  # fmt: skip
    b_m0 = _m_start(m0, i_nh, STABILIZE, HAS_H0)
    b_u = _load_bonus(u, i_h, o_k, m_k, K, HAS_U)
    b_du = tl.zeros([BK], dtype=tl.float32)
    for j in range(n_steps):
        t = n_steps - 1 - j
        p_hk, _p_v, b_q, b_k, b_v, b_do, b_dd, a_k, a_v, w = _bwd_step(
            q, k, v, do, g, gk, gv, gi, m_row, r_a, r_d, bos, t, i_h, b_m0, o_k, m_k, o_v, m_v,
            T, H, G, K, V, HAS_G, HAS_GK, HAS_GV, HAS_GI, STABILIZE, NORM,
        )  # fmt: skip
        if HAS_U:  # dh holds ∂L/∂S_t; o_t read S_{t-1} and the bonus
            b_vdo = tl.sum(b_v * b_do)
            b_dks = tl.sum(b_dh * b_v[None, :], 1)
            b_dk = b_dks + b_u * b_q * (b_vdo * scale)
            b_du += b_q * b_k * b_vdo
            if STORE_KDK:
                tl.store(kdk + p_hk + o_k, b_k * b_dks, mask=m_k)
            b_dh = b_dh * a_k[:, None] * a_v[None, :] + (b_q * scale)[:, None] * b_do[None, :]
        else:
            b_dh += (b_q * scale)[:, None] * b_do[None, :]
            if TRACK_N:
                b_dn += b_q * (scale * b_dd)
            b_dk = (tl.sum(b_dh * b_v[None, :], 1) + b_dn) * w
            if STORE_KDK:
                tl.store(kdk + p_hk + o_k, b_k * b_dk, mask=m_k)
            b_dh = b_dh * a_k[:, None] * a_v[None, :]
            b_dn = b_dn * a_k
        tl.store(dk + p_hk + o_k, b_dk, mask=m_k)
    _store_state(dh0, b_dh, i_nh, o_k, o_v, m_k, m_v, K, V)
    if TRACK_N:
        tl.store(dn0 + i_nh * K + o_k, b_dn, mask=m_k)
    if HAS_U:
        tl.store(du + i_nh * K + o_k, b_du * scale, mask=m_k)


@triton.jit(do_not_specialize=["T"])
def recurrent_bwd_kernel_dv(
    q, k, v, do, g, gk, gv, gi, u, m0, m_row, r_a, r_d, dht, dnt, dv, vdv, cu_seqlens,
    scale, T, H, G, K, V,
    BK: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr, HAS_GK: tl.constexpr,
    HAS_GV: tl.constexpr, HAS_GI: tl.constexpr, HAS_U: tl.constexpr, HAS_H0: tl.constexpr,
    STABILIZE: tl.constexpr, TRACK_N: tl.constexpr, NORM: tl.constexpr,
    HAS_DHT: tl.constexpr, STORE_VDV: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (V tiles, N·H), BK ≥ K, the walk of :func:`recurrent_bwd_kernel_dk` for dv and
    v⊙dv (``STORE_VDV``)."""
    i_v, i_nh, i_h, bos, n_steps = _program(cu_seqlens, T, H, IS_VARLEN)
    o_k, o_v, m_k, m_v = _tile(i_v, K, V, BK, BV, False)
    b_dh, _b_dn0 = _start_state(dht, dnt, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_DHT, TRACK_N, BK, BV)
    b_m0 = _m_start(m0, i_nh, STABILIZE, HAS_H0)
    b_u = _load_bonus(u, i_h, o_k, m_k, K, HAS_U)
    for j in range(n_steps):
        t = n_steps - 1 - j
        _p_hk, p_v, b_q, b_k, b_v, b_do, _b_dd, a_k, a_v, w = _bwd_step(
            q, k, v, do, g, gk, gv, gi, m_row, r_a, r_d, bos, t, i_h, b_m0, o_k, m_k, o_v, m_v,
            T, H, G, K, V, HAS_G, HAS_GK, HAS_GV, HAS_GI, STABILIZE, NORM,
        )  # fmt: skip
        if HAS_U:
            b_dv = tl.sum(b_dh * b_k[:, None], 0) + tl.sum(b_q * b_u * b_k) * scale * b_do
            b_dh = b_dh * a_k[:, None] * a_v[None, :] + (b_q * scale)[:, None] * b_do[None, :]
        else:
            b_dh += (b_q * scale)[:, None] * b_do[None, :]
            b_dv = tl.sum(b_dh * b_k[:, None], 0) * w
            b_dh = b_dh * a_k[:, None] * a_v[None, :]
        tl.store(dv + p_v + o_v, b_dv, mask=m_v)
        if STORE_VDV:
            tl.store(vdv + p_v + o_v, b_v * b_dv, mask=m_v)
