"""RWKV6 (Finch) time mixing: decay per key dimension, exclusive form with a bonus u."""

from __future__ import annotations

from linrnn import _validation as check
from linrnn.ops._generic import document, prepare, run


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
    d, offsets, scale = prepare(
        r, k, v, scale=scale, cu_seqlens=cu_seqlens, mode=mode, backend=backend,
        chunk_size=chunk_size, output_final_state=output_final_state,
        names=("r", "k", "v"),
    )  # fmt: skip
    w = check.gate("w", w, (d.B, d.T, d.H, d.K), r, layout="[B, T, H, K]", nonpositive=True)
    u = check.gate("u", u, (d.H, d.K), r, layout="[H, K]")
    S0 = None
    if initial_state is not None:
        S0 = check.state("initial_state", initial_state, (d.N, d.H, d.K, d.V), r, "[N, H, K, V]")
    o, (S, _, _) = run(
        "rwkv6", r, k, v, scale=scale, g=w, u=u, S0=S0,
        cu_seqlens=offsets, mode=mode, backend=backend, chunk_size=chunk_size,
    )  # fmt: skip
    return o, (S if output_final_state else None)
