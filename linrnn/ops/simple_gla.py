"""Simple GLA: a data-dependent scalar decay per head and step (also mLSTM-sig without input
gate, Mamba-2-style scalar gating)."""

from __future__ import annotations

from linrnn import _validation as check
from linrnn.ops._generic import document, prepare, run


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
    g = check.gate("g", g, (d.B, d.T, d.H), q, layout="[B, T, H]", nonpositive=True)
    S0 = None
    if initial_state is not None:
        S0 = check.state("initial_state", initial_state, (d.N, d.H, d.K, d.V), q, "[N, H, K, V]")
    o, (S, _, _) = run(
        "simple_gla", q, k, v, scale=scale, g=g, S0=S0,
        cu_seqlens=offsets, mode=mode, backend=backend, chunk_size=chunk_size,
    )  # fmt: skip
    return o, (S if output_final_state else None)
