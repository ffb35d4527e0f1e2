"""Causal linear attention (fast-transformers, seed 004): no decay, optional sum normalizer."""

from __future__ import annotations

from linrnn import _validation as check
from linrnn.ops._generic import document, prepare


@document
def linear_attn(
    q,
    k,
    v,
    *,
    normalize: bool = False,
    eps: float = 1e-6,
    scale=None,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens=None,
    mode=None,
    chunk_size=None,
    backend=None,
):
    """Causal linear attention.

    ``S_t = S_{t-1} + k_t v_tᵀ``, ``o_t = scale·q_tᵀ S_t``; with ``normalize``,
    ``n_t = n_{t-1} + k_t`` and ``o_t ← o_t / (scale·q_tᵀ n_t + eps)``. Feature maps (elu+1, …)
    belong to the layer: apply them to q and k before calling.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; one float dtype (fp16/bf16/fp32/fp64).
        normalize: divide by the running key sum (the normalized form of seed 004).
        eps: added to the denominator when normalizing.
        {common}

    State: ``S [N, H, K, V]``, or the tuple ``(S, n [N, H, K])`` when ``normalize``.

    Example:
        >>> q = k = torch.randn(2, 128, 4, 64).relu(); v = torch.randn(2, 128, 4, 32)
        >>> o, S = linrnn.linear_attn(q, k, v, output_final_state=True)
    """
    c = prepare(q, k, v, scale, cu_seqlens, mode, backend, chunk_size, output_final_state)
    normalize = check.flag("normalize", normalize)
    eps = check.eps(eps)
    S0 = n0 = None
    if initial_state is not None:
        if normalize:
            S0, n0 = check.state_tuple("initial_state", initial_state, 2, "(S, n)")
            n0 = c.state("initial_state[1] (n)", n0, "n")
        elif isinstance(initial_state, (tuple, list)):
            raise TypeError(
                "initial_state must be the tensor S [N, H, K, V] when normalize=False, got a "
                f"{type(initial_state).__name__}"
            )
        else:
            S0 = initial_state
        S0 = c.state("initial_state (S)", S0)
    o, (S, n, _) = c.run(
        "linear_attn", q, k, v, track_n=normalize,
        normalizer="sum" if normalize else None, eps=eps, S0=S0, n0=n0,
    )  # fmt: skip
    if not output_final_state:
        return o, None
    return o, ((S, n) if normalize else S)
