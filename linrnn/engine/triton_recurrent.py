"""Triton recurrent kernel (``mode="recurrent"``, and the step API for decoding): one pass over
time per (sequence, head, value tile) with the state in registers, for every family through
compile-time switches — scalar or per-key-channel decay, decay over V, log input gate, the
mLSTM max state, RWKV6's exclusive read with the bonus u, and the normalizer.

    S_t = diag(α_t) S_{t-1} (·diag(β_t)) + ι_t k_t v_tᵀ,   o_t = scale · q_tᵀ S_t
    (exclusive: o_t = scale · q_tᵀ (S_{t-1} + diag(u) k_t v_tᵀ))

Its backward (triton_recurrent_bwd) serves mode="recurrent" with gradients; the forward alone
serves decoding and inference-time prefill of short prompts.

The final state may be written over the initial state (``in place``): each program reads its
tile of the state before the loop and writes the same tile after it. Packed sequences
(cu_seqlens) are native: one program row per sequence.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linrnn.engine.host_math import cdiv, next_pow2
from linrnn.engine.triton_common import _denominator, _start_state

# Decay kinds (the DECAY switch).
DECAY_NONE, DECAY_SCALAR, DECAY_VECTOR = 0, 1, 2
# The tile of one program: the whole key dimension (BK = next power of two ≥ K) by a value
# tile BV = min(BV_MAX, STATE_ELEMS // BK, next power of two ≥ V) (at least 16), on
# NUM_WARPS warps, or FULL_WARPS when the tile reaches STATE_ELEMS (128 fp32 state entries a
# thread at 2 warps). A decode step is one launch that reads and writes the fp32 state once,
# so this tile sets how close it gets to the memory floor. benchmarks/decode_sweep.py on the
# H200 (session 8, s8/): at K = 256 (BV 32) 2 warps took 0.75-0.92x the step time of 4 for
# every family; at K = 64 (BV 64, a half-size tile) 4 warps were within 5 % of the best.
STEP_TILE = {"BV_MAX": 64, "STATE_ELEMS": 8192, "NUM_WARPS": 4, "FULL_WARPS": 2}


def _value_tile(K: int, V: int, tile: dict | None = None) -> tuple[int, int, int]:
    """(BK, BV, num_warps) of the recurrent kernel for head dims K, V under ``tile``
    (:data:`STEP_TILE`)."""
    t = STEP_TILE if tile is None else tile
    BK = max(16, next_pow2(K))
    BV = max(16, min(t["BV_MAX"], t["STATE_ELEMS"] // BK, next_pow2(V)))
    return BK, BV, t["FULL_WARPS"] if BK * BV >= t["STATE_ELEMS"] else t["NUM_WARPS"]


@triton.jit(do_not_specialize=["T"])
def recurrent_fwd_kernel(
    Q, K_, V_, O_, G, GV, GI, U, S0, N0, M0, ST, NS, MT, OFFSETS, DEN, M_ROW,
    T, H, K, V, scale, eps,
    BK: tl.constexpr, BV: tl.constexpr, DECAY: tl.constexpr, HAS_GV: tl.constexpr,
    HAS_IGATE: tl.constexpr, STAB: tl.constexpr, EXCLUSIVE: tl.constexpr,
    TRACK_N: tl.constexpr, NORM: tl.constexpr, HAS_S0: tl.constexpr, VARLEN: tl.constexpr,
    SAVE: tl.constexpr = False,
):  # fmt: skip
    """Grid (V tiles, N·H). The whole key dimension is held (BK ≥ K). ``SAVE`` (for the
    backward): store each step's normalizer denominator and max state m_t in [B·H, T] rows."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_n, i_h = i_nh // H, i_nh % H
    if VARLEN:  # B == 1: sequence i_n spans tokens [bos, eos) of the packed batch
        bos = tl.load(OFFSETS + i_n).to(tl.int64)
        n_steps = (tl.load(OFFSETS + i_n + 1) - bos).to(tl.int32)
        row0 = bos
    else:
        n_steps = T
        row0 = i_n * T
    o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_s = o_k[:, None] * V + o_v[None, :]
    b_S, b_n = _start_state(S0, N0, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_S0, TRACK_N, BK, BV)
    if STAB and HAS_S0:
        b_m = tl.load(M0 + i_nh).to(tl.float32)
    else:  # m_0 = −∞ (no state yet), as a tensor so the loop carries one type
        b_m = tl.max(tl.full([2], float("-inf"), tl.float32), 0)
    if EXCLUSIVE:
        b_u = tl.load(U + i_h * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    for t in range(n_steps):
        row = row0 + t  # token index in [B·T]
        rid = (row // T * H + i_h) * T + row % T  # its [B·H, T] row index
        b_q = tl.load(Q + (row * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_k = tl.load(K_ + (row * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(V_ + (row * H + i_h) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        w_in = 1.0
        if STAB:  # mLSTM-exp: m_t = max(log f_t + m_{t-1}, ĩ_t); all exponents ≤ 0
            b_lf = tl.load(G + row * H + i_h)
            b_i = tl.load(GI + row * H + i_h)
            m_new = tl.maximum(b_lf + b_m, b_i)
            f = tl.exp(b_lf + b_m - m_new)
            b_S *= f
            b_n *= f
            w_in = tl.exp(b_i - m_new)
            b_m = m_new
            if SAVE:
                tl.store(M_ROW + rid, b_m, mask=i_v == 0)
        else:
            if EXCLUSIVE:  # RWKV6 reads the state before this step's update, plus the bonus
                b_o = tl.sum(b_q[:, None] * b_S, 0) + tl.sum(b_q * b_u * b_k) * b_v
            if HAS_IGATE:
                w_in = tl.exp(tl.load(GI + row * H + i_h))
            if DECAY == 1:
                a = tl.exp(tl.load(G + row * H + i_h))
                b_S *= a
                b_n *= a
            elif DECAY == 2:
                a_k = tl.exp(tl.load(G + (row * H + i_h) * K + o_k, mask=m_k, other=0.0))
                b_S *= a_k[:, None]
                b_n *= a_k
            if HAS_GV:
                a_v = tl.exp(tl.load(GV + (row * H + i_h) * V + o_v, mask=m_v, other=0.0))
                b_S *= a_v[None, :]
        b_kw = b_k * w_in
        b_S += b_kw[:, None] * b_v[None, :]
        if TRACK_N:
            b_n += b_kw
        if not EXCLUSIVE:
            b_o = tl.sum(b_q[:, None] * b_S, 0)
        b_o *= scale  # [BV]
        if NORM != 0:
            b_den = tl.sum(b_q * b_n) * scale
            if SAVE:
                tl.store(DEN + rid, b_den, mask=i_v == 0)
            b_o = b_o / _denominator(b_den, b_m, eps, NORM)
        tl.store(O_ + (row * H + i_h) * V + o_v, b_o.to(O_.dtype.element_ty), mask=m_v)
    tl.store(ST + i_nh * K * V + p_s, b_S, mask=m_kv)
    if TRACK_N:
        tl.store(NS + i_nh * K + o_k, b_n, mask=m_k & ((o_k * 0 + i_v) == 0))
    if STAB:
        tl.store(MT + i_nh, b_m, mask=i_v == 0)


def recurrent(q, k, v, *, scale, g=None, gv=None, gi=None, u=None, stabilize=False,
              track_n=False, normalizer=None, eps=0.0, S0=None, n0=None, m0=None,
              offsets=None, out_state=None, saved=None):  # fmt: skip
    """Forward recurrence. q, k ``[B, T, H, K]``, v ``[B, T, H, V]`` (fp16/bf16/fp32); g
    ``[B, T, H]`` or ``[B, T, H, K]``, gv ``[B, T, H, V]``, gi ``[B, T, H]``, u ``[H, K]`` (all
    fp32); S0/n0/m0 the initial state (N = B, or the number of packed sequences with
    ``offsets``). ``out_state=(S, n, m)``: write the final state into these fp32 tensors (they
    may be the initial state itself: an in-place step). ``saved=(den, m_row)``: fp32
    ``[B·H, T]`` buffers for the per-step denominators and max states (or None each).
    Returns ``(o, S_T, n_T, m_T)``."""
    B, T, H, K = q.shape
    V = v.shape[3]
    N = B if offsets is None else len(offsets) - 1
    dev = q.device
    f32 = dict(device=dev, dtype=torch.float32)
    dummy = torch.empty(1, **f32)
    norm = {None: 0, "sum": 1, "mlstm": 3 if stabilize else 2}[normalizer]
    c = lambda x: None if x is None else x.contiguous()  # noqa: E731
    q, k, v, g, gv, gi, u = map(c, (q, k, v, g, gv, gi, u))
    S_T, n_T, m_T = out_state if out_state is not None else (None, None, None)
    S_T = torch.empty(N, H, K, V, **f32) if S_T is None else S_T
    BK, BV, warps = _value_tile(K, V)
    # n and m are read by every V tile of a head: with several tiles one tile's final n/m must
    # not land on the initial n/m another tile has yet to read, so they go to fresh buffers and
    # are copied after; with one tile the kernel writes them in place (two launches fewer per
    # decode step).
    direct = cdiv(V, BV) == 1
    n_buf = m_buf = dummy
    if track_n:
        n_buf = n_T if direct and n_T is not None else torch.empty(N, H, K, **f32)
    if stabilize:
        m_buf = m_T if direct and m_T is not None else torch.empty(N, H, **f32)
    has_s0 = S0 is not None
    if has_s0:  # (an fp32 contiguous S0 stays the same tensor, so S_T may alias it)
        S0 = S0.float().contiguous()
    o = torch.empty_like(v, dtype=q.dtype)
    if offsets is not None:
        offsets = torch.as_tensor(offsets, dtype=torch.int64, device=dev)
    recurrent_fwd_kernel[(cdiv(V, BV), N * H)](
        q, k, v, o, g if g is not None else dummy, gv if gv is not None else dummy,
        gi if gi is not None else dummy, u if u is not None else dummy,
        S0 if has_s0 else dummy,
        n0.float().contiguous() if (has_s0 and track_n) else dummy,
        m0.float().contiguous() if (has_s0 and stabilize) else dummy,
        S_T, n_buf, m_buf, offsets if offsets is not None else dummy,
        *[dummy if x is None else x for x in (saved or (None, None))],
        T, H, K, V, float(scale), float(eps),
        BK=BK, BV=BV,
        DECAY=0 if g is None else (DECAY_VECTOR if g.dim() == 4 else DECAY_SCALAR),
        HAS_GV=gv is not None, HAS_IGATE=gi is not None, STAB=stabilize,
        EXCLUSIVE=u is not None, TRACK_N=track_n, NORM=norm, HAS_S0=has_s0,
        VARLEN=offsets is not None, SAVE=saved is not None, num_warps=warps,
    )  # fmt: skip
    n_out = m_out = None
    if track_n:
        n_out = n_T.copy_(n_buf) if n_T is not None and n_T is not n_buf else n_buf
    if stabilize:
        m_out = m_T.copy_(m_buf) if m_T is not None and m_T is not m_buf else m_buf
    return o, S_T, n_out, m_out
