"""Pure-PyTorch chunkwise engine (docs/DESIGN.md §9), matmul-based, differentiable by autograd.

Two levels, as in TFLA: a sequential scan over chunks materializes the chunk-boundary states
(each chunk's own contribution is one batched matmul for all chunks at once), then the outputs
of all chunks are computed in parallel from the intra-chunk matrix and the boundary states.

Numerics: gate cumsums are taken *within* a chunk (in fp64 for strong scalar decays), and every
exponent is a causal difference of cumulative log decays (≤ 0), is shifted by a running
maximum (mLSTM-exp), or is a factor whose size is checked against ``_FACTOR_LIMIT`` first.
Masked entries are set to −inf (or multiplied by 0 when finite) before ``exp``, so neither the
forward nor autograd sees an overflow.

The intra-chunk weights ``exp(bq_r − b_s)`` take the cheapest safe path:

1. the chunk decays by at most ``exp(−_FACTOR_LIMIT)``: the decay folds into the two operands of
   one L×L matmul (``exp(bq_r) · exp(−b_s)``), for scalar and vector gates alike;
2. vector gates beyond that: GLA's secondary chunking (seed 001 §0x2.3): sub-chunk pairs factor
   through the sub-chunk boundaries (every factor ≤ 1), diagonal blocks are matmuls when one
   sub-chunk's decay is bounded and exact ``[c, c, K]`` log-space weights otherwise;
3. scalar gates beyond that: the exact ``[L, L]`` log-space weight matrix.

Choosing between them reads a bound of the gates on the host. While ``torch.compile`` traces
or a CUDA graph is captured (:func:`linrnn._runtime.host_reads_ok` is False) no value may be
read: the engine then takes the paths that are safe for any gates (scalar: fp64 log-space
weights; vector: secondary chunking with exact diagonal blocks), whose results agree with the
fast paths to rounding. While tracing, the two scans over chunks also take closed forms
(:func:`_scan_parallel`, a cumulative max for the mLSTM max state) instead of Python loops, whose
length would depend on T and so recompile the graph for every new length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from linrnn import _runtime

NINF = float("-inf")


def _to_chunks(x: Tensor, N: int, L: int, pad_value: float = 0.0) -> Tensor:
    """[B, T, H, *] -> [B, H, N, L, *], padding T up to N·L with ``pad_value``."""
    B, T, H = x.shape[:3]
    x = x.transpose(1, 2).contiguous()  # [B, H, T, *]; contiguous once, not in every matmul
    pad = N * L - T
    if _runtime.tracing() or pad:  # traced: no guard on T % L (`pad` first would add one)
        widths = [0, 0] * (x.dim() - 3) + [0, pad]
        x = F.pad(x, widths, value=pad_value)
    return x.reshape(B, H, N, L, *x.shape[3:])


def _from_chunks(x: Tensor, T: int) -> Tensor:
    """[B, H, N, L, *] -> [B, T, H, *]. Transposed before the padding is cut off: the same
    view, but no intermediate [B, H, T, *] whose contiguity depends on T == N·L (a traced
    graph would guard on it and recompile when T crosses a multiple of L)."""
    B, H, N, L = x.shape[:4]
    return x.reshape(B, H, N * L, *x.shape[4:]).transpose(1, 2)[:, :T]


def _subchunk(L: int) -> int:
    """Largest divisor of L not above 16: the diagonal block size for vector gates."""
    return next(c for c in range(min(16, L), 0, -1) if L % c == 0)


def causal_product(A: Tensor, v: Tensor, dim: int = -2) -> Tensor:
    """``A @ v`` for a causal (lower-triangular) ``A [.., L, L]`` that keeps causality when v has
    non-finite rows: a dense product multiplies the masked zeros of ``A`` with every row of
    ``v``, and 0·NaN = NaN would carry a late row's NaN to every earlier output. The product
    takes v with its non-finite entries zeroed and adds, per column, NaN from the first
    non-finite row on (a cumulative sum of NaN and exact zeros: earlier rows are unchanged
    bitwise). ``dim``: v's row dimension for :func:`poison`."""
    fin = torch.isfinite(v)
    return (A @ torch.where(fin, v, 0.0)) + poison(fin, dim)


