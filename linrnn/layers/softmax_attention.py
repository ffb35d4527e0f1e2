"""Softmax attention with rotary position embeddings and a KV cache: the baseline mixer
(``torch.nn.functional.scaled_dot_product_attention``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn.layers.common import Cache, Mixer, as_packing, check_divisible, model_width, split_heads


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
        d_model: model width D (fla's name: hidden_size); num_heads: H (head width D/H).
        num_kv_heads: heads of the keys and values (grouped-query attention; default H),
            a divisor of H: query head h reads key/value head ``h // (H / num_kv_heads)``.
        rope_theta: rotary base (10000).
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache` (which keeps the keys,
            values, their padding mask and each row's position).

    Padding (``attention_mask``) masks keys; positions count only valid tokens, so a padded
    row is computed as the same row without padding. Packed documents (``cu_seqlens``) attend
    only within their document, with positions from 0 in each.
    """

    def __init__(
        self, d_model: int | None = None, num_heads: int = 4, *,
        hidden_size: int | None = None, num_kv_heads: int | None = None,
        rope_theta: float = 10000.0, layer_idx: int = 0, device=None, dtype=None,
    ) -> None:  # fmt: skip
        super().__init__()
        d_model = model_width("SoftmaxAttention", d_model, hidden_size)
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.num_heads, self.rope_theta = d_model, num_heads, rope_theta
        self.head_dim = check_divisible("d_model", d_model, num_heads)
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if self.num_kv_heads < 1 or num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads}")
        self.layer_idx = layer_idx
        kv = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(d_model, d_model + 2 * kv, bias=False, **kw)
        self.o_proj = nn.Linear(d_model, d_model, bias=False, **kw)

    def forward(
        self, x: Tensor, attention_mask=None, cache: Cache | None = None, cu_seqlens=None
    ) -> Tensor:
        """As :meth:`Mixer.forward`; a cache cannot be combined with cu_seqlens here."""
        if x.dim() != 3:
            raise ValueError(f"x must be [B, T, D], got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        packing = as_packing(attention_mask, x, cu_seqlens)
        document = None
        if packing is None:
            valid = torch.ones(B, T, dtype=torch.bool, device=x.device)
        elif packing.packed:
            if cache is not None:
                raise ValueError("SoftmaxAttention takes no cache together with cu_seqlens")
            valid = torch.ones(B, T, dtype=torch.bool, device=x.device)
            document, inside = packing.document_positions(x.device)
        else:
            valid = packing.mask
            # padding may hold garbage (NaN, inf): a masked key's weight is 0, but 0·NaN is not
            x = torch.where(valid[..., None], x, 0.0)
        entry = cache[self.layer_idx] if cache is not None else {}
        start = entry.get("pos", torch.zeros(B, dtype=torch.long, device=x.device))
        if document is None:
            pos = start[:, None] + valid.long().cumsum(1) - 1
        else:
            pos = inside[None]
        q, k, v = self.qkv_proj(x).split(
            [self.d_model, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim],
            dim=-1,
        )
        q = split_heads(q, self.num_heads).transpose(1, 2)  # [B, H, T, Dh]
        k = split_heads(k, self.num_kv_heads).transpose(1, 2)  # [B, Hkv, T, Dh]
        v = split_heads(v, self.num_kv_heads).transpose(1, 2)
        q, k = rotary(q, pos, self.rope_theta), rotary(k, pos, self.rope_theta)
        key_valid = valid
        if "k" in entry:
            k = torch.cat([entry["k"], k], dim=2)
            v = torch.cat([entry["v"], v], dim=2)
            key_valid = torch.cat([entry["key_valid"], valid], dim=1)
        if cache is not None:
            cache.update(
                self.layer_idx,
                {"k": k, "v": v, "key_valid": key_valid, "pos": start + valid.long().sum(1)},
            )
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        P = k.shape[2] - T  # columns already cached
        if packing is None and P == 0:
            # No padding, no cache: plain causal, which SDPA runs with its fused (flash)
            # kernels; any explicit mask would send it to the slower masked path.
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            rows = torch.arange(T, device=x.device)[:, None] + P
            cols = torch.arange(k.shape[2], device=x.device)[None]
            allowed = (cols <= rows)[None] & key_valid[:, None, :]
            if document is not None:
                allowed = allowed & (document[:, None] == document[None, :])[None]
            allowed = allowed | (cols == rows)[None]  # a padding query sees itself
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        o = torch.where(valid[..., None], o.transpose(1, 2).flatten(-2), 0.0)
        return self.o_proj(o)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"rope_theta={self.rope_theta}"
        )
