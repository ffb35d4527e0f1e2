"""Mamba2's SSD recurrence as a plain step-by-step loop (docs/DESIGN.md §11), independent of the
engine and of :mod:`linrnn.ops.mamba2`'s mapping: the equations as written, in the dtype of the
inputs (float64 for exact checks)::

    Δ_t = softplus(dt_t + dt_bias)   (dt_softplus)   or   dt_t + dt_bias
    h_t = exp(Δ_t·A) h_{t−1} + Δ_t B_t x_tᵀ          h [N, P] per head
    y_t = C_tᵀ h_t + D·x_t

x ``[B, T, H, P]``, dt ``[B, T, H]``, A ``[H]``, B and C ``[B, T, G, N]`` (head h reads group
``h // (H / G)``), D and dt_bias ``[H]`` or None, h0 ``[B, H, N, P]`` or None. Returns
``(y [B, T, H, P], h_T [B, H, N, P])``; differentiable by autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor


def mamba2_recurrent(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    *,
    D=None,
    dt_bias=None,
    dt_softplus: bool = False,
    h0=None,
) -> tuple[Tensor, Tensor]:
    """The SSD loop (module docstring)."""
    Bsz, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    z = dt if dt_bias is None else dt + dt_bias
    delta = torch.logaddexp(z, torch.zeros_like(z)) if dt_softplus else z  # softplus, exact
    head_group = torch.arange(H, device=x.device) // (H // G)
    Bh, Ch = B[:, :, head_group], C[:, :, head_group]  # [B, T, H, N]
    h = x.new_zeros(Bsz, H, N, P) if h0 is None else h0.to(x.dtype)
    ys = []
    for t in range(T):
        decay = torch.exp(delta[:, t] * A)  # [B, H]
        write = delta[:, t, :, None, None] * Bh[:, t, :, :, None] * x[:, t, :, None, :]
        h = decay[..., None, None] * h + write
        y = torch.einsum("bhn,bhnp->bhp", Ch[:, t], h)
        if D is not None:  # [H] or per channel [H, P]
            y = y + (D[:, None] if D.dim() == 1 else D) * x[:, t]
        ys.append(y)
    return torch.stack(ys, dim=1), h
