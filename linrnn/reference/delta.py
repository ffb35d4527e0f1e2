"""The delta rule, step by step: the ground truth of DeltaNet and Gated DeltaNet.

Per value head, with state ``S [K, V]``, log decay ``g_t ≤ 0`` (Gated DeltaNet; 0 for DeltaNet)
and write strength ``β_t``::

    S_t = exp(g_t) · S_{t−1}
    S_t = S_t + β_t · k_t (v_t − S_tᵀ k_t)ᵀ   (= exp(g_t)(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ)
    o_t = scale · S_tᵀ q_t

Value heads may outnumber query/key heads (grouped value heads): value head j reads q/k head
``j // (HV / H)``.

- :func:`delta_recurrent` — the step-by-step loop; the ground truth.
- :func:`delta_parallel` — the whole sequence as one chunk of the WY/UT form (a triangular solve
  instead of the loop); an independent second derivation.
"""

from __future__ import annotations

import torch
from torch import Tensor


def delta_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    *,
    scale: float,
    g: Tensor | None = None,
    S0: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Run the delta rule one step at a time; returns ``(o [B, T, HV, V], S_T [B, HV, K, V])``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]`` with HV a multiple of H; all in the
            compute dtype (fp32, or fp64 for exact checks).
        beta: ``[B, T, HV]``; g: ``[B, T, HV]`` log decay or None (no decay).
        S0: initial state ``[B, HV, K, V]`` or None (zeros).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    S = q.new_zeros(B, HV, K, V) if S0 is None else S0
    # Slice time once: indexing x[:, t] inside the loop makes autograd build a full-size zero
    # tensor per step in backward (T² work).
    qs, ks, vs, bs = q.unbind(1), k.unbind(1), v.unbind(1), beta.unbind(1)
    gs = [None] * T if g is None else g.unbind(1)
    outs = []
    for t in range(T):
        if gs[t] is not None:
            S = torch.exp(gs[t])[..., None, None] * S
        k_t = ks[t]  # [B, HV, K]
        err = vs[t] - (k_t[..., :, None] * S).sum(-2)  # v_t − S_tᵀ k_t: [B, HV, V]
        S = S + bs[t][..., None, None] * k_t[..., :, None] * err[..., None, :]
        outs.append(scale * (qs[t][..., :, None] * S).sum(-2))
    return torch.stack(outs, dim=1), S


def delta_parallel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    *,
    scale: float,
    g: Tensor | None = None,
    S0: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The delta rule in closed form, the whole sequence as one chunk; arguments and returns as
    in :func:`delta_recurrent`. Quadratic in T (the T×T triangular system).

    With ``b_t = Σ_{τ≤t} g_τ`` (fp64, log space) and ``Γ_ts = exp(b_t − b_s)`` for s ≤ t, the
    loop's corrected values ``δ_t = β_t (v_t − S_{t−1}'ᵀ k_t)`` (S' the decayed state before the
    write) solve the unit lower-triangular system ``(I + N) δ = β v − β exp(b) K S0`` with
    ``N_ts = β_t Γ_ts k_t·k_s`` (s < t), and then::

        o_t = scale (exp(b_t) q_tᵀ S0 + Σ_{s≤t} Γ_ts (q_t·k_s) δ_s)
        S_T = exp(b_T) S0 + Σ_s exp(b_T − b_s) k_s δ_sᵀ
    """
    B, T, H = q.shape[:3]
    HV = v.shape[2]
    group = HV // H
    # [B, HV, T, *]: value head j reads q/k head j // group.
    q, k = (x.repeat_interleave(group, dim=2).transpose(1, 2) for x in (q, k))
    v, beta = v.transpose(1, 2), beta.transpose(1, 2)
    dt = q.dtype
    if g is None:
        b = torch.zeros(B, HV, T, dtype=torch.float64, device=q.device)
    else:
        b = g.double().transpose(1, 2).cumsum(-1)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    log_gamma = (b[..., :, None] - b[..., None, :]).masked_fill(~causal, float("-inf"))
    gamma = torch.exp(log_gamma).to(dt)  # [B, HV, T, T], 0 above the diagonal
    decay = torch.exp(b).to(dt)  # [B, HV, T]: exp(b_t)
    tail = torch.exp(b[..., -1:] - b).to(dt)  # exp(b_T − b_s)
    N = (beta[..., :, None] * gamma * (k @ k.transpose(-1, -2))).tril(-1)
    rhs = beta[..., None] * v
    if S0 is not None:
        rhs = rhs - beta[..., None] * decay[..., None] * (k @ S0)
    # unitriangular: the diagonal of N is ignored and taken as 1, i.e. I + N.
    delta = torch.linalg.solve_triangular(N, rhs, upper=False, unitriangular=True)
    o = (q @ k.transpose(-1, -2) * gamma) @ delta
    S_T = (tail[..., None] * k).transpose(-1, -2) @ delta
    if S0 is not None:
        o = o + decay[..., None] * (q @ S0)
        S_T = S_T + decay[..., -1, None, None] * S0
    return scale * o.transpose(1, 2), S_T
