"""The step-by-step recurrence: one loop over time, the ground truth for every other path."""

from __future__ import annotations

import torch
from torch import Tensor


def recurrent(
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
    """Run the generic recurrence one step at a time (see :mod:`linrnn.reference`).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``, all in the compute dtype.
        g: log decay, ``[B, T, H]`` (scalar per head) or ``[B, T, H, K]`` (vector), or None (α = 1).
        gv: log decay over V, ``[B, T, H, V]``, or None.
        gi: log input gate ``[B, T, H]`` or None (ι = 1). With ``stabilize`` it is ĩ (unbounded).
        u: bonus ``[H, K]``; switches to the exclusive form.
        stabilize: mLSTM max-state stabilizer (needs scalar ``g`` and ``gi``).
        S0: initial state ``[B, H, K, V]``; m0: initial stabilizer ``[B, H]`` (−∞ if None).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = q.dtype
    S = torch.zeros(B, H, K, V, dtype=dt, device=q.device) if S0 is None else S0
    m = None
    if stabilize:
        m = torch.full((B, H), float("-inf"), dtype=dt, device=q.device) if m0 is None else m0
    outs, ms = [], []
    # Slice time once: indexing x[:, t] inside the loop makes autograd build a full-size zero
    # tensor per step in backward (T² work).
    steps = lambda x: [None] * T if x is None else x.unbind(1)  # noqa: E731
    qs, ks, vs, gs, gvs, gis = map(steps, (q, k, v, g, gv, gi))
    for t in range(T):
        q_t, k_t, v_t = qs[t] * scale, ks[t], vs[t]  # [B, H, K], [B, H, K], [B, H, V]
        kv = k_t[..., :, None] * v_t[..., None, :]  # [B, H, K, V]
        if stabilize:
            lf, li = gs[t], gis[t]  # [B, H]
            m_new = torch.maximum(lf + m, li)
            f_t = torch.exp(lf + m - m_new)[..., None, None]
            i_t = torch.exp(li - m_new)[..., None, None]
            S = f_t * S + i_t * kv
            m = m_new
            ms.append(m)
            outs.append((q_t[..., :, None] * S).sum(-2))
            continue
        if u is not None:  # exclusive form: read the state before this step's update, plus bonus
            outs.append((q_t[..., :, None] * (S + u[..., :, None] * kv)).sum(-2))
        a = 1.0
        if g is not None:
            a_t = torch.exp(gs[t])  # [B, H] or [B, H, K]
            a = a_t[..., None, None] if g.dim() == 3 else a_t[..., None]
        if gv is not None:
            a = a * torch.exp(gvs[t])[..., None, :]
        if gi is not None:
            kv = torch.exp(gis[t])[..., None, None] * kv
        S = a * S + kv
        if u is None:
            outs.append((q_t[..., :, None] * S).sum(-2))
    o = torch.stack(outs, dim=1)  # [B, T, H, V]
    m_seq = torch.stack(ms, dim=1) if stabilize else None
    return o, m_seq, S, m
