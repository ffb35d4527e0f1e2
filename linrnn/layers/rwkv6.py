"""RWKV6 (Finch) time mixing (Peng et al. 2024), on :func:`linrnn.rwkv6`.

Token shift with data-dependent interpolation ("ddlerp"): with ``Δ_t = x_{t-1} − x_t``,

    m_* = (tanh((x_t + Δ_t ⊙ μ_x) A) B_*)            (LoRA, one B_* per target * ∈ w,k,v,r,g)
    x*_t = x_t + Δ_t ⊙ (μ_* + m_*)

then ``r, k, v = W_r xr, W_k xk, W_v xv``, the output gate ``g = silu(W_g xg)``, the data-
dependent log decay ``w_t = −exp(d + tanh(xw_t C) D)`` (LoRA again) and the bonus ``u``:

    o_t = r_tᵀ (S_{t-1} + diag(u) k_t v_tᵀ),   S_t = diag(exp(w_t)) S_{t-1} + k_t v_tᵀ
    y_t = W_o (GroupNorm_heads(o_t) ⊙ g_t)

A cache keeps the state S and the last token (for the shift of the next call).
"""

from __future__ import annotations

import torch
from torch import nn

from linrnn.layers.common import (
    HeadNorm,
    Mixer,
    alias,
    check_divisible,
    compute_dtype_for,
    glue_on_triton,
    model_width,
    sequence_ids,
    split_heads,
    token_shift,
    upcast,
)
from linrnn.ops import rwkv6

try:  # the Triton token shift and interpolations
    from linrnn.engine import token_mix as triton_token_mix
except ImportError:
    triton_token_mix = None


