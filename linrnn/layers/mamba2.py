"""The Mamba2 block (Dao & Gu 2024, mamba_ssm's ``Mamba2``) on :func:`linrnn.mamba2`
(docs/DESIGN.md §11).

    z, xBC, dt = x W_in                      z, x [B, T, H·P]; B, C [B, T, G·N]; dt [B, T, H]
    x, B, C    = SiLU(ShortConv(xBC))        one causal depthwise convolution over x, B and C
    y          = SSD(x, dt, A, B, C, D, dt_bias, dt_softplus=True)      A = −exp(A_log)
    out        = W_out RMSNorm_group(y ⊙ SiLU(z))

The gated RMSNorm normalizes ``y·SiLU(z)`` over each of the G groups of ``H·P / G`` channels
(mamba_ssm's ``RMSNormGated`` with ``norm_before_gate=False``, ``group_size = d_inner / G``).
Parameter names, shapes and the in-projection's output order follow mamba_ssm, so its weights
load with the same names. A decoding cache entry holds the SSD state ``[B, H, N, P]`` and the
convolution's last inputs (``conv``: ``[B, conv_size − 1, H·P + 2·G·N]``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from linrnn import _validation
from linrnn.layers.common import Mixer, check_divisible, norm_gate, upcast
from linrnn.layers.conv import ShortConvolution
from linrnn.ops import mamba2


class GatedRMSNorm(nn.Module):
    """``RMSNorm(y·SiLU(z))·weight`` over each of ``groups`` equal groups of the channels, in
    fp32 (fp64 for fp64 inputs), rounded once to y's dtype (:func:`norm_gate`)."""

    def __init__(self, dim: int, groups: int = 1, eps: float = 1e-5, device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, y: Tensor, z: Tensor, backend: str | None = None) -> Tensor:
        groups = (self.groups, -1)
        h = norm_gate(y.unflatten(-1, groups), self.weight, None, z.unflatten(-1, groups),
                      act="silu", gate_first=True, eps=self.eps, backend=backend)  # fmt: skip
        return h.flatten(-2)


