"""Softmax attention with rotary position embeddings and a KV cache: the baseline mixer
(``torch.nn.functional.scaled_dot_product_attention``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn.layers.common import Cache, Mixer, Packing, check_divisible, split_heads


def rotary(x: Tensor, pos: Tensor, theta: float) -> Tensor:
    """Rotate pairs (i, i + Dh/2) of ``x [B, H, T, Dh]`` by ``pos [B, T] · θ^(−2i/Dh)``."""
    half = x.shape[-1] // 2
    freq = theta ** (-torch.arange(half, device=x.device, dtype=torch.float64) / half)
    ang = (pos.double()[..., None] * freq)[:, None]  # [B, 1, T, half]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    rot = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([rot, x[..., 2 * half :]], dim=-1)


class SoftmaxAttention(Mixer):
    """Causal multi-head softmax attention with RoPE.

    Args:
        d_model: model width D; num_heads: H (head width D/H).
        rope_theta: rotary base (10000).
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache` (which keeps the keys,
            values, their padding mask and each row's position).

    Padding (``attention_mask``) masks keys; positions count only valid tokens, so a padded
    row is computed as the same row without padding.
    """

    def __init__(
        self, d_model: int, num_heads: int = 4, *, rope_theta: float = 10000.0,
        layer_idx: int = 0, device=None, dtype=None, **unused,
    ) -> None:  # fmt: skip
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.num_heads, self.rope_theta = d_model, num_heads, rope_theta
        self.head_dim = check_divisible("d_model", d_model, num_heads)
        self.layer_idx = layer_idx
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=False, **kw)
        self.o_proj = nn.Linear(d_model, d_model, bias=False, **kw)

    def forward(self, x: Tensor, attention_mask=None, cache: Cache | None = None) -> Tensor:
        B, T, _ = x.shape
        if attention_mask is None:
            valid = torch.ones(B, T, dtype=torch.bool, device=x.device)
        elif isinstance(attention_mask, Packing):
            valid = attention_mask.mask
        else:
            valid = attention_mask.to(x.device).bool()
        entry = cache[self.layer_idx] if cache is not None else {}
        start = entry.get("pos", torch.zeros(B, dtype=torch.long, device=x.device))
        pos = start[:, None] + valid.long().cumsum(1) - 1
        q, k, v = (
            split_heads(t, self.num_heads).transpose(1, 2)
            for t in self.qkv_proj(x).chunk(3, dim=-1)
        )  # [B, H, T, Dh]
        q, k = rotary(q, pos, self.rope_theta), rotary(k, pos, self.rope_theta)
        key_valid = valid
        if "k" in entry:
            k = torch.cat([entry["k"], k], dim=2)
            v = torch.cat([entry["v"], v], dim=2)
            key_valid = torch.cat([entry["key_valid"], valid], dim=1)
        P = k.shape[2] - T  # columns already cached
        if attention_mask is None and P == 0:
            # No padding, no cache: plain causal, which SDPA runs with its fused (flash)
            # kernels; any explicit mask would send it to the slower masked path.
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            rows = torch.arange(T, device=x.device)[:, None] + P
            cols = torch.arange(k.shape[2], device=x.device)[None]
            allowed = (cols <= rows)[None] & key_valid[:, None, :]
            allowed = allowed | (cols == rows)[None]  # a padding query sees itself
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        o = o.transpose(1, 2).flatten(-2) * valid[..., None].to(x.dtype)
        if cache is not None:
            cache.update(
                self.layer_idx,
                {"k": k, "v": v, "key_valid": key_valid, "pos": start + valid.long().sum(1)},
            )
        return self.o_proj(o)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, rope_theta={self.rope_theta}"
