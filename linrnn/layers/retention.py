"""Multi-scale retention layer (RetNet; Sun et al. 2023), without xPos's length scaling.

    S_t = γ_h S_{t-1} + k_t v_tᵀ,   o_t = q_tᵀ S_t / √Dk,   γ_h = 1 − 2^(−5−h)
    y_t = W_o (RMSNorm_head(o_t) ⊙ swish(x_t W_g))

The decays are fixed (a buffer), one per head, spanning short to long memories. With
``rotary=True`` q and k are first rotated by their position (RoPE, halves of each head, as
fla's RetNet layer does); positions restart with each sequence (padded row or packed document)
and continue across cached calls.
"""

from __future__ import annotations

import torch

from linrnn.layers.common import GatedHeadsMixer, model_width
from linrnn.layers.softmax_attention import rotary
from linrnn.ops import retention


class MultiScaleRetention(GatedHeadsMixer):
    """Retention layer with fixed per-head decays ``γ_h = 1 − 2^(−5−h)``.

    Args:
        d_model: model width D (fla's name: hidden_size).
        num_heads: H.
        expand_k, expand_v: key and value widths (RetNet: 1 and 2).
        rotary: rotate q and k by their position (RoPE) before the recurrence (False).
        rope_theta: the rotary base (10000).
        norm_eps: epsilon of the per-head RMSNorm.
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache`.
        mode, chunk_size, backend: passed to :func:`linrnn.retention`.
    """

    def __init__(
        self,
        d_model: int | None = None,
        num_heads: int = 4,
        *,
        hidden_size: int | None = None,
        expand_k: float = 1.0,
        expand_v: float = 2.0,
        rotary: bool = False,
        rope_theta: float = 10000.0,
        norm_eps: float = 1e-6,
        layer_idx: int = 0,
        mode: str | None = None,
        chunk_size: int | None = None,
        backend: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        d_model = model_width("MultiScaleRetention", d_model, hidden_size)
        super().__init__(
            d_model, num_heads, expand_k, expand_v, norm_eps, layer_idx, mode, chunk_size,
            backend, device, dtype,
        )  # fmt: skip
        self.rotary, self.rope_theta = bool(rotary), rope_theta

    def rotate(self, q, k, packing, entry):
        if not self.rotary:
            return q, k, {}
        n = q.shape[0] if packing is None else packing.B  # sequences
        start = entry.get("pos")
        if start is None:
            start = torch.zeros(n, dtype=torch.long, device=q.device)
        if packing is None:
            T = q.shape[1]
            pos = start[:, None] + torch.arange(T, device=q.device)
            end = start + T
        else:
            doc, inside = packing.document_positions(q.device)
            pos = (start[doc] + inside)[None]
            cu = packing.cu_seqlens
            lengths = torch.tensor([cu[i + 1] - cu[i] for i in range(n)], device=q.device)
            end = start + lengths
        q, k = (rotary(t.transpose(1, 2), pos, self.rope_theta).transpose(1, 2) for t in (q, k))
        return q, k, {"pos": end}

    @property
    def log_decay(self) -> torch.Tensor:
        """``log γ_h`` per head, fp32 (fp64 in an fp64 layer); computed, not stored, so there is
        nothing to save or load."""
        w = self.q_proj.weight
        dtype = torch.float64 if w.dtype == torch.float64 else torch.float32
        h = torch.arange(self.num_heads, dtype=dtype, device=w.device)
        return torch.log1p(-torch.exp2(-5.0 - h))

    def decays(self, x):
        return {"log_decay": self.log_decay}

    def recurrence(self, q, k, v, initial_state, log_decay, **kwargs):
        return self.call_op(retention, q, k, v, log_decay, initial_state=initial_state, **kwargs)
