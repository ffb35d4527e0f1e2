"""Gated linear attention layer (GLA; Yang et al. 2024 §4.4, seed 001 §0x3).

gk_t = logsigmoid(x_t W₁ W₂ + b) / normalizer          [B, T, H, Dk] log decay
S_t  = diag(exp(gk_t)) S_{t-1} + k_t v_tᵀ,   o_t = q_tᵀ S_t / √Dk
y_t  = W_o (RMSNorm_head(o_t) ⊙ swish(x_t W_g))
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from linrnn.layers.common import GatedHeadsMixer, model_width, split_heads, upcast
from linrnn.ops import gla


class GatedLinearAttention(GatedHeadsMixer):
    """GLA layer.

    Args:
        d_model: model width D (fla's name: hidden_size).
        num_heads: H.
        expand_k, expand_v: key and value widths ``D·expand_k``, ``D·expand_v`` (GLA: 0.5, 1).
        gate_low_rank_dim: rank r of the gate projection ``D → r → D·expand_k``.
        gate_logit_normalizer: the log decay is ``logsigmoid(·) / normalizer`` (16), which keeps
            decays near 1 at initialization.
        norm_eps: epsilon of the per-head RMSNorm.
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache`.
        mode, chunk_size, backend: passed to :func:`linrnn.gla`.
    """

    def __init__(
        self,
        d_model: int | None = None,
        num_heads: int = 4,
        *,
        hidden_size: int | None = None,
        expand_k: float = 0.5,
        expand_v: float = 1.0,
        gate_low_rank_dim: int = 16,
        gate_logit_normalizer: float = 16.0,
        norm_eps: float = 1e-6,
        layer_idx: int = 0,
        mode: str | None = None,
        chunk_size: int | None = None,
        backend: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        d_model = model_width("GatedLinearAttention", d_model, hidden_size)
        super().__init__(
            d_model, num_heads, expand_k, expand_v, norm_eps, layer_idx, mode, chunk_size,
            backend, device, dtype,
        )  # fmt: skip
        kw = {"device": device, "dtype": dtype}
        self.gate_logit_normalizer = gate_logit_normalizer
        self.gk_proj = nn.Sequential(
            nn.Linear(d_model, gate_low_rank_dim, bias=False, **kw),
            nn.Linear(gate_low_rank_dim, self.key_dim, bias=True, **kw),
        )

    def decays(self, x):
        gk = F.logsigmoid(upcast(self.gk_proj(x))) / self.gate_logit_normalizer
        return {"gk": split_heads(gk, self.num_heads)}

    def recurrence(self, q, k, v, initial_state, gk, **kwargs):
        return self.call_op(gla, q, k, v, gk, initial_state=initial_state, **kwargs)
