"""Multi-scale retention layer (RetNet; Sun et al. 2023), without the xPos rotation.

    S_t = γ_h S_{t-1} + k_t v_tᵀ,   o_t = q_tᵀ S_t / √Dk,   γ_h = 1 − 2^(−5−h)
    y_t = W_o (RMSNorm_head(o_t) ⊙ swish(x_t W_g))

The decays are fixed (a buffer), one per head, spanning short to long memories.
"""

from __future__ import annotations

import torch

from linrnn.layers.common import GatedHeadsMixer
from linrnn.ops import retention


class MultiScaleRetention(GatedHeadsMixer):
    """Retention layer with fixed per-head decays ``γ_h = 1 − 2^(−5−h)``.

    Args:
        d_model: model width D.
        num_heads: H.
        expand_k, expand_v: key and value widths (RetNet: 1 and 2).
        norm_eps: epsilon of the per-head RMSNorm.
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache`.
        mode, chunk_size, backend: passed to :func:`linrnn.retention`.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int = 4,
        *,
        expand_k: float = 1.0,
        expand_v: float = 2.0,
        norm_eps: float = 1e-6,
        layer_idx: int = 0,
        mode: str = "chunk",
        chunk_size: int | None = None,
        backend: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            d_model, num_heads, expand_k, expand_v, norm_eps, layer_idx, mode, chunk_size,
            backend, device, dtype,
        )  # fmt: skip
        h = torch.arange(num_heads, dtype=torch.float64)
        log_decay = torch.log1p(-(2.0 ** (-5.0 - h)))
        self.register_buffer("log_decay", log_decay.float().to(device), persistent=False)

    def decays(self, x):
        return {"log_decay": self.log_decay}

    def recurrence(self, q, k, v, initial_state, log_decay, **kwargs):
        return self.call_op(retention, q, k, v, log_decay, initial_state=initial_state, **kwargs)
