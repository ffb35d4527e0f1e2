"""Triton kernels of the delta rule's recurrent form (DeltaNet, Gated DeltaNet): one pass over
time per (sequence, value head, V tile) with the state tile in registers.

Per value head, state S [K, V] fp32, log decay g_t (0 without ``HAS_G``), write strength β_t::

    S_a,t = exp(g_t) S_{t-1};   e_t = v_t − S_a,tᵀ k_t;   S_t = S_a,t + β_t k_t e_tᵀ;
    o_t = scale · S_tᵀ q_t

Every column of S evolves on its own (e_t's column j reads only column j of S), so a program
holds the whole key dimension and one tile of BV value columns, and the V tiles of a head never
talk to each other, forward or backward.

* ``delta_recurrent_fwd_kernel``     the forward; with ``STORE_E`` also e_t for the backward.
* ``delta_recurrent_bwd_dh_kernel``  walks backward with dS (the cotangent of S_t) alone: the
  transition S_{t-1} ↦ S_t is linear and does not depend on S, so its adjoint needs no state::

      dS_t += scale q_t do_tᵀ;   de_t = β_t dS_tᵀ k_t (= dv_t);
      dk_t ∋ β_t dS_t e_t;       dβ_t = k_tᵀ dS_t e_t;
      dS_{t-1} = exp(g_t) (dS_t − k_t de_tᵀ)

  and the initial state's gradient dS_0 at the end.
* ``delta_recurrent_bwd_s_kernel``   walks forward again, recomputing S, for the terms that need
  the state and a cotangent together: dq_t = scale S_t do_t and dk_t ∋ −S_a,t de_t.

dq, dk, dβ reduce over V: each V tile writes its own partial ([NV, B·T, HV, ...] buffers) and the
host sums them. The log-decay gradient takes the identity of docs/DESIGN.md §1b: with
X_t = ⟨S_t, dS_t⟩, ∂L/∂g_t = ⟨S_a,t, dS_a,t⟩ = X_t − β_t dβ_t − (v_t − e_t)·de_t and
X_t = q_t·dq_t + ∂L/∂g_{t+1}, so ∂L/∂g_t = Σ_{u≥t} c_u + ⟨S_T, dS_T⟩ with
c_u = q_u·dq_u − β_u dβ_u − (v_u − e_u)·de_u: the kernels store c (per V tile, ``dgt``), the
host sums it in reverse in fp64. That sum cancels: where exp(g_t) ≈ 0 the exact ∂L/∂g_t is ≈ 0
while X_t is not, so each step adds about ε·|X_t| of fp32 rounding, which a sum over the whole
sequence would accumulate. It restarts instead at every segment start t = s·SEG from the exact
value ⟨S_{t-1}, D_{t-1}⟩ (D_{t-1} = exp(g_t) dS_a,t, the state's cotangent from step t on): the
reverse walk stores D_{t-1} there (``dck``), the forward walk takes the inner product with its
S_{t-1} (``dga``).

Layout: q, k ``[B, T, H, K]``; v, o, e ``[B, T, HV, V]`` with value head j reading q/k head
j // (HV / H); beta, g ``[B, T, HV]`` fp32; states ``[N, HV, K, V]`` fp32. Packed sequences
(``cu_seqlens``, B = 1): one program row per (sequence, value head). Optional pointers are None
when their switch is off.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.engine.triton_common import _start_state


@triton.jit
def _head(cu_seqlens, T, H, HV, IS_VARLEN: tl.constexpr):
    """This program's V tile (grid axis 0), its state row i_nh (sequence, value head), value
    head i_hv and q/k head i_h, its sequence's first token row in [B·T] and its steps."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        n_steps = (tl.load(cu_seqlens + i_n + 1) - bos).to(tl.int32)
    else:
        bos = i_n * T
        n_steps = T
    return i_v, i_nh, i_hv, i_h, bos, n_steps


@triton.jit
def _columns(i_v, K, V, BK: tl.constexpr, BV: tl.constexpr):
    """Offsets and masks over the whole K [BK] and over V tile i_v [BV]."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    return o_k, o_v, o_k < K, o_v < V


@triton.jit
def _load_step(q, k, v, beta, row, i_h, i_hv, o_k, m_k, o_v, m_v, H, HV, K, V):
    """Step ``row``'s offsets (its q/k row, its v row, its [B·T, HV] scalar) and q_t, k_t [BK],
    v_t [BV], β_t as fp32."""
    p_qk = (row * H + i_h) * K
    p_v = (row * HV + i_hv) * V
    p_s = row * HV + i_hv
    b_q = tl.load(q + p_qk + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(k + p_qk + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_v = tl.load(v + p_v + o_v, mask=m_v, other=0.0).to(tl.float32)
    b_b = tl.load(beta + p_s).to(tl.float32)
    return p_v, p_s, b_q, b_k, b_v, b_b


@triton.jit
def _unit(x, eps):
    """x·rsqrt(Σx² + eps) of an fp32 row (masked lanes 0)."""
    return x * (1.0 / tl.sqrt(tl.sum(x * x) + eps))


@triton.jit
def _store_tile(p, b_h, i_nh, o_k, o_v, m_k, m_v, K, V):
    """Write this program's [BK, BV] tile of state i_nh into p [N·HV, K, V]."""
    tl.store(p + i_nh * K * V + o_k[:, None] * V + o_v[None, :], b_h,
             mask=m_k[:, None] & m_v[None, :])  # fmt: skip


