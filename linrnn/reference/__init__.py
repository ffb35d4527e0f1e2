"""Exact PyTorch references of the generic linear recurrence (docs/DESIGN.md §1-2).

Both forms take the *generic* description every family maps onto (see
:mod:`linrnn.ops._generic`), in ``[B, T, H, *]`` layout and in the compute dtype
(float32, or float64 for exact checks)::

    S_t = diag(α_t) S_{t-1} diag(β_t) + ι_t k_t v_tᵀ        α = exp(g), β = exp(gv), ι = exp(gi)
    o_t = scale · q_tᵀ S_t                                   (inclusive)
    o_t = scale · q_tᵀ (S_{t-1} + diag(u) k_t v_tᵀ)          (exclusive + bonus, when u is given)

with the mLSTM max-state stabilizer when ``stabilize=True`` (g is then log σ(f̃), gi is ĩ).
Each returns ``(o, m, S_T, m_T)``: the raw output, the per-step stabilizer ``m [B, T, H]``
(None unless stabilized), the final state ``[B, H, K, V]`` and the final stabilizer ``[B, H]``.

- :func:`recurrent` — the step-by-step loop; the ground truth.
- :func:`parallel` — the quadratic log-space form; an independent second derivation.

The delta rule (DeltaNet, Gated DeltaNet) has a non-diagonal transition and its own loop:
:func:`delta_recurrent` and :func:`delta_parallel` (:mod:`linrnn.reference.delta`).
"""

from linrnn.reference.delta import delta_parallel, delta_recurrent
from linrnn.reference.parallel import parallel
from linrnn.reference.recurrent import recurrent

__all__ = ["delta_parallel", "delta_recurrent", "parallel", "recurrent"]