def poison(fin: Tensor, dim: int) -> Tensor:
    """Exact zeros up to the first False of ``fin`` along ``dim``, NaN from there on."""
    return torch.where(fin, 0.0, float("nan")).cumsum(dim)


def _causal_where(A: Tensor, mask: Tensor) -> Tensor:
    """``A`` with its entries outside ``mask`` set to 0 (not multiplied: a NaN score there, from
    a later key, must not reach an earlier row)."""
    return torch.where(mask, A, 0.0)


def chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    chunk_size: int = 64,
    g: Tensor | None = None,
    gv: Tensor | None = None,
    gi: Tensor | None = None,
    u: Tensor | None = None,
    stabilize: bool = False,
    S0: Tensor | None = None,
    m0: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
    """Chunkwise form of the generic recurrence; arguments and returns as in
    :func:`linrnn.reference.recurrent`, plus ``chunk_size`` (any L ≥ 1; T need not divide)."""
    B, T, H = q.shape[:3]
    vector = g is not None and g.dim() == 4
    if vector and stabilize:
        raise NotImplementedError("the max-state stabilizer is defined for scalar decays only")
    L = chunk_size
    N = (T + L - 1) // L  # (not -(-T // L): inductor trips over negated symbolic sizes)
    dt, dev = q.dtype, q.device
    if g is None:
        g = torch.zeros(B, T, H, dtype=dt, device=dev)
    # Padding is neutral: k = 0 adds nothing, log decay 0 keeps the state, and for the
    # stabilized form ĩ = −∞ keeps the max state unchanged.
    # q is scaled inside the engine, folded into its decay factors.
    qc, kc, vc = _to_chunks(q, N, L), _to_chunks(k, N, L), _to_chunks(v, N, L)
    # Non-finite values (garbage in right padding) must reach only later outputs: the products
    # take v with them zeroed, and NaN is added back causally, within each chunk to the rows
    # from the bad one on (v_bad) and to the chunk's state contribution (its last row).
    fin = torch.isfinite(vc)
    vc, v_bad = torch.where(fin, vc, 0.0), poison(fin, 3)  # [B, H, N, L, V]
    gc = _to_chunks(g, N, L)
    gic = None if gi is None else _to_chunks(gi, N, L, NINF if stabilize else 0.0)
    b = gc.cumsum(3)  # [B, H, N, L(, K)] within-chunk cumulative log decay
    if not _runtime.host_reads_ok() or not float(b.detach().amin()) >= -_PRECISE_BELOW:
        # Strong decays: differences of large cumulative sums lose absolute precision in fp32
        # (ulp(480) = 3e-5, and the weights that matter are exp of small differences of such
        # sums), so form the log-space weights in fp64 (the gates are [B, H, N, L(, K)]) and
        # cast after exp. A non-finite gate (a NaN minimum) takes this path too: every choice
        # of form treats NaN as the unsafe side, so garbage in padding costs no accuracy.
        b = gc.double().cumsum(3)
        gic = None if gic is None else gic.double()
        m0 = None if m0 is None else m0.double()
    if vector:
        o, S = _vector(qc, kc, vc, v_bad, gc, b, gv, gic, u, S0, N, L, scale)
        return _from_chunks(o + v_bad, T), None, S, None
    o, m_rows, S, m_T = _scalar(qc, kc, vc, v_bad, b, gic, stabilize, S0, m0, N, L, scale)
    o = o + v_bad
    return _from_chunks(o, T), (None if m_rows is None else _from_chunks(m_rows, T)), S, m_T


def max_state_normalize(num: Tensor, den: Tensor, m: Tensor, eps: float) -> Tensor:
    """mLSTM-exp's output ``num / (max(|den|, exp(−m)) + eps)`` without forming ``exp(−m)``,
    which overflows for ``m < −88`` in fp32 (a strongly negative input gate) and then makes
    autograd's gradients 0·inf = NaN. Only ``e = exp(−|m|) ≤ 1`` is formed: the floor is ``e``
    for ``m ≥ 0`` and ``1/e`` below, where the quotient is ``num·e / (1 + eps·e)``."""
    e = torch.exp(-m.abs())
    pos = m >= 0
    mag = den.abs()
    above = torch.where(pos, mag > e, mag * e > 1)
    below = torch.where(pos, num / (e + eps), num * (e / (1 + eps * e)))
    return torch.where(above, num / (mag + eps), below)


