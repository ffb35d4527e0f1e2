"""Pure-PyTorch chunkwise delta rule (DeltaNet, Gated DeltaNet), matmul-based, differentiable by
autograd (docs/DESIGN.md §1b).

Per chunk of L steps (local rows r, columns s), with ``b`` the chunk-local cumulative log decay
and ``S0`` the state entering the chunk, the WY/UT form::

    N_rs = β_r exp(b_r − b_s) k_r·k_s   (s < r)        A = (I + N)⁻¹
    U = A diag(β) V        W = A diag(β exp(b)) K       vn = U − W S0
    o_r = scale (exp(b_r) q_rᵀ S0 + Σ_{s≤r} exp(b_r − b_s) (q_r·k_s) vn_s)
    S'  = exp(b_L) S0 + Σ_s exp(b_L − b_s) k_s vn_sᵀ

U and W of all chunks come from one batched triangular solve; the states then walk over the
chunks (a Python loop of two matmuls per chunk), and the outputs of all chunks are one batched
product at the end. Every exponent is a causal difference of chunk-local cumulative log decays
(≤ 0), formed in fp64 and masked to −∞ before ``exp``: strong decays underflow to 0, never
overflow.

Under ``torch.compile`` the walk stays a Python loop, so a graph is specialized to its number of
chunks ``ceil(T / L)``: lengths with the same chunk count share one compilation, a new count
compiles again (training at a fixed length compiles once). The loop-free alternatives cost more
than they save: the chunk-to-chunk map ``S ↦ M S + B`` has a K×K matrix M, so a closed form
needs products of those matrices, and solving for every chunk's new values at once is a T×T
triangular system (quadratic memory in T).

The solve is backward stable for a well-conditioned ``I + N``: with β ∈ [0, 2] and unit-norm
keys each step's transition ``I − β k kᵀ`` is non-expansive. With ``β|k|² > 2`` the recurrence
itself grows exponentially (in every form), and the solve's entries grow with it, amplifying
rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linrnn.engine.torch_chunk import _from_chunks, _to_chunks, causal_product

NINF = float("-inf")


def chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    *,
    scale: float,
    g: Tensor | None = None,
    S0: Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """The chunkwise delta rule; arguments and returns as in
    :func:`linrnn.reference.delta_recurrent` (compute dtype in, compute dtype out), plus
    ``chunk_size`` (any L ≥ 1; T need not be a multiple). Padding is neutral: β = 0 and k = 0
    write nothing, a log decay of 0 keeps the state."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    if group > 1:
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    L = chunk_size
    NC = (T + L - 1) // L
    dt, dev = q.dtype, q.device
    qc, kc, vc = _to_chunks(q, NC, L), _to_chunks(k, NC, L), _to_chunks(v, NC, L)
    bc = _to_chunks(beta[..., None], NC, L)  # [B, HV, NC, L, 1]
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    if g is None:
        gamma = causal.to(dt)  # [L, L]
        decay = tail = last = None
    else:
        b = _to_chunks(g.double(), NC, L).cumsum(-1)  # [B, HV, NC, L] chunk-local, fp64
        log_gamma = (b[..., :, None] - b[..., None, :]).masked_fill(~causal, NINF)
        gamma = torch.exp(log_gamma).to(dt)  # [B, HV, NC, L, L]: exp(b_r − b_s), s ≤ r
        decay = torch.exp(b).to(dt)[..., None]  # exp(b_r)  [B, HV, NC, L, 1]
        tail = torch.exp(b[..., -1:] - b).to(dt)[..., None]  # exp(b_L − b_s)
        last = decay[..., -1, :, None]  # exp(b_L)  [B, HV, NC, 1, 1]

    # The WY/UT step, all chunks at once. unitriangular: N's (zero) diagonal is taken as 1.
    N = (bc * gamma * (kc @ kc.transpose(-1, -2))).tril(-1)
    kw = bc * kc if decay is None else bc * decay * kc
    U = torch.linalg.solve_triangular(N, bc * vc, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(N, kw, upper=False, unitriangular=True)

    # The state walk. unbind once: indexing per step would make autograd build a full-size
    # zero gradient per chunk in backward.
    kt = (kc if tail is None else tail * kc).transpose(-1, -2)  # [B, HV, NC, K, L]
    S = q.new_zeros(B, HV, K, V) if S0 is None else S0
    lasts = [None] * NC if last is None else last.unbind(2)
    states, news = [], []
    for U_n, W_n, kt_n, last_n in zip(U.unbind(2), W.unbind(2), kt.unbind(2), lasts):
        states.append(S)
        vn = U_n - W_n @ S
        news.append(vn)
        S = (S if last_n is None else last_n * S) + kt_n @ vn
    S_in, vn = torch.stack(states, dim=2), torch.stack(news, dim=2)

    qd = qc if decay is None else decay * qc
    # Masked with where and a causal product (torch_chunk.causal_product): a non-finite value at
    # a late step reaches only the outputs from its step on.
    scores = torch.where(causal, qc @ kc.transpose(-1, -2) * gamma, 0.0)
    o = qd @ S_in + causal_product(scores, vn)
    return _from_chunks(scale * o, T), S
