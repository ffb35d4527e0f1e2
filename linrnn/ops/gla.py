"""GLA: a data-dependent decay per key dimension, optionally also per value dimension."""

from __future__ import annotations

from linrnn import _validation as check
from linrnn.ops._generic import document, prepare


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
    c = prepare(q, k, v, scale, cu_seqlens, mode, backend, chunk_size, output_final_state)
    gk = check.gate("gk", gk, (c.B, c.T, c.H, c.K), q, layout="[B, T, H, K]", nonpositive=True)
    if gv is not None:
        gv = check.gate("gv", gv, (c.B, c.T, c.H, c.V), q, layout="[B, T, H, V]", nonpositive=True)
    S0 = None if initial_state is None else c.state("initial_state", initial_state)
    o, (S, _, _) = c.run("gla", q, k, v, g=gk, gv=gv, S0=S0)
    return o, (S if output_final_state else None)
