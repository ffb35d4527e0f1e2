"""GLA: a data-dependent decay per key dimension, optionally also per value dimension."""

from __future__ import annotations

from linrnn import _validation as check
from linrnn.ops._generic import document, prepare, run


@document
def gla(
    q,
    k,
    v,
    gk,
    *,
    gv=None,
    scale=None,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens=None,
    mode=None,
    chunk_size=None,
    backend=None,
):
    """Gated linear attention (Yang et al. 2024).

    ``S_t = diag(exp(gk_t)) S_{t-1} diag(exp(gv_t)) + k_t v_tᵀ``, ``o_t = scale·q_tᵀ S_t``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; one float dtype (fp16/bf16/fp32/fp64).
        gk: ``[B, T, H, K]`` log decay over the key dimension, finite and ≤ 0.
        gv: optional ``[B, T, H, V]`` log decay over the value dimension, finite and ≤ 0.
        {common}

    State: ``S [N, H, K, V]``.

    Example:
        >>> gk = torch.nn.functional.logsigmoid(torch.randn(2, 128, 4, 64)) / 16
        >>> o, _ = linrnn.gla(q, k, v, gk)
    """
    d, offsets, scale = prepare(
        q,
        k,
        v,
        scale=scale,
        cu_seqlens=cu_seqlens,
        mode=mode,
        backend=backend,
        chunk_size=chunk_size,
        output_final_state=output_final_state,
    )
    gk = check.gate("gk", gk, (d.B, d.T, d.H, d.K), q, layout="[B, T, H, K]", nonpositive=True)
    if gv is not None:
        gv = check.gate("gv", gv, (d.B, d.T, d.H, d.V), q, layout="[B, T, H, V]", nonpositive=True)
    S0 = None
    if initial_state is not None:
        S0 = check.state("initial_state", initial_state, (d.N, d.H, d.K, d.V), q, "[N, H, K, V]")
    o, (S, _, _) = run(
        "gla", q, k, v, scale=scale, g=gk, gv=gv, S0=S0,
        cu_seqlens=offsets, mode=mode, backend=backend, chunk_size=chunk_size,
    )  # fmt: skip
    return o, (S if output_final_state else None)
