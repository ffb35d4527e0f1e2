"""Simple GLA: a data-dependent scalar decay per head and step (also mLSTM-sig without input
gate, Mamba-2-style scalar gating)."""

from __future__ import annotations

from linrnn import _validation as check
from linrnn.ops._generic import document, prepare


@document
def simple_gla(
    q,
    k,
    v,
    g,
    *,
    scale=None,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens=None,
    mode=None,
    chunk_size=None,
    backend=None,
):
    """Gated linear attention with a scalar gate per head.

    ``S_t = exp(g_t) S_{t-1} + k_t v_tᵀ``, ``o_t = scale·q_tᵀ S_t``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; one float dtype (fp16/bf16/fp32/fp64).
        g: ``[B, T, H]`` log forget gate, finite and ≤ 0 (e.g. ``logsigmoid(x)``); any float
            dtype, used in fp32.
        {common}

    State: ``S [N, H, K, V]``.

    Example:
        >>> g = torch.nn.functional.logsigmoid(torch.randn(2, 128, 4))
        >>> o, S = linrnn.simple_gla(q, k, v, g, output_final_state=True)
    """
    c = prepare(q, k, v, scale, cu_seqlens, mode, backend, chunk_size, output_final_state)
    g = check.gate("g", g, (c.B, c.T, c.H), q, layout="[B, T, H]", nonpositive=True)
    S0 = None if initial_state is None else c.state("initial_state", initial_state)
    o, (S, _, _) = c.run("simple_gla", q, k, v, g=g, S0=S0)
    return o, (S if output_final_state else None)
