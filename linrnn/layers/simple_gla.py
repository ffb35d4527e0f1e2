"""Simple GLA layer: GLA with one data-dependent scalar decay per head and step.

g_t = logsigmoid(x_t W_a + b) / normalizer     [B, T, H] log decay
S_t = exp(g_t) S_{t-1} + k_t v_tᵀ,   o_t = q_tᵀ S_t / √Dk
y_t = W_o (RMSNorm_head(o_t) ⊙ swish(x_t W_g))
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from linrnn.layers.common import GatedHeadsMixer, model_width, upcast
from linrnn.ops import simple_gla


class SimpleGLA(GatedHeadsMixer):
    """Simple GLA layer (scalar gate per head).

    Args:
        d_model: model width D (fla's name: hidden_size).
        num_heads: H.
        expand_k, expand_v: key and value widths ``D·expand_k``, ``D·expand_v``.
        gate_logit_normalizer: the log decay is ``logsigmoid(x W_a + b) / normalizer``.
        norm_eps: epsilon of the per-head RMSNorm.
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache`.
        mode, chunk_size, backend: passed to :func:`linrnn.simple_gla`.
    """

    def __init__(
        self,
        d_model: int | None = None,
        num_heads: int = 4,
        *,
        hidden_size: int | None = None,
        expand_k: float = 1.0,
        expand_v: float = 1.0,
        gate_logit_normalizer: float = 16.0,
        norm_eps: float = 1e-6,
        layer_idx: int = 0,
        mode: str | None = None,
        chunk_size: int | None = None,
        backend: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        d_model = model_width("SimpleGLA", d_model, hidden_size)
        super().__init__(
            d_model, num_heads, expand_k, expand_v, norm_eps, layer_idx, mode, chunk_size,
            backend, device, dtype,
        )  # fmt: skip
        self.gate_logit_normalizer = gate_logit_normalizer
        self.a_proj = nn.Linear(d_model, num_heads, bias=True, device=device, dtype=dtype)

    def decays(self, x):
        return {"g": F.logsigmoid(upcast(self.a_proj(x))) / self.gate_logit_normalizer}

    def recurrence(self, q, k, v, initial_state, g, **kwargs):
        return self.call_op(simple_gla, q, k, v, g, initial_state=initial_state, **kwargs)