class Mamba2(Mixer):
    """Mamba2 layer: the SSD recurrence with its input-dependent step size Δ.

    Args:
        d_model: model width D.
        num_heads: H, the SSD heads (mamba_ssm: ``nheads = d_inner / headdim``).
        expand: ``d_inner = expand·D`` (2); the head width is ``P = d_inner / H``.
        state_size: N, the state's width per head (mamba_ssm's ``d_state``, 128).
        n_groups: G, the B/C groups (1), each shared by ``H / G`` heads.
        conv_size: taps of the short convolution (4).
        conv_bias: give the short convolution a bias (True, as mamba_ssm).
        A_init_range: ``A_log = log A`` with A uniform in this range ((1, 16)).
        dt_min, dt_max, dt_init_floor: ``dt_bias = softplus⁻¹(dt)`` with dt log-uniform in
            ``[dt_min, dt_max]`` (1e-3, 0.1), floored at dt_init_floor (1e-4).
        norm_eps: epsilon of the gated RMSNorm.
        D_has_hdim: a skip weight per channel (D of ``d_inner`` entries, used as ``[H, P]``)
            instead of one per head (mamba_ssm's option of that name; False).
        layer_idx: this layer's key in a :class:`~linrnn.layers.Cache`.
        mode, chunk_size, backend: passed to the op.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int = 4,
        *,
        expand: int = 2,
        state_size: int = 128,
        n_groups: int = 1,
        conv_size: int = 4,
        conv_bias: bool = True,
        A_init_range: tuple[float, float] = (1.0, 16.0),
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        norm_eps: float = 1e-5,
        D_has_hdim: bool = False,
        layer_idx: int = 0,
        mode: str | None = None,
        chunk_size: int | None = None,
        backend: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        d_inner = expand * d_model
        if expand < 1 or d_inner != int(d_inner):
            raise ValueError(f"expand must be a positive integer, got {expand}")
        self.head_dim = check_divisible("d_inner = expand·d_model", int(d_inner), num_heads)
        if num_heads % n_groups:
            raise ValueError(f"num_heads={num_heads} must be a multiple of n_groups={n_groups}")
        lo, hi = A_init_range
        if not (0 < lo <= hi) or not (0 < dt_min <= dt_max):
            raise ValueError(
                f"need 0 < A_init_range[0] ≤ A_init_range[1] and 0 < dt_min ≤ dt_max, got "
                f"A_init_range={A_init_range}, dt_min={dt_min}, dt_max={dt_max}"
            )
        self.d_model, self.num_heads, self.d_inner = d_model, num_heads, int(d_inner)
        self.state_size, self.n_groups = state_size, n_groups
        self.A_init_range, self.dt_min, self.dt_max = (lo, hi), dt_min, dt_max
        self.dt_init_floor, self.norm_eps = dt_init_floor, norm_eps
        self.layer_idx, self.mode, self.chunk_size, self.backend = (
            layer_idx, mode, chunk_size, backend,
        )  # fmt: skip
        self.conv_dim = self.d_inner + 2 * n_groups * state_size
        self.in_proj = nn.Linear(d_model, self.d_inner + self.conv_dim + num_heads, bias=False,
                                 **kw)  # fmt: skip
        self.conv1d = ShortConvolution(self.conv_dim, conv_size, "silu", conv_bias, **kw)
        self.A_log = nn.Parameter(torch.empty(num_heads, **kw))
        self.dt_bias = nn.Parameter(torch.empty(num_heads, **kw))
        self.D_has_hdim = _validation.flag("D_has_hdim", D_has_hdim)
        self.D = nn.Parameter(torch.empty(self.d_inner if self.D_has_hdim else num_heads, **kw))
        self.norm = GatedRMSNorm(self.d_inner, n_groups, norm_eps, **kw)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False, **kw)
        self.reset_ssm()

    @torch.no_grad()
    def reset_ssm(self) -> None:
        """mamba_ssm's initialization: A uniform in A_init_range (A_log = log A); dt
        log-uniform in [dt_min, dt_max] and floored, ``dt_bias = dt + log(−expm1(−dt))``
        (softplus(dt_bias) = dt); D = 1."""
        lo, hi = self.A_init_range
        H = self.num_heads
        self.A_log.copy_(torch.empty(H, dtype=torch.float64, device="cpu").uniform_(lo, hi).log())
        u = torch.rand(H, dtype=torch.float64, device="cpu")  # CPU: the model may be on meta
        dt = torch.exp(u * (math.log(self.dt_max) - math.log(self.dt_min)) + math.log(self.dt_min))
        dt = dt.clamp_min(self.dt_init_floor)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.D.fill_(1.0)

    def mix(self, x, packing, entry, want_state):
        cu = None if packing is None else packing.cu_seqlens
        H, P, G, N = self.num_heads, self.head_dim, self.n_groups, self.state_size
        z, xBC, dt = self.in_proj(x).split([self.d_inner, self.conv_dim, H], dim=-1)
        xBC, conv = self.conv1d(xBC, cu, entry.get("conv"), want_state, backend=self.backend)
        xs, B, C = xBC.split([self.d_inner, G * N, G * N], dim=-1)
        A = -torch.exp(upcast(self.A_log))  # fp32 for 16-bit parameters, fp64 kept
        y, state = self.call_op(
            mamba2, xs.unflatten(-1, (H, P)), dt, A, B.unflatten(-1, (G, N)),
            C.unflatten(-1, (G, N)), D=self.D.view(H, P) if self.D_has_hdim else self.D,
            dt_bias=self.dt_bias, dt_softplus=True,
            initial_state=entry.get("state"), **self.op_kwargs(x, packing, want_state),
        )  # fmt: skip
        y = self.norm(y.flatten(-2), z, self.backend)
        return self.out_proj(y), {"state": state, "conv": conv}

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, head_dim={self.head_dim}, state_size={self.state_size}, "
            f"groups={self.n_groups}, d_inner={self.d_inner}"
        )
