"""The feed-forward halves of the blocks: SwiGLU (the default) and RWKV's channel mixing, which
mixes each token with the previous one (a token shift, kept in the cache and restarted at
every sequence start like the mixers' states)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn.layers.common import Packing, glue_on_triton, token_shift

try:  # the fused gated activation
    from linrnn.engine import swiglu as triton_swiglu
except ImportError:
    triton_swiglu = None


class SwiGLU(nn.Module):
    """``W_down (silu(x W_gate) ⊙ x W_up)``, with ``W_gate`` and ``W_up`` one projection.

    Eager calls on a GPU (``backend`` None or "triton"; on CPU tensors "triton" under the
    Triton interpreter) form ``silu(g) ⊙ u`` in one Triton pass each way
    (:mod:`linrnn.engine.swiglu`, fp32 inside, rounded once); otherwise, and while
    ``torch.compile`` traces, the PyTorch form."""

    def __init__(self, d_model: int, hidden: int, device=None, dtype=None,
                 backend: str | None = None) -> None:  # fmt: skip
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.backend = backend
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False, **kw)
        self.down = nn.Linear(hidden, d_model, bias=False, **kw)

    @torch.no_grad()
    def reset_parameters(self, std: float, num_layers: int) -> None:
        nn.init.normal_(self.gate_up.weight, std=std)
        nn.init.normal_(self.down.weight, std=std / math.sqrt(2 * num_layers))

    def forward(self, x: Tensor, packing: Packing | None = None, entry=None):
        """``(y, None)``: position-wise, it keeps nothing in the cache."""
        return self.down(swiglu(self.gate_up(x), self.backend)), None


def swiglu(gu: Tensor, backend: str | None = None) -> Tensor:
    """``silu(g) ⊙ u`` of the packed projection ``gu = [g | u]`` (``[..., 2H]``), in gu's
    dtype: one Triton pass each way on a GPU (see :class:`SwiGLU`), else the PyTorch form."""
    if gu.dim() == 0 or gu.shape[-1] % 2:
        raise ValueError(
            f"swiglu: the last dimension must be even ([g | u]), got {tuple(gu.shape)}"
        )
    if triton_swiglu is not None and gu.numel() and glue_on_triton(backend, gu):
        return triton_swiglu.swiglu(gu)
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


class RWKVChannelMix(nn.Module):
    """RWKV6's channel mixing: with ``Δ_t = x_{t−1} − x_t``,

        y_t = σ(W_r (x_t + Δ_t ⊙ μ_r)) ⊙ W_v relu(W_k (x_t + Δ_t ⊙ μ_k))²

    ``entry`` (the cache) holds each sequence's last input for the next call's shift."""

    def __init__(self, d_model: int, hidden: int, device=None, dtype=None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.mu_k = nn.Parameter(torch.zeros(d_model, **kw))
        self.mu_r = nn.Parameter(torch.zeros(d_model, **kw))
        self.key = nn.Linear(d_model, hidden, bias=False, **kw)
        self.value = nn.Linear(hidden, d_model, bias=False, **kw)
        self.receptance = nn.Linear(d_model, d_model, bias=False, **kw)

    @torch.no_grad()
    def reset_parameters(self, std: float, num_layers: int, layer_idx: int = 0) -> None:
        """RWKV's mixing coefficients ``1 − (d/D)^(1 − i/L)`` and normal weights."""
        D = self.mu_k.shape[0]
        ddd = torch.arange(D, dtype=torch.float64, device="cpu") / D
        mu = 1 - ddd ** (1.0 - layer_idx / max(num_layers, 1))
        self.mu_k.copy_(mu)
        self.mu_r.copy_(mu)
        nn.init.normal_(self.key.weight, std=std)
        nn.init.normal_(self.receptance.weight, std=std)
        nn.init.normal_(self.value.weight, std=std / math.sqrt(2 * num_layers))

    def forward(self, x: Tensor, packing: Packing | None = None, previous: Tensor | None = None):
        """``x [B, T, D]`` (padded per ``packing``) → ``(y, last input of each sequence)``."""
        xs = x if packing is None else packing.pack(x)
        cu = None if packing is None else packing.cu_seqlens
        delta = token_shift(xs, cu, previous) - xs
        k = torch.relu(self.key(xs + delta * self.mu_k)).square()
        y = torch.sigmoid(self.receptance(xs + delta * self.mu_r)) * self.value(k)
        last = xs[:, -1] if packing is None else packing.last(xs, previous)
        return (y if packing is None else packing.unpack(y)), last.detach()
