"""The delta rule, step by step: the ground truth of DeltaNet and Gated DeltaNet.

Per value head, with state ``S [K, V]``, log decay ``g_t ≤ 0`` (Gated DeltaNet; 0 for DeltaNet)
and write strength ``β_t``::

    S_t = exp(g_t) · S_{t−1}
    S_t = S_t + β_t · k_t (v_t − S_tᵀ k_t)ᵀ   (= exp(g_t)(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ)
    o_t = scale · S_tᵀ q_t

Value heads may outnumber query/key heads (grouped value heads): value head j reads q/k head
``j // (HV / H)``.
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
