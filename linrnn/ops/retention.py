"""Retention (RetNet): a constant decay γ per head."""

from __future__ import annotations

from linrnn import _validation as check
from linrnn.ops._generic import document, prepare


@document
def retention(
    q,
    k,
    v,
    log_decay,
    *,
    scale=None,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens=None,
    mode=None,
    chunk_size=None,
    backend=None,
):
    """Multi-scale retention.

    ``S_t = γ_h S_{t-1} + k_t v_tᵀ``, ``o_t = scale·q_tᵀ S_t`` with ``γ_h = exp(log_decay[h])``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; one float dtype (fp16/bf16/fp32/fp64).
        log_decay: ``[H]``, log γ per head, finite and ≤ 0 (RetNet: ``log(1 − 2^(−5−h))``).
        {common}

    State: ``S [N, H, K, V]``.

    Example:
        >>> log_decay = torch.log(1 - 2.0 ** (-5 - torch.arange(4.0)))
        >>> o, _ = linrnn.retention(q, k, v, log_decay)
    """
    c = prepare(q, k, v, scale, cu_seqlens, mode, backend, chunk_size, output_final_state)
    log_decay = check.gate("log_decay", log_decay, (c.H,), q, layout="[H]", nonpositive=True)
    S0 = None if initial_state is None else c.state("initial_state", initial_state)
    g = log_decay.view(1, 1, c.H).expand(c.B, c.T, c.H)
    o, (S, _, _) = c.run("retention", q, k, v, g=g, S0=S0)
    return o, (S if output_final_state else None)
