"""mLSTM layer (xLSTM / TFLA, seed 003's experiment setup), on :func:`linrnn.mlstm`.

    q, k = x W_q, x W_k   [B, T, H, Dqk],  Dqk·H = D·qk_dim_factor (0.5)
    v    = x W_v          [B, T, H, Dhv],  Dhv·H = D·v_dim_factor (1)
    ĩ, f̃ = cap·tanh((x w_{i,f} + b_{i,f}) / cap)     scalar per head, cap = 15
    h    = mLSTM(q, k, v, ĩ, f̃)  (exponential or sigmoid input gate)
    y    = W_out (σ(x W_o) ⊙ LayerNorm_heads(h))

Initialization as in TFLA's experiments: gate weights 0, input-gate bias −10, forget-gate
biases spaced evenly in [3, 6] over the heads.
"""

from __future__ import annotations

import torch
from torch import nn

from linrnn.layers.common import (
    HeadNorm,
    Mixer,
    check_divisible,
    model_width,
    project,
    softcap,
    split_heads,
    upcast,
)
from linrnn.ops import mlstm


class mLSTMLayer(Mixer):
    """mLSTM layer.

    Args:
        d_model: model width D (fla's name: hidden_size).
        num_heads: H.
        qk_dim_factor, v_dim_factor: query/key and value widths relative to D (0.5 and 1).
        input_gate: ``"exp"`` (stabilized exponential gate) or ``"sigmoid"``.
        normalize: passed to :func:`linrnn.mlstm` (None: its default; exp always normalizes).
        gate_soft_cap: soft-cap of the gate pre-activations (15; None disables it).
        input_gate_bias, forget_gate_bias: initial biases (−10 and the range (3, 6)).
        eps: the op's normalizer epsilon (1e-6); norm_eps: the head norm's.
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache`.
        mode, chunk_size, backend: passed to :func:`linrnn.mlstm`.
    """

    def __init__(
        self,
        d_model: int | None = None,
        num_heads: int = 4,
        *,
        hidden_size: int | None = None,
        qk_dim_factor: float = 0.5,
        v_dim_factor: float = 1.0,
        input_gate: str = "exp",
        normalize: bool | None = None,
        gate_soft_cap: float | None = 15.0,
        input_gate_bias: float = -10.0,
        forget_gate_bias: tuple[float, float] = (3.0, 6.0),
        eps: float = 1e-6,
        norm_eps: float = 1e-6,
        layer_idx: int = 0,
        mode: str | None = None,
        chunk_size: int | None = None,
        backend: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        d_model = model_width("mLSTMLayer", d_model, hidden_size)
        super().__init__()
        if input_gate not in ("exp", "sigmoid"):
            raise ValueError(f"input_gate must be 'exp' or 'sigmoid', got {input_gate!r}")
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.num_heads, self.input_gate = d_model, num_heads, input_gate
        self.qk_dim, self.v_dim = int(d_model * qk_dim_factor), int(d_model * v_dim_factor)
        self.head_qk = check_divisible("qk_dim", self.qk_dim, num_heads)
        self.head_v = check_divisible("v_dim", self.v_dim, num_heads)
        self.normalize, self.eps, self.gate_soft_cap = normalize, eps, gate_soft_cap
        self.input_gate_bias, self.forget_gate_bias = input_gate_bias, forget_gate_bias
        self.layer_idx, self.mode, self.chunk_size, self.backend = (
            layer_idx, mode, chunk_size, backend,
        )  # fmt: skip
        self.q_proj = nn.Linear(d_model, self.qk_dim, bias=False, **kw)
        self.k_proj = nn.Linear(d_model, self.qk_dim, bias=False, **kw)
        self.v_proj = nn.Linear(d_model, self.v_dim, bias=False, **kw)
        self.i_proj = nn.Linear(d_model, num_heads, bias=True, **kw)
        self.f_proj = nn.Linear(d_model, num_heads, bias=True, **kw)
        self.og_proj = nn.Linear(d_model, self.v_dim, bias=False, **kw)
        self.o_proj = nn.Linear(self.v_dim, d_model, bias=False, **kw)
        self.norm = HeadNorm(num_heads, self.head_v, "layer", norm_eps, **kw)
        self.reset_gates()

    @torch.no_grad()
    def reset_gates(self) -> None:
        """Gate weights 0, input bias ``input_gate_bias``, forget biases evenly in the range."""
        nn.init.zeros_(self.i_proj.weight)
        nn.init.zeros_(self.f_proj.weight)
        self.i_proj.bias.fill_(self.input_gate_bias)
        lo, hi = self.forget_gate_bias
        self.f_proj.bias.copy_(torch.linspace(lo, hi, self.num_heads, device="cpu"))

    def mix(self, x, packing, entry, want_state):
        q, k, v, i, f, og = project(
            x, self.q_proj, self.k_proj, self.v_proj, self.i_proj, self.f_proj, self.og_proj
        )
        q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))
        i = softcap(upcast(i), self.gate_soft_cap)
        f = softcap(upcast(f), self.gate_soft_cap)
        h, state = self.call_op(
            mlstm, q, k, v, i, f, input_gate=self.input_gate, normalize=self.normalize,
            eps=self.eps, initial_state=entry.get("state"),
            **self.op_kwargs(x, packing, want_state),
        )  # fmt: skip
        y = self.o_proj(self.norm(h, og, "sigmoid", self.backend))
        return y, {"state": state}

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, input_gate={self.input_gate!r}, qk_dim={self.qk_dim}, "
            f"v_dim={self.v_dim}"
        )
