"""DeltaNet and Gated DeltaNet layers (Yang et al. 2024, 2025; the linear-attention layers of
Qwen3-Next), on :func:`linrnn.delta_rule` and :func:`linrnn.gated_delta_rule`
(docs/DESIGN.md §1b).

    q, k = SiLU(ShortConv(x W_q)), SiLU(ShortConv(x W_k))     [B, T, H, Dk], L2-normalized
    v    = SiLU(ShortConv(x W_v))                              [B, T, HV, Dv]
    β    = σ(x W_b)              (2·σ(x W_b) with allow_neg_eigval: β ∈ [0, 2])   [B, T, HV]
    g    = −exp(A_log) · softplus(x W_a + dt_bias)              (Gated DeltaNet only)
    S_t  = exp(g_t) S_{t−1} + β_t k_t (v_t − (exp(g_t) S_{t−1})ᵀ k_t)ᵀ,   o_t = S_tᵀ q_t / √Dk
    y    = W_o (RMSNorm_head(o_t) ⊙ SiLU(x W_g))    (without the output gate: W_o RMSNorm_head(o_t))

The short convolutions are causal and depthwise (kernel 4): each q/k/v channel sees its last
four inputs. The RMSNorm's weight ``[Dv]`` is shared by the value heads. With grouped value
heads (``num_v_heads`` = HV > H, as in Qwen3-Next) value head j reads q/k head ``j // (HV/H)``.

A decoding cache entry holds the op's state ``[B, HV, Dk, Dv]`` and each convolution's last
inputs (``conv_q``, ``conv_k``, ``conv_v``: ``[B, kernel − 1, width]``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from linrnn.layers.common import (
    Mixer,
    RMSNorm,
    check_divisible,
    model_width,
    project,
    split_heads,
    upcast,
)
from linrnn.layers.conv import ShortConvolution
from linrnn.ops import delta_rule, gated_delta_rule
from linrnn.ops.mamba2 import softplus


class DeltaNet(Mixer):
    """DeltaNet layer: linear attention whose writes replace what their key stored.

    Args:
        d_model: model width D (fla's name: hidden_size).
        num_heads: H, the query/key heads.
        head_dim: Dk, the query/key width per head (default ``D // H``).
        expand_v: the value width per head is ``Dv = Dk·expand_v``.
        num_v_heads: HV, the value heads, a multiple of H (default H); HV > H shares each
            query/key head among ``HV / H`` value heads.
        conv_size: taps of the short convolutions on q, k and v (4).
        conv_bias: give the short convolutions a bias.
        use_gate: the output gate ``SiLU(x W_g)`` after the per-head RMSNorm (Gated DeltaNet and
            Qwen3-Next use it; fla's DeltaNet does not by default).
        allow_neg_eigval: β = 2·σ(·) ∈ [0, 2] instead of σ(·) ∈ [0, 1], so that the transition
            ``I − β k kᵀ`` can have the negative eigenvalue ``1 − β`` (state tracking).
        norm_eps: epsilon of the per-head RMSNorm.
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache`.
        mode, chunk_size, backend: passed to the op.
    """

    def __init__(
        self,
        d_model: int | None = None,
        num_heads: int = 4,
        *,
        hidden_size: int | None = None,
        head_dim: int | None = None,
        expand_v: float = 1.0,
        num_v_heads: int | None = None,
        conv_size: int = 4,
        conv_bias: bool = False,
        use_gate: bool = True,
        allow_neg_eigval: bool = False,
        norm_eps: float = 1e-5,
        layer_idx: int = 0,
        mode: str | None = None,
        chunk_size: int | None = None,
        backend: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        d_model = model_width("DeltaNet", d_model, hidden_size)
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        if head_dim is None:
            head_dim = check_divisible("d_model", d_model, num_heads)
        num_v_heads = num_heads if num_v_heads is None else num_v_heads
        if num_v_heads % num_heads:
            raise ValueError(
                f"num_v_heads={num_v_heads} must be a multiple of num_heads={num_heads}"
            )
        head_v = head_dim * expand_v
        if head_v != int(head_v) or head_v < 1:
            raise ValueError(
                f"head_dim·expand_v must be a positive integer, got {head_dim}·{expand_v}"
            )
        self.d_model, self.num_heads, self.num_v_heads = d_model, num_heads, num_v_heads
        self.head_k, self.head_v = head_dim, int(head_v)
        self.key_dim, self.value_dim = num_heads * head_dim, num_v_heads * self.head_v
        self.use_gate, self.allow_neg_eigval = use_gate, allow_neg_eigval
        self.layer_idx, self.mode, self.chunk_size, self.backend = (
            layer_idx, mode, chunk_size, backend,
        )  # fmt: skip
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False, **kw)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False, **kw)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False, **kw)
        self.b_proj = nn.Linear(d_model, num_v_heads, bias=False, **kw)
        conv = {"kernel_size": conv_size, "activation": "silu", "bias": conv_bias, **kw}
        self.q_conv = ShortConvolution(self.key_dim, **conv)
        self.k_conv = ShortConvolution(self.key_dim, **conv)
        self.v_conv = ShortConvolution(self.value_dim, **conv)
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False, **kw) if use_gate else None
        self.o_norm = RMSNorm(self.head_v, norm_eps, **kw)
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False, **kw)

    def decay(self, x: Tensor) -> Tensor | None:
        """The log decay ``g [B, T, HV]`` (None: no decay)."""
        return None

    def recurrence(self, q, k, v, g, beta, **kwargs):
        return self.call_op(delta_rule, q, k, v, beta, **kwargs)

    def mix(self, x, packing, entry, want_state):
        cu = None if packing is None else packing.cu_seqlens
        conv = dict(cu_seqlens=cu, output_final_state=want_state, backend=self.backend)
        gated = () if self.g_proj is None else (self.g_proj,)
        q, k, v, b, *gate = project(x, self.q_proj, self.k_proj, self.v_proj, self.b_proj, *gated)
        q, conv_q = self.q_conv(q, cache_state=entry.get("conv_q"), **conv)
        k, conv_k = self.k_conv(k, cache_state=entry.get("conv_k"), **conv)
        v, conv_v = self.v_conv(v, cache_state=entry.get("conv_v"), **conv)
        beta = torch.sigmoid(upcast(b))
        if self.allow_neg_eigval:
            beta = 2 * beta
        o, state = self.recurrence(
            split_heads(q, self.num_heads), split_heads(k, self.num_heads),
            split_heads(v, self.num_v_heads), self.decay(x), beta,
            initial_state=entry.get("state"), use_qk_l2norm=True,
            **self.op_kwargs(x, packing, want_state),
        )  # fmt: skip
        gate = split_heads(gate[0], self.num_v_heads) if gate else None
        # [B, T, HV, Dv]: the norm and the gate in fp32, rounded once
        o = self.o_norm(o, gate, None if gate is None else "silu", self.backend)
        y = self.o_proj(o.flatten(-2))
        return y, {"state": state, "conv_q": conv_q, "conv_k": conv_k, "conv_v": conv_v}

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, v_heads={self.num_v_heads}, head_k={self.head_k}, "
            f"head_v={self.head_v}, gate={self.use_gate}, neg_eigval={self.allow_neg_eigval}"
        )


class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet layer: DeltaNet with a data-dependent decay per value head and step,
    ``g = −exp(A_log)·softplus(x W_a + dt_bias)`` (Mamba2's discretization).

    Args:
        d_model, num_heads, head_dim, num_v_heads, conv_size, conv_bias, use_gate,
            allow_neg_eigval, norm_eps, layer_idx, mode, chunk_size, backend: as
            :class:`DeltaNet`.
        expand_v: ``Dv = Dk·expand_v`` (2, as in Gated DeltaNet).
        A_init_range: ``A_log = log A`` with A uniform in this range (0, 16).
        dt_min, dt_max, dt_init_floor: ``dt_bias = softplus⁻¹(dt)`` with dt log-uniform in
            ``[dt_min, dt_max]`` (1e-3, 0.1), floored at dt_init_floor (1e-4).
    """

    def __init__(
        self,
        d_model: int | None = None,
        num_heads: int = 4,
        *,
        expand_v: float = 2.0,
        A_init_range: tuple[float, float] = (0.0, 16.0),
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        device=None,
        dtype=None,
        **kwargs,
    ) -> None:
        super().__init__(d_model, num_heads, expand_v=expand_v, device=device, dtype=dtype,
                         **kwargs)  # fmt: skip
        lo, hi = A_init_range
        if not (0 <= lo < hi) or not (0 < dt_min <= dt_max):
            raise ValueError(
                f"need 0 ≤ A_init_range[0] < A_init_range[1] and 0 < dt_min ≤ dt_max, got "
                f"A_init_range={A_init_range}, dt_min={dt_min}, dt_max={dt_max}"
            )
        self.A_init_range, self.dt_min, self.dt_max = (lo, hi), dt_min, dt_max
        self.dt_init_floor = dt_init_floor
        kw = {"device": device, "dtype": dtype}
        HV = self.num_v_heads
        self.a_proj = nn.Linear(self.d_model, HV, bias=False, **kw)
        self.A_log = nn.Parameter(torch.empty(HV, **kw))
        self.dt_bias = nn.Parameter(torch.empty(HV, **kw))
        self.reset_decay()

    @torch.no_grad()
    def reset_decay(self) -> None:
        """A uniform in A_init_range (A_log = log A); dt log-uniform in [dt_min, dt_max] and
        floored, ``dt_bias = dt + log(−expm1(−dt))`` (softplus(dt_bias) = dt)."""
        lo, hi = self.A_init_range
        A = torch.empty(self.num_v_heads, dtype=torch.float64, device="cpu").uniform_(lo, hi)
        self.A_log.copy_(A.clamp_min(torch.finfo(torch.float32).tiny).log())
        u = torch.rand(self.num_v_heads, dtype=torch.float64, device="cpu")
        dt = torch.exp(u * (math.log(self.dt_max) - math.log(self.dt_min)) + math.log(self.dt_min))
        dt = dt.clamp_min(self.dt_init_floor)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def decay(self, x):
        a = upcast(self.a_proj(x))
        A = torch.exp(self.A_log.to(a.dtype))
        return -A * softplus(a + self.dt_bias.to(a.dtype))  # (exact in fp64 too: mamba2's)

    def recurrence(self, q, k, v, g, beta, **kwargs):
        return self.call_op(gated_delta_rule, q, k, v, g, beta, **kwargs)
