"""RWKV6 (Finch) time mixing: decay per key dimension, exclusive form with a bonus u."""

from __future__ import annotations

from linrnn import _validation as check
from linrnn.ops._generic import document, prepare


@document
def rwkv6(
    r,
    k,
    v,
    w,
    u,
    *,
    scale=None,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens=None,
    mode=None,
    chunk_size=None,
    backend=None,
):
    """RWKV6 linear attention (the recurrence of seed 002's naive loop, with a scale).

    ``o_t = scale·r_tᵀ (S_{t-1} + diag(u) k_t v_tᵀ)``, then
    ``S_t = diag(exp(w_t)) S_{t-1} + k_t v_tᵀ``. RWKV models use ``scale=1.0``.

    Args:
        r, k: ``[B, T, H, K]`` receptance and key; v: ``[B, T, H, V]``; one float dtype.
        w: ``[B, T, H, K]`` log decay, finite and ≤ 0 (RWKV6: ``w = −exp(w_raw)``).
        u: ``[H, K]`` bonus for the current token ("time_first"), finite.
        {common}

    State: ``S [N, H, K, V]``.

    Example:
        >>> w = -torch.exp(torch.randn(2, 128, 4, 64)); u = torch.randn(4, 64)
        >>> o, _ = linrnn.rwkv6(r, k, v, w, u, scale=1.0)
    """
    c = prepare(
        r, k, v, scale, cu_seqlens, mode, backend, chunk_size, output_final_state, ("r", "k", "v")
    )
    w = check.gate("w", w, (c.B, c.T, c.H, c.K), r, layout="[B, T, H, K]", nonpositive=True)
    u = check.gate("u", u, (c.H, c.K), r, layout="[H, K]")
    S0 = None if initial_state is None else c.state("initial_state", initial_state)
    o, (S, _, _) = c.run("rwkv6", r, k, v, g=w, u=u, S0=S0)
    return o, (S if output_final_state else None)