@triton.jit(do_not_specialize=["T"])
def delta_recurrent_fwd_kernel(
    q, k, v, beta, g, o, h0, ht, e, cu_seqlens, scale, T, H, HV, K, V,
    BK: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr, HAS_H0: tl.constexpr,
    STORE_E: tl.constexpr, IS_VARLEN: tl.constexpr, l2norm_eps=0.0,
    QK_L2NORM: tl.constexpr = False,
):  # fmt: skip
    """Grid (V tiles, N·HV), BK ≥ K. Writes o, the final state ht and (``STORE_E``) e_t fp32.
    ht may be h0 itself: each program reads its tile before the loop and writes it after.
    ``QK_L2NORM``: q_t and k_t are normalized here (the op's ``use_qk_l2norm``, a decode step's
    one launch), as its own normalization does: x·rsqrt(Σx² + l2norm_eps), rounded to the
    inputs' dtype."""
    i_v, i_nh, i_hv, i_h, bos, n_steps = _head(cu_seqlens, T, H, HV, IS_VARLEN)
    o_k, o_v, m_k, m_v = _columns(i_v, K, V, BK, BV)
    b_h, _b_n = _start_state(h0, None, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_H0, False, BK, BV)
    for t in range(n_steps):
        p_v, p_s, b_q, b_k, b_v, b_b = _load_step(q, k, v, beta, bos + t, i_h, i_hv, o_k, m_k,
                                                  o_v, m_v, H, HV, K, V)  # fmt: skip
        if QK_L2NORM:
            b_q = _unit(b_q, l2norm_eps).to(q.dtype.element_ty).to(tl.float32)
            b_k = _unit(b_k, l2norm_eps).to(k.dtype.element_ty).to(tl.float32)
        if HAS_G:
            b_h *= tl.exp(tl.load(g + p_s))
        b_e = b_v - tl.sum(b_k[:, None] * b_h, 0)  # [BV]
        if STORE_E:
            tl.store(e + p_v + o_v, b_e, mask=m_v)
        b_h += (b_b * b_k)[:, None] * b_e[None, :]  # [BK, BV]
        b_o = tl.sum(b_q[:, None] * b_h, 0) * scale  # [BV]
        tl.store(o + p_v + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    _store_tile(ht, b_h, i_nh, o_k, o_v, m_k, m_v, K, V)


@triton.jit(do_not_specialize=["T"])
def delta_recurrent_bwd_dh_kernel(
    q, k, v, beta, g, e, do, dht, dv, dk_part, db_part, dgt_part, dh0, dck, ck_offsets,
    cu_seqlens, scale, T, NTOK, H, HV, K, V,
    BK: tl.constexpr, BV: tl.constexpr, SEG: tl.constexpr, HAS_G: tl.constexpr,
    HAS_DHT: tl.constexpr, HAS_H0: tl.constexpr, HAS_ANCHORS: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (V tiles, N·HV), BK ≥ K: the backward walk of dS from dht (zeros without
    ``HAS_DHT``). Writes dv (fp32, whole), this tile's partials of dk (β dS e) [NV, NTOK, HV, K],
    dβ and, with ``HAS_G``, of the decay term −β dβ − (v − e)·de [NV, NTOK, HV]; dh0 with
    ``HAS_H0``; with ``HAS_ANCHORS`` the cotangent D_{t-1} = exp(g_t) dS_a,t of the state
    entering every segment start t = s·SEG > 0 into dck [slots, HV, K, V] (the sequence's
    slots from ``ck_offsets``, slot s − 1 for segment s)."""
    i_v, i_nh, i_hv, i_h, bos, n_steps = _head(cu_seqlens, T, H, HV, IS_VARLEN)
    o_k, o_v, m_k, m_v = _columns(i_v, K, V, BK, BV)
    b_dh, _b_dn = _start_state(dht, None, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_DHT, False, BK,
                               BV)  # fmt: skip
    part = i_v.to(tl.int64) * NTOK * HV  # this tile's slice of the partial buffers
    for j in range(n_steps):
        t = n_steps - 1 - j
        row = bos + t
        p_v, p_s, b_q, b_k, b_v, b_b = _load_step(q, k, v, beta, row, i_h, i_hv, o_k, m_k, o_v,
                                                  m_v, H, HV, K, V)  # fmt: skip
        b_e = tl.load(e + p_v + o_v, mask=m_v, other=0.0)
        b_do = tl.load(do + p_v + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_dh += (b_q * scale)[:, None] * b_do[None, :]  # dS_t, [BK, BV]
        b_de = b_b * tl.sum(b_dh * b_k[:, None], 0)  # [BV]
        b_dhe = tl.sum(b_dh * b_e[None, :], 1)  # dS_t e_t, [BK]
        b_db = tl.sum(b_k * b_dhe)
        tl.store(dv + p_v + o_v, b_de, mask=m_v)
        tl.store(dk_part + (part + p_s) * K + o_k, b_b * b_dhe, mask=m_k)
        tl.store(db_part + part + p_s, b_db)
        b_dh -= b_k[:, None] * b_de[None, :]  # dS_a,t
        if HAS_G:
            tl.store(dgt_part + part + p_s, -b_b * b_db - tl.sum((b_v - b_e) * b_de))
            b_dh *= tl.exp(tl.load(g + p_s))
            if HAS_ANCHORS:
                if (t % SEG == 0) & (t > 0):
                    slot = tl.load(ck_offsets + i_nh // HV) + t // SEG - 1
                    _store_tile(dck, b_dh, slot * HV + i_hv, o_k, o_v, m_k, m_v, K, V)
    if HAS_H0:
        _store_tile(dh0, b_dh, i_nh, o_k, o_v, m_k, m_v, K, V)


@triton.jit(do_not_specialize=["T"])
def delta_recurrent_bwd_s_kernel(
    q, k, v, beta, g, h0, do, dv, dq_part, dk_part, dgt_part, dck, ck_offsets, dga_part,
    cu_seqlens, scale, T, NTOK, NSLOT, H, HV, K, V,
    BK: tl.constexpr, BV: tl.constexpr, SEG: tl.constexpr, HAS_G: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_ANCHORS: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """Grid (V tiles, N·HV), BK ≥ K: the forward walk again, S recomputed from h0, after
    :func:`delta_recurrent_bwd_dh_kernel` (it reads dv = de and adds to that kernel's partials of
    the same tile). Writes this tile's partial of dq [NV, NTOK, HV, K], adds −S_a de to dk's and,
    with ``HAS_G``, q·dq to the decay term's; with ``HAS_ANCHORS``, this tile's partial of the
    exact decay gradient ⟨S_{t-1}, D_{t-1}⟩ at every segment start t > 0 into dga_part
    [NV, slots, HV] (D from dck)."""
    i_v, i_nh, i_hv, i_h, bos, n_steps = _head(cu_seqlens, T, H, HV, IS_VARLEN)
    o_k, o_v, m_k, m_v = _columns(i_v, K, V, BK, BV)
    b_h, _b_n = _start_state(h0, None, i_nh, o_k, o_v, K, V, m_k, m_v, HAS_H0, False, BK, BV)
    part = i_v.to(tl.int64) * NTOK * HV
    for t in range(n_steps):
        p_v, p_s, b_q, b_k, b_v, b_b = _load_step(q, k, v, beta, bos + t, i_h, i_hv, o_k, m_k,
                                                  o_v, m_v, H, HV, K, V)  # fmt: skip
        b_do = tl.load(do + p_v + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_de = tl.load(dv + p_v + o_v, mask=m_v, other=0.0)
        if HAS_ANCHORS:
            if (t % SEG == 0) & (t > 0):
                slot = tl.load(ck_offsets + i_nh // HV) + t // SEG - 1
                p_d = dck + (slot * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
                b_d = tl.load(p_d, mask=m_k[:, None] & m_v[None, :], other=0.0)
                tl.store(dga_part + (i_v.to(tl.int64) * NSLOT + slot) * HV + i_hv,
                         tl.sum(b_h * b_d))  # fmt: skip
        if HAS_G:
            b_h *= tl.exp(tl.load(g + p_s))  # S_a,t
        p_dk = dk_part + (part + p_s) * K + o_k
        b_dk = tl.load(p_dk, mask=m_k, other=0.0) - tl.sum(b_h * b_de[None, :], 1)  # [BK]
        tl.store(p_dk, b_dk, mask=m_k)
        b_e = b_v - tl.sum(b_k[:, None] * b_h, 0)  # [BV]
        b_h += (b_b * b_k)[:, None] * b_e[None, :]  # S_t
        b_dq = tl.sum(b_h * b_do[None, :], 1) * scale  # [BK]
        tl.store(dq_part + (part + p_s) * K + o_k, b_dq, mask=m_k)
        if HAS_G:
            p_dg = dgt_part + part + p_s
            tl.store(p_dg, tl.load(p_dg) + tl.sum(b_q * b_dq))
