"""The fully parallel (quadratic) form, computed in log space.

``o = ((Q Kᵀ) ⊙ D) V + (Q ⊙ exp(b)) S_0`` with ``log D_ts = b_t − b_s + gi_s`` for s ≤ t
(s < t in the exclusive form), ``b`` the cumulative log decay. Every exponent is a causal
difference of cumulative log decays (≤ 0), or is shifted by the row maximum when stabilized.
Memory is O(T²·K): a reference, not a kernel. The log-space weights are always formed in
float64 (cumulative sums over the whole sequence lose absolute precision in fp32 — ulp(700) is
6e-5 — which the chunked kernels avoid by summing within a chunk) and cast after ``exp``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def parallel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    g: Tensor | None = None,
    gv: Tensor | None = None,
    gi: Tensor | None = None,
    u: Tensor | None = None,
    stabilize: bool = False,
    S0: Tensor | None = None,
    m0: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
    """Quadratic log-space form of the generic recurrence; arguments as in ``recurrent``."""
    B, T, H = q.shape[:3]
    dt, dev = q.dtype, q.device
    lg = torch.float64  # dtype of every log-space quantity
    exp = lambda x: torch.exp(x).to(dt)  # noqa: E731
    exclusive = u is not None
    ninf = float("-inf")
    # Log decays with an explicit K axis (size 1 for scalar or absent decay).
    gk = torch.zeros(B, T, H, 1, dtype=lg, device=dev) if g is None else g.to(lg)
    if gk.dim() == 3:
        gk = gk[..., None]
    b = gk.cumsum(1)  # [B, T, H, K|1]
    bq = b - gk if exclusive else b  # the query side reads the state before its own decay
    t_idx = torch.arange(T, device=dev)
    causal = t_idx[:, None] > t_idx[None, :] if exclusive else t_idx[:, None] >= t_idx[None, :]
    causal = causal[None, :, :, None, None]  # [1, T, S, 1, 1]

    log_w = bq[:, :, None] - b[:, None, :]  # [B, T, S, H, K|1]
    if gi is not None:
        gi = gi.to(lg)
        log_w = log_w + gi[:, None, :, :, None]
    log_w = torch.where(causal, log_w, ninf)
    log_inter = bq  # [B, T, H, K|1]: weight of the initial state seen from step t
    log_end = b[:, -1:] - b  # [B, T, H, K|1]: weight of step s seen from the end
    if gi is not None:
        log_end = log_end + gi[..., None]
    log_end0 = b[:, -1]  # [B, H, K|1]: weight of the initial state seen from the end
    m_seq = m_T = None
    if stabilize:
        m0 = torch.full((B, H), ninf, dtype=lg, device=dev) if m0 is None else m0.to(lg)
        log_inter = log_inter + m0[:, None, :, None]
        m_seq = torch.maximum(log_w.amax(dim=(2, 4)), log_inter.amax(-1))  # [B, T, H]
        log_w = log_w - m_seq[:, :, None, :, None]
        log_inter = log_inter - m_seq[..., None]
        log_end0 = log_end0 + m0[..., None]
        m_T = torch.maximum(log_end.amax(dim=(1, 3)), log_end0.amax(-1))  # [B, H]
        log_end = log_end - m_T[:, None, :, None]
        log_end0 = log_end0 - m_T[..., None]

    qs = q * scale
    A = (qs[:, :, None] * k[:, None] * exp(log_w)).sum(-1)  # [B, T, S, H]
    # Causal under non-finite inputs: the masked scores are set to 0 (a NaN key at s must not
    # reach rows t < s through 0·NaN), and the products over s take v with its non-finite
    # entries zeroed, NaN being added back from their step on (exact zeros before it).
    A = torch.where(causal[..., 0], A, 0.0)
    fin = torch.isfinite(v)
    v_bad = torch.where(fin, 0.0, float("nan")).cumsum(1)  # [B, T, H, V]
    v_ok = torch.where(fin, v, 0.0)
    kw = k * exp(log_end)  # [B, T, H, K]
    if gv is None:
        o = torch.einsum("btsh,bshv->bthv", A, v_ok) + v_bad
        S = torch.einsum("bshk,bshv->bhkv", kw, v)
    else:
        c = gv.to(lg).cumsum(1)  # [B, T, H, V]
        w_v = exp(torch.where(causal, c[:, :, None] - c[:, None, :], ninf))
        o = torch.einsum("btsh,bshv,btshv->bthv", A, v_ok, w_v) + v_bad
        S = torch.einsum("bshk,bshv->bhkv", kw, v * exp(c[:, -1:] - c))
    if exclusive:
        o = o + (qs * u * k).sum(-1, keepdim=True) * v
    if S0 is not None:
        o_inter = torch.einsum("bthk,bhkv->bthv", qs * exp(log_inter), S0)
        S_dec = exp(log_end0)[..., None] * S0
        if gv is not None:
            o_inter = o_inter * exp(c)
            S_dec = S_dec * exp(c[:, -1])[:, :, None, :]
        o = o + o_inter
        S = S + S_dec
    if stabilize:
        m_seq, m_T = m_seq.to(dt), m_T.to(dt)
    return o, m_seq, S, m_T