class RWKV6TimeMix(Mixer):
    """RWKV6 time-mixing layer.

    Args:
        d_model: model width D (fla's name: hidden_size).
        num_heads: H (RWKV6 uses heads of 64 channels).
        expand_k, expand_v: key and value widths ``D·expand_k``, ``D·expand_v`` (RWKV6: 1, 1).
        mix_low_rank_dim: rank of the ddlerp LoRA (32; fla's name: proj_low_rank_dim).
        decay_low_rank_dim: rank of the decay LoRA (64; fla's name: gate_low_rank_dim).
        layer_idx, num_layers: position in the stack; the initialization depends on the depth
            ratio as in RWKV6 (decays and mixing coefficients), and ``layer_idx`` is the key in
            a :class:`~linrnn.layers.Cache`.
        norm_eps: epsilon of the per-head group norm (RWKV6: 64e-5).
        mode, chunk_size, backend: passed to :func:`linrnn.rwkv6` (which runs with scale 1).
    """

    def __init__(
        self,
        d_model: int | None = None,
        num_heads: int = 4,
        *,
        hidden_size: int | None = None,
        expand_k: float = 1.0,
        expand_v: float = 1.0,
        mix_low_rank_dim: int | None = None,
        decay_low_rank_dim: int | None = None,
        proj_low_rank_dim: int | None = None,
        gate_low_rank_dim: int | None = None,
        layer_idx: int = 0,
        num_layers: int = 1,
        norm_eps: float = 64e-5,
        mode: str | None = None,
        chunk_size: int | None = None,
        backend: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        d_model = model_width("RWKV6TimeMix", d_model, hidden_size)
        mix_low_rank_dim = alias(
            "RWKV6TimeMix", "mix_low_rank_dim", mix_low_rank_dim, "proj_low_rank_dim",
            proj_low_rank_dim, 32,
        )  # fmt: skip
        decay_low_rank_dim = alias(
            "RWKV6TimeMix", "decay_low_rank_dim", decay_low_rank_dim, "gate_low_rank_dim",
            gate_low_rank_dim, 64,
        )  # fmt: skip
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.num_heads = d_model, num_heads
        self.key_dim, self.value_dim = int(d_model * expand_k), int(d_model * expand_v)
        self.head_k = check_divisible("key_dim", self.key_dim, num_heads)
        self.head_v = check_divisible("value_dim", self.value_dim, num_heads)
        self.layer_idx, self.num_layers = layer_idx, num_layers
        self.mode, self.chunk_size, self.backend = mode, chunk_size, backend
        D, r = d_model, mix_low_rank_dim
        self.mu_x = nn.Parameter(torch.empty(D, **kw))
        self.mu = nn.Parameter(torch.empty(5, D, **kw))  # w, k, v, r, g
        self.mix_a = nn.Parameter(torch.empty(D, 5 * r, **kw))
        self.mix_b = nn.Parameter(torch.empty(5, r, D, **kw))
        self.decay = nn.Parameter(torch.empty(self.key_dim, **kw))
        self.decay_a = nn.Parameter(torch.empty(D, decay_low_rank_dim, **kw))
        self.decay_b = nn.Parameter(torch.empty(decay_low_rank_dim, self.key_dim, **kw))
        self.bonus = nn.Parameter(torch.empty(num_heads, self.head_k, **kw))
        self.r_proj = nn.Linear(D, self.key_dim, bias=False, **kw)
        self.k_proj = nn.Linear(D, self.key_dim, bias=False, **kw)
        self.v_proj = nn.Linear(D, self.value_dim, bias=False, **kw)
        self.g_proj = nn.Linear(D, self.value_dim, bias=False, **kw)
        self.o_proj = nn.Linear(self.value_dim, D, bias=False, **kw)
        self.norm = HeadNorm(num_heads, self.head_v, "layer", norm_eps, **kw)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """RWKV6's depth-dependent initialization of the mixing and decay parameters."""
        D, L = self.d_model, max(self.num_layers, 1)
        r01 = self.layer_idx / (L - 1) if L > 1 else 0.0  # 0 at the bottom, 1 at the top
        r10 = 1.0 - self.layer_idx / L  # 1 at the bottom, → 0 at the top
        # Constants on the CPU (copied into the parameters), also when the model is built
        # under a default device such as "meta" (transformers' from_pretrained).
        ddd = torch.arange(D, dtype=torch.float64, device="cpu") / D
        self.mu_x.copy_(1 - ddd**r10)
        self.mu.copy_(torch.stack([
            1 - ddd**r10,                    # w
            1 - ddd**r10,                    # k
            1 - (ddd**r10 + 0.3 * r01),      # v
            1 - ddd ** (0.5 * r10),          # r
            1 - ddd ** (0.5 * r10),          # g
        ]))  # fmt: skip
        n = torch.arange(self.key_dim, dtype=torch.float64, device="cpu") / max(self.key_dim - 1, 1)
        self.decay.copy_(-6 + 5 * n ** (0.7 + 1.3 * r01))
        zigzag = (torch.arange(self.key_dim, device="cpu") + 1) % 3 - 1
        self.bonus.copy_((r01 * (1 - n) + 0.1 * zigzag).view(self.num_heads, self.head_k))
        nn.init.uniform_(self.mix_a, -1e-4, 1e-4)
        nn.init.uniform_(self.mix_b, -1e-2, 1e-2)
        nn.init.uniform_(self.decay_a, -1e-4, 1e-4)
        nn.init.uniform_(self.decay_b, -1e-2, 1e-2)

    def mix(self, x, packing, entry, want_state):
        cu = None if packing is None else packing.cu_seqlens
        xw, xk, xv, xr, xg = self.interpolations(x, cu, entry.get("shift"))
        r = split_heads(self.r_proj(xr), self.num_heads)
        k = split_heads(self.k_proj(xk), self.num_heads)
        v = split_heads(self.v_proj(xv), self.num_heads)
        w_raw = self.decay + torch.tanh(xw @ self.decay_a) @ self.decay_b
        w = split_heads(-torch.exp(upcast(w_raw)), self.num_heads)
        o, state = self.call_op(
            rwkv6, r, k, v, w, self.bonus, scale=1.0, initial_state=entry.get("state"),
            **self.op_kwargs(x, packing, want_state),
        )  # fmt: skip
        y = self.o_proj(self.norm(o, self.g_proj(xg), "silu", self.backend))
        new = {"state": state}
        if want_state:
            if packing is None:
                new["shift"] = x[:, -1].detach()
            else:
                prev = entry.get("shift")
                new["shift"] = packing.last(x.detach(), prev)
        return y, new

    def interpolations(self, x, cu, previous):
        """The token shift's data-dependent interpolations x + (x_{t−1} − x)·(mu_f + m_f),
        f = w, k, v, r, g, with m from the LoRA over x + (x_{t−1} − x)·mu_x. Without a cached
        previous token, eager calls on a GPU run them as one Triton pass each
        (:mod:`linrnn.engine.token_mix`), in the dtype the projections compute in."""
        fused = previous is None and triton_token_mix is not None and x.shape[1] > 0
        if fused and glue_on_triton(self.backend, x):
            sid, dtype = sequence_ids(cu, x.device), compute_dtype_for(x)
            shift = triton_token_mix.lerp_shift
            xx = shift(x, sid, self.mu_x.view(1, -1), None, dtype)[0]
            lora = torch.tanh(xx @ self.mix_a).unflatten(-1, (5, -1))
            m = torch.einsum("btfr,frd->btfd", lora, self.mix_b)  # [B, T, 5, D]
            return shift(x, sid, self.mu, m, dtype).unbind(0)
        delta = token_shift(x, cu, previous) - x
        lora = torch.tanh((x + delta * self.mu_x) @ self.mix_a).unflatten(-1, (5, -1))
        m = torch.einsum("btfr,frd->btfd", lora, self.mix_b) + self.mu  # [B, T, 5, D]
        return tuple(x + delta * m[:, :, j] for j in range(5))

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, key_dim={self.key_dim}, value_dim={self.value_dim}"
