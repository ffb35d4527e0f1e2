"""Causal depthwise short convolution over time (the "short conv" of DeltaNet, Gated DeltaNet,
Mamba and Qwen3-Next's linear attention), with a decoding cache.

Per channel d and step t, with kernel width W and weight ``w [D, 1, W]``::

    y_t[d] = act( Σ_{j<W} w[d, 0, j] · x_{t−(W−1)+j}[d] + bias[d] )

where inputs before the start of a sequence are zeros, or the cached inputs of the previous
call. The cache holds the last W−1 inputs of each sequence, ``[N, W−1, D]`` (rows in time
order, zeros where the sequence had fewer inputs), so a prompt followed by one-token steps gives
what one call over the whole sequence gives. Packed sequences (``cu_seqlens``) never see each
other's inputs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn._runtime import to_device
from linrnn.layers.common import glue_on_triton, sequence_ids

try:  # the Triton convolution
    from linrnn.engine import short_conv as triton_conv
except ImportError:
    triton_conv = None

ACTIVATIONS = ("silu", "swish", None)


class ShortConvolution(nn.Module):
    """Causal depthwise 1-D convolution over T with an optional SiLU.

    Args:
        hidden_size: channels D (each convolved on its own).
        kernel_size: W, the number of taps (the current input and the W−1 before it).
        activation: ``"silu"`` (``"swish"`` is the same) or None.
        bias: add a learned bias per channel before the activation.

    The weight ``[D, 1, W]`` and its initialization are those of ``nn.Conv1d(D, D, W,
    groups=D)``, so depthwise convolution weights of other implementations load unchanged.

    Eager calls without a cache run one Triton kernel (:mod:`linrnn.engine.short_conv`) on a
    GPU with ``backend`` None or "triton" (on CPU tensors with "triton" under the
    interpreter); calls with a cache (decoding), traced calls and fp64 the PyTorch form.
    """

    def __init__(
        self,
        hidden_size: int,
        kernel_size: int = 4,
        activation: str | None = "silu",
        bias: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if kernel_size < 1 or hidden_size < 1:
            raise ValueError(
                f"hidden_size and kernel_size must be ≥ 1, got hidden_size={hidden_size}, "
                f"kernel_size={kernel_size}"
            )
        kw = {"device": device, "dtype": dtype}
        self.hidden_size, self.kernel_size, self.activation = hidden_size, kernel_size, activation
        self.weight = nn.Parameter(torch.empty(hidden_size, 1, kernel_size, **kw))
        self.bias = nn.Parameter(torch.empty(hidden_size, **kw)) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``nn.Conv1d``'s initialization: uniform in ±1/√W for the weight and the bias."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.kernel_size)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(
        self,
        x: Tensor,
        cu_seqlens: Sequence[int] | Tensor | None = None,
        cache_state: Tensor | None = None,
        output_final_state: bool = True,
        backend: str | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``x [B, T, D]`` → ``(y [B, T, D], new cache_state [N, W−1, D] or None)``.

        Args:
            x: the input, or with ``cu_seqlens`` one packed sequence ``[1, N_tokens, D]``.
            cu_seqlens: offsets ``[N + 1]`` of the packed sequences (0 first, N_tokens last;
                empty sequences allowed); the convolution restarts at each offset.
            cache_state: the last W−1 inputs of each sequence ``[N, W−1, D]`` (N = B without
                cu_seqlens) from the previous call; None: zeros (a sequence start).
            output_final_state: return the new cache (the last W−1 inputs of each sequence,
                the cached ones included where a sequence had fewer); False returns None.
            backend: None, "triton" or "torch" (see the class).
        """
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(
                f"x must be [B, T, D] with D = hidden_size = {self.hidden_size}, got shape "
                f"{tuple(x.shape)}"
            )
        cu = _offsets(cu_seqlens, x)
        N = x.shape[0] if cu is None else len(cu) - 1
        W1 = self.kernel_size - 1
        if cache_state is not None:
            if tuple(cache_state.shape) != (N, W1, self.hidden_size):
                raise ValueError(
                    f"cache_state must have shape [N, W-1, D] = {(N, W1, self.hidden_size)}, "
                    f"got {tuple(cache_state.shape)}"
                )
            cache_state = cache_state.to(x.dtype)
        if cache_state is None and self._fused(x, backend):
            sid = sequence_ids(cu, x.device)
            y = triton_conv.short_conv(x, self.weight, self.bias, sid, self.activation is not None)
            new = None
            if output_final_state:
                new = self._dense_cache(x) if cu is None else self._packed_cache(x, cu)
            return y, new
        if cu is None:
            y, new = self._dense(x, cache_state)
        else:
            y, new = self._packed(x, cu, cache_state, output_final_state)
        y = F.silu(y) if self.activation is not None else y
        return y, (new if output_final_state else None)

    def _fused(self, x: Tensor, backend: str | None) -> bool:
        """Whether a call without a cache runs the Triton kernel (see the class)."""
        if triton_conv is None or x.shape[1] == 0 or self.kernel_size > triton_conv.MAX_TAPS:
            return False
        return glue_on_triton(backend, x)

    def _conv(self, xp: Tensor) -> Tensor:
        """Valid convolution of ``xp [B, T + W − 1, D]`` (left context included) → ``[B, T, D]``
        before the activation."""
        if xp.shape[1] < self.kernel_size:  # no tokens
            return xp[:, :0]
        w = self.weight.to(xp.dtype)
        b = None if self.bias is None else self.bias.to(xp.dtype)
        return F.conv1d(xp.transpose(1, 2), w, b, groups=self.hidden_size).transpose(1, 2)

    def _dense(self, x: Tensor, cache_state: Tensor | None) -> tuple[Tensor, Tensor]:
        W1 = self.kernel_size - 1
        if cache_state is None:
            xp = F.pad(x, (0, 0, W1, 0))
        else:
            xp = torch.cat([cache_state, x], dim=1)
        return self._conv(xp), xp[:, xp.shape[1] - W1 :]

    def _dense_cache(self, x: Tensor) -> Tensor:
        """The new cache of unpacked rows that started from zeros: their last W−1 inputs,
        zeros before the start (only those rows are copied)."""
        W1, T = self.kernel_size - 1, x.shape[1]
        return F.pad(x[:, max(T - W1, 0) :], (0, 0, max(W1 - T, 0), 0))

    def _packed_cache(self, x: Tensor, cu: list[int]) -> Tensor:
        """The new cache of packed sequences that started from zeros: each sequence's last
        W−1 inputs, zeros before its start."""
        W1, N = self.kernel_size - 1, len(cu) - 1
        if W1 == 0:
            return x.new_zeros(N, 0, x.shape[-1])
        xp = F.pad(x[0], (0, 0, W1, 0))  # rows 0 … W1−1 zeros, token j at row W1 + j
        # cache row i of sequence n: its input at position p = length − W1 + i (row 0 if p < 0)
        rows = [[cu[n + 1] + i if cu[n + 1] - cu[n] - W1 + i >= 0 else 0 for i in range(W1)]
                for n in range(N)]  # fmt: skip
        return xp[to_device(rows, x.device)]

    def _packed(self, x, cu, cache_state, want_cache):
        """One packed sequence: the convolution of the whole row is right everywhere except at
        the first W−1 tokens of each sequence, which read across the offset; those (at most
        N·(W−1) tokens) are recomputed from their own windows, gathered from the sequence's
        tokens and its cache."""
        if x.shape[0] != 1:
            raise ValueError(
                f"with cu_seqlens x must be one packed sequence [1, N, D], got {tuple(x.shape)}"
            )
        W, W1, N = self.kernel_size, self.kernel_size - 1, len(cu) - 1
        y = self._conv(F.pad(x, (0, 0, W1, 0)))
        if W1 == 0:
            return y, x.new_zeros(N, 0, x.shape[-1])
        if cache_state is None:
            cache_state = x.new_zeros(N, W1, x.shape[-1])
        # Row u of a sequence's extended input [cache (W−1 rows), tokens]: cache row n·(W−1)+u
        # for u < W−1, else token start + u − (W−1), at offset N·(W−1) in `ext`.
        ext = torch.cat([cache_state.reshape(N * W1, -1), x[0]], dim=0)

        def row(n: int, u: int) -> int:
            return n * W1 + u if u < W1 else N * W1 + cu[n] + u - W1

        heads = [(n, p) for n in range(N) for p in range(min(cu[n + 1] - cu[n], W1))]
        if heads:
            index = torch.tensor(
                [[row(n, p + j) for j in range(W)] for n, p in heads], device=x.device
            )
            windows = ext[index]  # [F, W, D]: the window of each recomputed token
            w = self.weight.to(x.dtype)[:, 0].t()  # [W, D]
            fixed = (windows * w).sum(1)
            if self.bias is not None:
                fixed = fixed + self.bias.to(x.dtype)
            where = torch.tensor([cu[n] + p for n, p in heads], device=x.device)
            y = y.index_copy(1, where, fixed[None])
        new = None
        if want_cache:
            length = [cu[n + 1] - cu[n] for n in range(N)]
            index = torch.tensor(
                [[row(n, length[n] + i) for i in range(W1)] for n in range(N)], device=x.device
            )
            new = ext[index]  # [N, W−1, D]
        return y, new

    def extra_repr(self) -> str:
        bias = ", bias=True" if self.bias is not None else ""
        return (
            f"{self.hidden_size}, kernel_size={self.kernel_size}, "
            f"activation={self.activation!r}{bias}"
        )


def _offsets(cu_seqlens, x: Tensor) -> list[int] | None:
    if cu_seqlens is None:
        return None
    cu = [int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else cu_seqlens)]
    ordered = all(a <= b for a, b in itertools.pairwise(cu))
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != x.shape[1] or not ordered:
        raise ValueError(
            f"cu_seqlens must be non-decreasing offsets from 0 to the packed length "
            f"{x.shape[1]}, got {cu}"
        )
    return cu