def _scan(
    decay: Tensor, U: Tensor, S0: Tensor | None, log_decay: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """S_{n+1} = decay_n ⊙ S_n + U_n over chunks. Returns the states *entering* each chunk
    ``[B, H, N, K, V]`` and the final state. ``log_decay`` (the log of ``decay``, same shape):
    while tracing, the closed form :func:`_scan_parallel` (scalar or key-dimension decays)."""
    if _runtime.tracing() and log_decay is not None and log_decay.shape[-1] == 1:
        return _scan_parallel(log_decay, U, S0)
    S = torch.zeros_like(U[:, :, 0]) if S0 is None else S0
    states = []
    # unbind once: indexing U[:, :, n] per step would make autograd build a full-size zero
    # gradient per step in backward (O(N²) work).
    for U_n, d_n in zip(U.unbind(2), decay.unbind(2)):
        states.append(S)
        S = torch.addcmul(U_n, d_n, S)
    return torch.stack(states, dim=2), S


def _scan_parallel(log_decay: Tensor, U: Tensor, S0: Tensor | None) -> tuple[Tensor, Tensor]:
    """:func:`_scan` without a loop (used while tracing): with ``D_n`` the cumulative log decay
    before chunk n (fp64), ``S_n = Σ_{j<n} exp(D_n − D_{j+1}) U_j + exp(D_n) S_0``, one
    contraction over chunk pairs. Every exponent is a causal sum of log decays (≤ 0), masked to
    −∞ before ``exp``. Costs O(N²·K·V) per head instead of O(N·K·V) for N = T/L chunks (a
    larger chunk size keeps N small for long sequences). ``log_decay`` is ``[B, H, N, 1, 1]``
    (scalar) or ``[B, H, N, K, 1]`` (per key dimension)."""
    N = U.shape[2]
    scalar = log_decay.shape[-2] == 1
    fin = torch.isfinite(U)
    U = torch.where(fin, U, 0.0)
    ld = (log_decay[..., 0, 0] if scalar else log_decay[..., 0]).double()  # [B, H, N(, K)]
    zero = torch.zeros_like(ld[:, :, :1])
    # Only chunk 0 can have a log decay of −∞ (mLSTM-exp without an initial max state), and it
    # never lies strictly between two chunks: zero it for the pair weights (−∞ − −∞ is NaN).
    D = torch.cat([zero, torch.where(torch.isfinite(ld), ld, 0.0).cumsum(2)], dim=2)
    idx = torch.arange(N + 1, device=U.device)
    causal = idx[1:][None, :] <= idx[:, None]  # [N + 1, N]: chunk j < n contributes to S_n
    if scalar:
        log_w = D[:, :, :, None] - D[:, :, None, 1:]  # [B, H, N + 1, N]
        w = torch.exp(torch.where(causal, log_w, NINF)).to(U.dtype)
        out = torch.einsum("bhnj,bhjkv->bhnkv", w, U)
    else:
        log_w = D[:, :, :, None, :] - D[:, :, None, 1:, :]  # [B, H, N + 1, N, K]
        w = torch.exp(torch.where(causal[..., None], log_w, NINF)).to(U.dtype)
        out = torch.einsum("bhnjk,bhjkv->bhnkv", w, U)
    # (the products took U with non-finite entries zeroed: a NaN in a later chunk's U must not
    # reach an earlier state through a masked weight; NaN is added back causally)
    out = out + torch.cat([torch.zeros_like(U[:, :, :1]), poison(fin, 2)], dim=2)
    if S0 is not None:  # exp(D_n) with the true (possibly −∞) decays
        c0 = torch.exp(torch.cat([zero, ld.cumsum(2)], dim=2)).to(U.dtype)
        out = out + (c0[..., None, None] if scalar else c0[..., None]) * S0[:, :, None]
    return out[:, :, :-1], out[:, :, -1]  # (indexing with N would specialize on it)


# Below this within-chunk cumulative log decay, scalar log-space weights are formed in fp64.
_PRECISE_BELOW = 16.0

# Largest exponent allowed in a factorized intra-chunk weight exp(x) · exp(y) (x > 0 ≥ x + y):
# exp(60) ≈ 1e26 leaves fp32 ample headroom for the products.
_FACTOR_LIMIT = 60.0


def _scalar(qc, kc, vc, v_bad, b, gic, stabilize, S0, m0, N, L, scale):
    """Scalar (or no) decay per head and step; optional log input gate and stabilizer; q is
    not yet scaled. The log-space tensors (b, gic, m) may be fp64 while q, k, v are fp32:
    weights are cast after ``exp``.

    With ``a_s = log ι_s − b_s`` every intra-chunk weight is ``exp(b_r − m_r + a_s)`` (m = 0
    unless stabilized), so it factors into a query and a key scale around the chunk maximum
    ``A = max_s a_s``: ``exp(b_r − m_r + A) · exp(a_s − A)``. The key factor is ≤ 1; the query
    factor is bounded by the spread of ``a`` within the chunk. When that bound is at most
    ``_FACTOR_LIMIT`` the decay folds into the two matmul operands (no L×L weight matrix);
    otherwise the weights are formed exactly in log space."""
    dt = qc.dtype
    exp = lambda x: torch.exp(x).to(dt)  # noqa: E731
    b_end = b[..., -1]  # [B, H, N]
    a = -b if gic is None else gic - b  # [B, H, N, L]
    a_max = a.amax(-1)  # [B, H, N]
    # Key weights to the chunk end, exp(b_L − b_s + log ι_s − max) ≤ 1, and the chunk's
    # contribution to the state, U = Σ_s w_s k_s v_sᵀ, scaled by exp(max) afterwards.
    k_w = kc * exp(a - a_max[..., None])[..., None]  # [B, H, N, L, K]
    U = k_w.transpose(-1, -2) @ vc + v_bad[..., -1:, :]  # [B, H, N, K, V]
    m_loc = b_end + a_max  # [B, H, N]: log of the largest key weight to the chunk end
    if stabilize:
        m_all = _max_scan(b_end, m_loc, m0)  # [B, H, N + 1]: entering each chunk, then m_T
        m_in, m_out, m_T = m_all[:, :, :-1], m_all[:, :, 1:], m_all[:, :, -1]
        log_d = (b_end + m_in - m_out)[..., None, None]
        states, S = _scan(exp(log_d), exp(m_loc - m_out)[..., None, None] * U, S0, log_d)
        row = torch.maximum(a.cummax(-1).values, m_in[..., None])  # m_r − b_r
        log_q = -row  # query factor exp(b_r − m_r), before the chunk maximum
        log_inter = m_in[..., None] - row  # exp(b_r + m_in − m_r) ≤ 1
        m_rows = b + row  # [B, H, N, L] = the recurrent m_t
    else:
        log_d = b_end[..., None, None]
        states, S = _scan(exp(log_d), exp(m_loc)[..., None, None] * U, S0, log_d)
        log_q = log_inter = b
        m_rows = m_T = None
    q_inter = qc * (exp(log_inter) * scale)[..., None]  # [B, H, N, L, K]
    o = q_inter @ states

    log_q_fac = log_q + a_max[..., None]  # [B, H, N, L]
    # Largest query factor, and largest key maximum on its own (one host read for both).
    fac_max, a_top = (
        torch.stack([log_q_fac.detach().amax(), a_max.detach().amax()]).tolist()
        if _runtime.host_reads_ok()
        else (math.inf, math.inf)
    )
    if fac_max <= _FACTOR_LIMIT:
        tril = _causal(L, False, qc.device)
        if not stabilize and a_top <= _FACTOR_LIMIT:
            # the A operand is q_inter · exp(A): apply exp(A) to A·v instead (both factors
            # bounded: a strong decay at a chunk's first step makes exp(b_r) underflow and
            # exp(A) overflow although their product is bounded)
            A = _causal_where(q_inter @ k_w.transpose(-1, -2), tril)
            o = torch.addcmul(o, exp(a_max)[..., None, None], A @ vc)
        else:
            A = (qc * (exp(log_q_fac) * scale)[..., None]) @ k_w.transpose(-1, -2)
            o = o.add_(_causal_where(A, tril) @ vc)
    else:  # exact log space: log D_rs = log_q_r + a_s, masked before exp
        log_D = log_q[..., :, None] + a[..., None, :]  # [B, H, N, L, L]
        causal = _causal(L, False, qc.device)
        log_D.masked_fill_(~causal, NINF)
        A = (qc @ kc.transpose(-1, -2)).mul_(scale) * exp(log_D)
        o = o.add_(_causal_where(A, causal) @ vc)
    if stabilize:
        m_rows, m_T = m_rows.to(dt), m_T.to(dt)
    return o, m_rows, S, m_T


def _max_scan(b_end, m_loc, m0):
    """mLSTM max state over chunks, m ← max(b_L + m, m_loc) (cheap: [B, H] per step). Returns
    ``[B, H, N + 1]``: the stabilizer entering each chunk, then the final one."""
    B, H = b_end.shape[:2]
    m = torch.full((B, H), NINF, dtype=b_end.dtype, device=b_end.device) if m0 is None else m0
    if _runtime.tracing():  # no loop over N: m_n = F_n + max(m_0, max_{j<n}(m_loc_j − F_{j+1}))
        F_ = torch.cat([torch.zeros_like(b_end[:, :, :1]), b_end.double().cumsum(2)], dim=2)
        z = torch.cat([m.double()[:, :, None], m_loc.double() - F_[:, :, 1:]], dim=2)
        return (F_ + z.cummax(2).values).to(b_end.dtype)
    m_in = []
    for b_n, m_loc_n in zip(b_end.unbind(2), m_loc.unbind(2)):
        m_in.append(m)
        m = torch.maximum(b_n + m, m_loc_n)
    m_in.append(m)
    return torch.stack(m_in, dim=2)


def _vector(qc, kc, vc, v_bad, gc, b, gv, gic, u, S0, N, L, scale):
    """Decay per key dimension (GLA, RWKV6), optional decay over V (gv), optional exclusive
    form with bonus u (RWKV6), optional log input gate; q is not yet scaled."""
    exclusive = u is not None
    dt = qc.dtype
    exp = lambda x: torch.exp(x).to(dt)  # noqa: E731  (the log-space tensors may be fp64)
    b_end = b[..., -1, :]  # [B, H, N, K]
    # The query side's exclusive cumulative decay is the inclusive one read one row up (b − g
    # would round: b_r − g_r ≠ b_{r−1} in fp32, and exp(bq_r − b_{r−1}), exactly 1, would carry
    # ulp(b_r) of error, 1e-3 relative once b reaches −1e4 under strong decays).
    bq = torch.cat([torch.zeros_like(b[..., :1, :]), b[..., :-1, :]], dim=-2) if exclusive else b
    # exp(bq) · scale in one pass over [.., L, K] (exp(bq + log scale) for scale > 0; traced,
    # the product: inductor fuses it, and a branch on a symbolic scale would pin its value).
    one_pass = not _runtime.tracing() and scale > 0
    q_dec = qc * (exp(bq + math.log(scale)) if one_pass else exp(bq) * scale)
    cv = None if gv is None else _to_chunks(gv, N, L).to(b.dtype).cumsum(3)  # [B, H, N, L, V]
    # Fast path: when the whole chunk decays by at most exp(−_FACTOR_LIMIT) in every
    # dimension, exp(bq_r − b_s) = exp(bq_r) · exp(−b_s) with both factors bounded, and the
    # decay folds into the operands of one L×L matmul (GLA's first-level chunking). |b| ≤ the
    # limit: −b_end for log decays ≤ 0, and false for garbage (+inf, NaN) in unchecked padding.
    fast = (
        _runtime.host_reads_ok()
        and float(b.detach().abs().amax()) <= _FACTOR_LIMIT
        and (cv is None or float(cv.detach().abs().amax()) <= _FACTOR_LIMIT)
    )
    # The per-chunk state decay, over K (and V with gv): [B, H, N, K, 1 or V].
    decay = exp(b_end)[..., :, None]
    if cv is not None:
        cv_end = cv[..., -1, :]  # [B, H, N, V]
        decay = decay * exp(cv_end)[..., None, :]
    if fast:
        log_k = -b if gic is None else gic[..., None] - b
        kw_T = (kc * exp(log_k)).transpose(-1, -2)  # k·exp(−b_s) ≤ exp(_FACTOR_LIMIT)
        # v·exp(−c_s), bounded the same way; the weight to the chunk end is then `decay`.
        v_hat = vc if cv is None else vc * exp(-cv)
        U = (kw_T @ v_hat) * decay + v_bad[..., -1:, :]
    else:
        log_k = b_end[..., None, :] - b  # [B, H, N, L, K]
        if gic is not None:
            log_k = log_k + gic[..., None]
        kw_T = (kc * exp(log_k)).transpose(-1, -2)
        U = kw_T @ (vc if cv is None else vc * exp(cv_end[..., None, :] - cv))
        U = U + v_bad[..., -1:, :]
    log_d = b_end[..., :, None] if cv is None else None  # (gv: the loop, also when traced)
    states, S = _scan(decay, U, S0, log_d)
    o = q_dec @ states  # inter-chunk part

    if fast:
        A = _causal_where(q_dec @ kw_T, _causal(L, exclusive, qc.device))
        if exclusive:
            # The bonus q_r·(u ⊙ k_r) on the diagonal, added in place (A is a fresh product).
            bonus = torch.einsum("bhnlk,hk->bhnl", qc * kc, u * scale)
            A.diagonal(dim1=-2, dim2=-1).add_(bonus)
        if cv is None:
            return o.add_(A @ vc), S
        return o.add_(A @ v_hat) * exp(cv), S
    if cv is not None:
        o = o * exp(cv)
    qc = qc * scale

    # Otherwise secondary chunking: L = ns sub-chunks of c steps.
    c = _subchunk(L)
    ns = L // c
    sub = lambda x: x.reshape(*x.shape[:3], ns, c, *x.shape[4:])  # noqa: E731
    qs, ks, bqs, bks = sub(qc), sub(kc), sub(bq), sub(b)  # [B, H, N, ns, c, K]
    if gic is not None:
        ks = ks * exp(sub(gic))[..., None]  # ι_s ≤ 1 here (non-stabilized)
    pi, pj = torch.tril_indices(ns, ns, -1, device=qc.device)  # sub-chunk pairs j < i
    A_pair, A_diag = _intra_vector(qs, ks, bqs, bks, pi, pj, exclusive, u)
    vs = sub(vc)  # [.., ns, c, V]
    if cv is None:
        o_intra = A_diag @ vs
        if len(pi):
            o_intra = o_intra.index_add(-3, pi, A_pair @ vs.index_select(-3, pj))
        return o + o_intra.reshape(*o.shape), S
    # With a decay over V the weight depends on the value column: rescale v per sub-chunk pair
    # against the same boundaries as the keys. The diagonal block factors the same way as on
    # the key side when one sub-chunk's V-decay is bounded, else it is exact in log space.
    cvs = sub(cv)  # [.., ns, c, V]
    ends_v = cvs[..., :, -1, :]  # [.., ns, V]
    p_v = torch.cat([torch.zeros_like(ends_v[..., :1, :]), ends_v[..., :-1, :]], dim=-2)
    log_vgrow = p_v[..., :, None, :] - cvs  # [.., ns, c, V], ≥ 0: within one sub-chunk
    if _runtime.host_reads_ok() and float(log_vgrow.detach().amax()) <= _FACTOR_LIMIT:
        o_intra = (A_diag @ (vs * exp(log_vgrow))) * exp(-log_vgrow)
    else:
        causal = _causal(c, exclusive, qc.device)
        log_vdiag = cvs[..., :, None, :] - cvs[..., None, :, :]  # [.., ns, c, c, V]
        wv_diag = exp(torch.where(causal[..., None], log_vdiag, NINF))
        o_intra = (A_diag[..., None] * vs[..., None, :, :] * wv_diag).sum(-2)  # [.., ns, c, V]
    if len(pi):  # exp(c_r − p_i) · exp(p_i − e_j) · exp(e_j − c_s), every factor ≤ 1
        v_hat = vs * exp(ends_v[..., :, None, :] - cvs)  # [.., ns, c, V]
        w_pair = exp(p_v.index_select(-2, pi) - ends_v.index_select(-2, pj))[
            ..., None, :
        ]  # [.., P, 1, V]
        o_pair = (A_pair @ v_hat.index_select(-3, pj)) * w_pair
        o_off = torch.zeros_like(o_intra).index_add(-3, pi, o_pair)
        o_intra = o_intra + o_off * exp(cvs - p_v[..., :, None, :])
    return o + o_intra.reshape(*o.shape), S


def _causal(c: int, exclusive: bool, device) -> Tensor:
    idx = torch.arange(c, device=device)
    return idx[:, None] > idx[None, :] if exclusive else idx[:, None] >= idx[None, :]


def _intra_vector(qs, ks, bqs, bks, pi, pj, exclusive, u):
    """Intra-chunk weights ``A[r, s] = Σ_k q_rk k_sk exp(bq_rk − b_sk)`` for a vector decay:
    ``A_pair [.., P, c, c]`` for the sub-chunk pairs ``(pi, pj)`` with j < i, and the diagonal
    blocks ``A_diag [.., ns, c, c]`` (bonus included).

    Pairs factor through the sub-chunk boundaries, every factor ≤ 1:
    ``exp(bq_r − p_i) · exp(p_i − e_j) · exp(e_j − b_s)`` with ``p_i`` the cumulative decay
    before sub-chunk i and ``e_j`` the one at the end of sub-chunk j. The diagonal block is a
    matmul after ``exp(bq_r − p_i) · exp(p_i − b_s)`` when the second exponent (the decay within
    one sub-chunk) is at most ``_FACTOR_LIMIT``; otherwise it is evaluated exactly in log space
    with an explicit ``[c, c, K]`` weight (strong decays, e.g. −30 per step).
    """
    c = qs.shape[-2]
    exp = lambda x: torch.exp(x).to(qs.dtype)  # noqa: E731  (bqs, bks may be fp64)
    ends = bks[..., :, -1, :]  # [.., ns, K]
    p = torch.cat([torch.zeros_like(ends[..., :1, :]), ends[..., :-1, :]], dim=-2)  # [.., ns, K]
    q_hat = qs * exp(bqs - p[..., :, None, :])  # [.., ns, c, K]
    A_pair = None
    if len(pi):
        k_hat = ks * exp(ends[..., :, None, :] - bks)  # [.., ns, c, K]
        w_pair = exp(p.index_select(-2, pi) - ends.index_select(-2, pj))  # [.., P, K]
        A_pair = (q_hat.index_select(-3, pi) * w_pair[..., None, :]) @ k_hat.index_select(
            -3, pj
        ).transpose(-1, -2)  # [.., P, c, c]

    causal = _causal(c, exclusive, qs.device)
    log_grow = p[..., :, None, :] - bks  # [.., ns, c, K], ≥ 0: within one sub-chunk
    if _runtime.host_reads_ok() and float(log_grow.detach().amax()) <= _FACTOR_LIMIT:
        A_diag = q_hat @ (ks * exp(log_grow)).transpose(-1, -2)
        A_diag = torch.where(causal, A_diag, 0.0)
    else:
        log_diag = bqs[..., :, None, :] - bks[..., None, :, :]  # [.., ns, c(r), c(s), K]
        w_diag = exp(torch.where(causal[..., None], log_diag, NINF))
        A_diag = (qs[..., :, None, :] * ks[..., None, :, :] * w_diag).sum(-1)  # [.., ns, c, c]
        A_diag = _causal_where(A_diag, causal)
    if exclusive:
        bonus = (qs * u[None, :, None, None, None, :] * ks).sum(-1)  # [.., ns, c]
        A_diag = A_diag + torch.diag_embed(bonus)
    return A_pair, A_diag
