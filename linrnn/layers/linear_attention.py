"""Causal linear attention layer (Katharopoulos et al. 2020; fast-transformers, seed 004).

    o_t = φ(q_t)ᵀ Σ_{s≤t} φ(k_s) v_sᵀ / (φ(q_t)ᵀ Σ_{s≤t} φ(k_s) + eps)

with a feature map φ applied per head: ``"elu"`` (elu(x) + 1, the paper's default), ``"relu"``,
``"identity"`` or ``"performer"`` (positive random features, FAVOR+: φ(x) =
exp(Wx − ‖x‖²/2)/√m with a fixed Gaussian projection W drawn from a seed and kept as a buffer,
so that φ(q)·φ(k) estimates exp(q·k/√d)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn.layers.common import Mixer, check_divisible, model_width, project, split_heads
from linrnn.ops import linear_attn

FEATURE_MAPS = ("elu", "relu", "identity", "performer")


class LinearAttention(Mixer):
    """Multi-head causal linear attention.

    Args:
        d_model: model width D (fla's name: hidden_size).
        num_heads: H; the key and value widths are ``D·expand_k`` and ``D·expand_v``.
        feature_map: ``"elu"`` (default), ``"relu"``, ``"identity"`` or ``"performer"``.
        num_features: random features per head for ``"performer"`` (default: the head's key
            dimension); the op's key dimension is then this number.
        feature_seed: seed of the performer projection (a buffer, saved with the weights).
        normalize: divide by ``φ(q)·Σφ(k) + eps``; None means True for the positive maps
            (elu, relu, performer) and False for identity, whose denominator can vanish.
        eps: added to the denominator.
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache`.
        mode, chunk_size, backend: passed to :func:`linrnn.linear_attn`.

    The op runs with ``scale=1`` (the feature map already sets the scale).
    """

    def __init__(
        self,
        d_model: int | None = None,
        num_heads: int = 4,
        *,
        hidden_size: int | None = None,
        feature_map: str = "elu",
        expand_k: float = 1.0,
        expand_v: float = 1.0,
        num_features: int | None = None,
        feature_seed: int = 0,
        normalize: bool | None = None,
        eps: float = 1e-6,
        layer_idx: int = 0,
        mode: str | None = None,
        chunk_size: int | None = None,
        backend: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        d_model = model_width("LinearAttention", d_model, hidden_size)
        super().__init__()
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {feature_map!r}")
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.num_heads, self.feature_map = d_model, num_heads, feature_map
        self.key_dim, self.value_dim = int(d_model * expand_k), int(d_model * expand_v)
        self.head_k = check_divisible("key_dim", self.key_dim, num_heads)
        self.head_v = check_divisible("value_dim", self.value_dim, num_heads)
        self.normalize = feature_map != "identity" if normalize is None else bool(normalize)
        self.eps = eps
        self.layer_idx, self.mode, self.chunk_size, self.backend = (
            layer_idx, mode, chunk_size, backend,
        )  # fmt: skip
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False, **kw)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False, **kw)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False, **kw)
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False, **kw)
        if feature_map == "performer":
            m = num_features or self.head_k
            gen = torch.Generator().manual_seed(feature_seed)
            proj = torch.randn(
                num_heads, self.head_k, m, generator=gen, dtype=torch.float64, device="cpu"
            )
            self.register_buffer("projection", proj.to(dtype or torch.get_default_dtype()))
            if device is not None:
                self.projection = self.projection.to(device)
        else:
            self.projection = None

    def phi(self, x: Tensor, is_query: bool) -> Tensor:
        """The feature map on ``[B, T, H, Dk]``."""
        if self.feature_map == "elu":
            return F.elu(x) + 1
        if self.feature_map == "relu":
            return F.relu(x)
        if self.feature_map == "identity":
            return x
        x = x * self.head_k**-0.25  # so that φ(q)·φ(k) ≈ exp(q·k / √d)
        proj = self.projection.to(x.dtype)
        logits = torch.einsum("bthd,hdm->bthm", x, proj) - 0.5 * x.pow(2).sum(-1, keepdim=True)
        if is_query:  # a per-query constant cancels in the normalized output
            logits = logits - logits.detach().amax(-1, keepdim=True)
        return torch.exp(logits) / math.sqrt(proj.shape[-1])

    def mix(self, x, packing, entry, want_state):
        q, k, v = (split_heads(t, self.num_heads)
                   for t in project(x, self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        q, k = self.phi(q, True), self.phi(k, False)
        o, state = self.call_op(
            linear_attn, q, k, v, normalize=self.normalize, eps=self.eps, scale=1.0,
            initial_state=entry.get("state"), **self.op_kwargs(x, packing, want_state),
        )  # fmt: skip
        return self.o_proj(o.flatten(-2)), {"state": state}

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, feature_map={self.feature_map!r}, "
            f"normalize={self.normalize}, key_dim={self.key_dim}, value_dim={self.value_dim}"
        )
