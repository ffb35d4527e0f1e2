"""What every layer shares: the decoding cache, padding masks turned into packed sequences
(``cu_seqlens``), the token shift, per-head norms, soft-capping and the op call.

Padding. An ``attention_mask [B, T]`` (1 = token, 0 = padding, left or right padding or any
holes) is handled by packing: the valid tokens of all rows are concatenated into one sequence
``[1, N, D]`` with offsets ``cu_seqlens`` (row b is sequence b, possibly empty), the layer runs
on that, and the output is scattered back to ``[B, T, D]`` with zeros at the padding. Row b's
recurrent state is therefore exactly the state after its own valid tokens.

Packed documents. ``cu_seqlens`` (offsets ``[N + 1]``, a list or a 1-D integer tensor) marks
``x [1, T, D]`` as N documents laid end to end: every state of the layer (the op's, the short
convolutions', the token shift, softmax attention's keys and positions) restarts at each offset,
so the output equals N separate calls (docs/DESIGN.md §1).

Decoding. A :class:`Cache` holds one entry per layer (keyed by ``layer_idx``): the op's final
state, for RWKV6 the last token for the shift, for the delta-rule layers the short
convolutions' last inputs (softmax attention keeps keys and values).
A layer called with a cache starts from the entry and replaces it, so a prompt followed by
one-token steps gives what one call over the whole sequence gives.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn import _validation
from linrnn._runtime import to_device, tracing
from linrnn.layers.projection import project
from linrnn.ops._generic import OUT_STATE

try:  # the fused output norm and gate
    from linrnn.engine import norm_gate as triton_norm_gate
except ImportError:
    triton_norm_gate = None

GATE_ACTS = {"silu": F.silu, "sigmoid": torch.sigmoid}


class Cache:
    """Decoding cache of a stack of layers: ``cache[layer_idx]`` is a dict of that layer's
    tensors (empty until the layer has run once; other parts of a model with a state use other
    keys, e.g. ``("mlp", layer_idx)``). ``seen_tokens`` counts the time steps seen."""

    def __init__(self) -> None:
        self.layers: dict[int | tuple, dict] = {}
        self.seen_tokens = 0

    def __getitem__(self, layer_idx: int | tuple) -> dict:
        return self.layers.get(layer_idx, {})

    def __contains__(self, layer_idx: int | tuple) -> bool:
        return layer_idx in self.layers

    def __len__(self) -> int:
        return len(self.layers)

    def update(self, layer_idx: int | tuple, entry: dict) -> None:
        self.layers[layer_idx] = entry

    def __repr__(self) -> str:
        parts = {i: sorted(e) for i, e in sorted(self.layers.items(), key=lambda kv: str(kv[0]))}
        return f"Cache(seen_tokens={self.seen_tokens}, layers={parts})"


@dataclass
class Packing:
    """The valid tokens of a padded batch as one packed sequence, or (:meth:`from_offsets`,
    ``index`` None) an input that is already packed: ``[1, T, D]`` with its documents' offsets,
    which :meth:`pack` and :meth:`unpack` leave as it is."""

    index: Tensor | None  # [N] flat indices (b·T + t) of the valid tokens, row by row
    cu_seqlens: list[int]  # [B + 1] offsets of the rows in the packed sequence
    B: int  # number of sequences (rows of a padded batch, or packed documents)
    T: int
    mask: Tensor | None  # [B, T] bool, True at the valid tokens (None when already packed)

    @classmethod
    def from_offsets(cls, cu_seqlens, x: Tensor) -> Packing:
        """An already packed ``x [1, T, ...]`` holding the documents ``cu_seqlens``
        (validated: integers from 0 to T, non-decreasing)."""
        cu = _validation.cu_seqlens(cu_seqlens, x.shape[0], x.shape[1], x)
        return cls(None, cu, len(cu) - 1, x.shape[1], None)

    @property
    def packed(self) -> bool:
        """True for an input that came packed (documents), False for a padded batch."""
        return self.index is None

    def document_positions(self, device) -> tuple[Tensor, Tensor]:
        """``(document [T], position [T])`` of every token of a packed row: which document it
        belongs to and its position inside it."""
        lengths = torch.tensor(
            [self.cu_seqlens[n + 1] - self.cu_seqlens[n] for n in range(self.B)], device=device
        )
        doc = torch.repeat_interleave(torch.arange(self.B, device=device), lengths)
        starts = torch.tensor(self.cu_seqlens[:-1], device=device)
        pos = torch.arange(int(lengths.sum()), device=device) - starts[doc]
        return doc, pos

    @classmethod
    def from_mask(cls, attention_mask: Tensor, B: int, T: int) -> Packing | None:
        """None when the mask is all ones (nothing to pack)."""
        if attention_mask.shape != (B, T):
            raise ValueError(
                f"attention_mask must have shape [B, T] = {(B, T)}, got "
                f"{tuple(attention_mask.shape)}"
            )
        valid = attention_mask.bool()
        lengths = valid.sum(1).tolist()  # one host read
        if sum(lengths) == B * T:
            return None
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        return cls(valid.flatten().nonzero().squeeze(1), cu, B, T, valid)

    def pack(self, x: Tensor) -> Tensor:
        """``[B, T, ...]`` → ``[1, N, ...]``."""
        if self.index is None:
            return x
        return x.flatten(0, 1).index_select(0, self.index).unsqueeze(0)

    def unpack(self, y: Tensor) -> Tensor:
        """``[1, N, ...]`` → ``[B, T, ...]`` with zeros at the padding."""
        if self.index is None:
            return y
        out = y.new_zeros(self.B * self.T, *y.shape[2:])
        return out.index_copy(0, self.index, y[0]).view(self.B, self.T, *y.shape[2:])

    def last(self, x: Tensor, previous: Tensor | None) -> Tensor:
        """Each row's last valid token of a packed ``x [1, N, D]`` (``previous [B, D]``, or
        zeros, for a row without tokens) → ``[B, D]``."""
        rows = [b for b in range(self.B) if self.cu_seqlens[b + 1] > self.cu_seqlens[b]]
        out = previous if previous is not None else x.new_zeros(self.B, x.shape[-1])
        if not rows:
            return out
        ends = torch.tensor([self.cu_seqlens[b + 1] - 1 for b in rows], device=x.device)
        return out.to(x.dtype).index_copy(
            0, torch.tensor(rows, device=x.device), x[0].index_select(0, ends)
        )


def as_packing(attention_mask, x: Tensor, cu_seqlens=None) -> Packing | None:
    """Accept a ``[B, T]`` mask, an already built :class:`Packing` (a model builds it once for
    all its layers) or None; or the offsets ``cu_seqlens`` of an already packed ``x``."""
    if cu_seqlens is not None:
        if attention_mask is not None:
            raise ValueError(
                "pass either attention_mask (a padded batch) or cu_seqlens (packed documents), "
                "not both"
            )
        return Packing.from_offsets(cu_seqlens, x)
    if attention_mask is None or isinstance(attention_mask, Packing):
        return attention_mask
    return Packing.from_mask(attention_mask.to(x.device), x.shape[0], x.shape[1])


def model_width(cls_name: str, d_model: int | None, hidden_size: int | None) -> int:
    """The layer width from ``d_model`` or its fla name ``hidden_size`` (one of the two)."""
    if d_model is None and hidden_size is None:
        raise TypeError(f"{cls_name}() needs the width d_model (or fla's name hidden_size)")
    if d_model is not None and hidden_size is not None and d_model != hidden_size:
        raise TypeError(
            f"{cls_name}() got d_model={d_model} and hidden_size={hidden_size}: they name the "
            "same width; pass one"
        )
    return d_model if d_model is not None else hidden_size


def alias(cls_name: str, name: str, value, fla_name: str, fla_value, default):
    """An argument that fla spells ``fla_name``: whichever was given, or ``default``."""
    if value is not None and fla_value is not None and value != fla_value:
        raise TypeError(
            f"{cls_name}() got {name}={value!r} and {fla_name}={fla_value!r}: they name the "
            "same thing; pass one"
        )
    if value is not None:
        return value
    return default if fla_value is None else fla_value


def token_shift(x: Tensor, cu_seqlens: list[int] | None, previous: Tensor | None) -> Tensor:
    """``x_{t-1}`` for every t (RWKV's time shift): ``x [B, T, D]``; at the start of a sequence
    the previous token is ``previous [N, D]`` (the cache) or zero. With ``cu_seqlens`` x is one
    packed sequence ``[1, N_tokens, D]`` and the shift restarts at every offset."""
    shifted = F.pad(x, (0, 0, 1, -1))
    if cu_seqlens is None:
        if previous is not None:
            shifted = torch.cat([previous.to(x.dtype)[:, None], shifted[:, 1:]], dim=1)
        return shifted
    rows = [n for n in range(len(cu_seqlens) - 1) if cu_seqlens[n + 1] > cu_seqlens[n]]
    if previous is None or not rows:
        starts = [cu_seqlens[n] for n in rows]
        if starts and starts != [0]:  # zero the first token of every later sequence
            keep = torch.ones(x.shape[1], 1, dtype=x.dtype, device=x.device)
            keep[starts] = 0
            shifted = shifted * keep
        return shifted
    starts = torch.tensor([cu_seqlens[n] for n in rows], device=x.device)
    first = previous.to(x.dtype).index_select(0, torch.tensor(rows, device=x.device))
    return shifted.index_copy(1, starts, first[None])


def softcap(x: Tensor, cap: float | None) -> Tensor:
    """``cap · tanh(x / cap)`` (Gemma 2 / xLSTM soft-capping); identity for None."""
    return x if cap is None else cap * torch.tanh(x / cap)


def norm_gate(x: Tensor, weight: Tensor, bias: Tensor | None = None, gate: Tensor | None = None,
              *, layer: bool = False, act: str | None = None, gate_first: bool = False,
              eps: float = 1e-6, backend: str | None = None) -> Tensor:  # fmt: skip
    """The norm and output gate of a layer over rows ``x [..., S, D]`` (S heads or groups of
    D channels): each row normalized (RMSNorm; LayerNorm with ``layer``), times ``weight``
    (``[S·D]``, a weight per channel of every row, or ``[D]``, shared) plus ``bias``, times
    ``act(gate)`` (``act`` "silu" or "sigmoid", ``gate`` shaped as x). With ``gate_first``
    the row normalized is ``x·act(gate)`` instead (Mamba2's gated RMSNorm). Computed in fp32
    (fp64 for fp64 inputs) and rounded once, to x's dtype.

    One Triton pass each way (:mod:`linrnn.engine.norm_gate`) for eager calls on a GPU with
    ``backend`` None or "triton" (and on CPU tensors with "triton" under the interpreter); the
    PyTorch form otherwise, and while ``torch.compile`` traces, where inductor fuses it."""
    if act not in (None, *GATE_ACTS):
        raise ValueError(f"act must be None, 'silu' or 'sigmoid', got {act!r}")
    if (gate is None) != (act is None):
        raise ValueError("norm_gate: give both gate and act, or neither")
    if _fused(x, gate, backend):
        return triton_norm_gate.norm_gate(x, gate, weight, bias, layer=layer, act=act,
                                          gate_first=gate_first, eps=eps)  # fmt: skip
    h = upcast(x)
    a = GATE_ACTS[act](upcast(gate)) if gate is not None else None
    if gate_first and a is not None:
        h = h * a
    if layer:
        h = h - h.mean(-1, keepdim=True)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    y = y * weight.view(-1, x.shape[-1]).to(y.dtype)
    if bias is not None:
        y = y + bias.view(-1, x.shape[-1]).to(y.dtype)
    if a is not None and not gate_first:
        y = y * a
    return y.to(x.dtype)


def add_norm(x: Tensor, branch: Tensor | None, weight: Tensor, bias: Tensor | None = None, *,
             layer: bool = False, eps: float = 1e-6,
             backend: str | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """A pre-norm block's residual add and norm: ``(r, h)`` with the stream ``r = x + branch``
    in x's dtype (``branch`` None: r is x) and ``h`` its :func:`norm_gate` over the last
    dimension (no gate) in the dtype the products reading it compute in
    (:func:`compute_dtype_for`: autocast's, else x's), so no cast follows. The same values as
    the add, the norm and autocast's cast one after the other; on Triton (:func:`norm_gate`'s
    rule) one pass each way, whose backward also adds r's own gradient and writes the
    branch's in its dtype."""
    dtype = compute_dtype_for(x)
    if branch is None or branch.shape == x.shape:
        if _fused(x, branch, backend):
            r, h = triton_norm_gate.add_norm(
                x.unsqueeze(-2), None if branch is None else branch.unsqueeze(-2), weight, bias,
                layer=layer, eps=eps, dtype=dtype,
            )  # fmt: skip
            return (x if branch is None else r.squeeze(-2)), h.squeeze(-2)
    r = x if branch is None else x + branch
    h = norm_gate(r.unsqueeze(-2), weight, bias, layer=layer, eps=eps, backend=backend)
    return r, h.squeeze(-2).to(dtype)


def _fused(x: Tensor, gate: Tensor | None, backend: str | None) -> bool:
    """Whether :func:`norm_gate` runs the Triton kernels (see there)."""
    if triton_norm_gate is None or x.shape[-1] > triton_norm_gate.MAX_D or x.numel() == 0:
        return False
    return glue_on_triton(backend, x, *([] if gate is None else [gate]))


def sequence_ids(cu_seqlens: list[int] | None, device) -> Tensor | None:
    """The int32 index of the sequence each packed token belongs to (None without packing):
    how the glue kernels keep packed sequences apart."""
    if cu_seqlens is None:
        return None
    cu = list(cu_seqlens)
    lens = to_device([b - a for a, b in itertools.pairwise(cu)], device)
    ids = torch.arange(len(cu) - 1, device=device, dtype=torch.int32)
    return torch.repeat_interleave(ids, lens, output_size=cu[-1])


def compute_dtype_for(x: Tensor) -> torch.dtype:
    """The dtype a projection of x computes in: autocast's where it is on, else x's."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def glue_on_triton(backend: str | None, *tensors: Tensor) -> bool:
    """Whether a layer's glue kernel (norm and gate, short convolution) serves an eager call
    on ``tensors`` (fp16, bf16 or fp32): on CUDA with ``backend`` None or "triton", on CPU
    with "triton" under the Triton interpreter; never while ``torch.compile`` traces."""
    if backend == "torch" or tracing():
        return False
    if any(t.dtype not in (torch.float16, torch.bfloat16, torch.float32) for t in tensors):
        return False
    if tensors[0].is_cuda:
        return True
    return backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1"


class RMSNorm(nn.Module):
    """``x / rms(x) · weight`` over the last dimension, computed in fp32; ``forward(x, gate,
    act)`` also multiplies by ``act(gate)`` before rounding (:func:`norm_gate`). ``backend``:
    :func:`norm_gate`'s, for calls that give none."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None,
                 backend: str | None = None) -> None:  # fmt: skip
        super().__init__()
        self.eps, self.backend = eps, backend
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor, gate: Tensor | None = None, act: str | None = None,
                backend: str | None = None) -> Tensor:  # fmt: skip
        return norm_gate(x.unsqueeze(-2), self.weight, None,
                         None if gate is None else gate.unsqueeze(-2), act=act, eps=self.eps,
                         backend=backend or self.backend).squeeze(-2)  # fmt: skip

    def add(self, x: Tensor, branch: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(x + branch, its norm)``, a block's residual add and pre-norm (:func:`add_norm`)."""
        return add_norm(x, branch, self.weight, eps=self.eps, backend=self.backend)


class LayerNorm(nn.Module):
    """``(x − mean(x)) / std(x) · weight + bias`` over the last dimension, computed in fp32
    (RWKV's block norms); ``backend`` as :func:`norm_gate`'s."""

    def __init__(self, dim: int, eps: float = 1e-5, device=None, dtype=None,
                 backend: str | None = None) -> None:  # fmt: skip
        super().__init__()
        self.eps, self.backend = eps, backend
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return norm_gate(x.unsqueeze(-2), self.weight, self.bias, layer=True, eps=self.eps,
                         backend=self.backend).squeeze(-2)  # fmt: skip

    def add(self, x: Tensor, branch: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(x + branch, its norm)``, a block's residual add and pre-norm (:func:`add_norm`)."""
        return add_norm(x, branch, self.weight, self.bias, layer=True, eps=self.eps,
                        backend=self.backend)  # fmt: skip


class HeadNorm(nn.Module):
    """Normalization of each head on its own (``kind="rms"``: RMSNorm, ``"layer"``: LayerNorm,
    i.e. GroupNorm with one group per head), with a weight (and for "layer" a bias) per channel
    of all heads: ``[B, T, H, Dh]`` → ``[B, T, H·Dh]``; ``forward(x, gate, act)`` multiplies
    by ``act(gate)`` (gate ``[B, T, H·Dh]``) before the one rounding (:func:`norm_gate`)."""

    def __init__(
        self, num_heads: int, head_dim: int, kind: str = "rms", eps: float = 1e-6,
        device=None, dtype=None,
    ) -> None:  # fmt: skip
        super().__init__()
        if kind not in ("rms", "layer"):
            raise ValueError(f"kind must be 'rms' or 'layer', got {kind!r}")
        self.kind, self.eps, self.num_heads, self.head_dim = kind, eps, num_heads, head_dim
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(num_heads * head_dim, **kw))
        self.bias = None
        if kind == "layer":
            self.bias = nn.Parameter(torch.zeros(num_heads * head_dim, **kw))

    def forward(self, x: Tensor, gate: Tensor | None = None, act: str | None = None,
                backend: str | None = None) -> Tensor:  # fmt: skip
        if gate is not None:
            gate = gate.unflatten(-1, (self.num_heads, self.head_dim))
        y = norm_gate(x, self.weight, self.bias, gate, layer=self.kind == "layer", act=act,
                      eps=self.eps, backend=backend)  # fmt: skip
        return y.flatten(-2)


class Mixer(nn.Module):
    """Base of the token mixers: padding, the cache and the op call; a subclass implements
    :meth:`mix` on an unpadded (or packed) input.

    Attributes set by every subclass: ``layer_idx`` (its key in the :class:`Cache`), ``mode``,
    ``chunk_size``, ``backend`` (passed to the op; ``mode=None``, the default, is the op's own
    choice: the recurrent kernel for short calls without gradients, ``fused_chunk`` where it
    measured faster, else ``chunk``; with None or ``"chunk"`` a single-token call uses
    ``"recurrent"``, the cheapest form for decoding, with or without a gradient)."""

    layer_idx: int = 0
    mode: str | None = None
    chunk_size: int | None = None
    backend: str | None = None

    def forward(
        self, x: Tensor, attention_mask=None, cache: Cache | None = None, cu_seqlens=None
    ) -> Tensor:
        """``x [B, T, D]`` → ``[B, T, D]``.

        Args:
            x: the input sequence.
            attention_mask: optional ``[B, T]`` (1 = token, 0 = padding); outputs at padding
                positions are zero and padding never reaches the state.
            cache: optional :class:`Cache`; the layer starts from its entry (if any) and stores
                its new state there (one state per sequence: per row, or per document with
                cu_seqlens).
            cu_seqlens: optional offsets ``[N + 1]`` of N documents packed in ``x [1, T, D]``;
                every state restarts at each offset (the output equals N separate calls).
        """
        if x.dim() != 3:
            raise ValueError(f"x must be [B, T, D], got shape {tuple(x.shape)}")
        packing = as_packing(attention_mask, x, cu_seqlens)
        if packing is not None and packing.cu_seqlens[-1] == 0:
            # Only padding: no token to mix, zeros out (never x·0: padding may hold NaN), and a
            # cache entry stays as it was (nothing was consumed), as for a row of padding in a
            # batch with tokens.
            return torch.where(torch.zeros_like(x, dtype=torch.bool), x, 0.0)
        entry = cache[self.layer_idx] if cache is not None else {}
        target = None
        if getattr(cache, "inplace_state", False) and "state" in entry and not tracing():
            # A static cache (linrnn.graphs): the Triton decode kernel may write the new state
            # straight over the old one (the cache then skips its copy).
            state = entry["state"]
            target = OUT_STATE.set(list(state) if isinstance(state, (tuple, list)) else [state])
        try:
            if packing is not None:
                y, new = self.mix(packing.pack(x), packing, entry, cache is not None)
                y = packing.unpack(y)
            else:
                y, new = self.mix(x, None, entry, cache is not None)
        finally:
            if target is not None:
                OUT_STATE.reset(target)
        if cache is not None:
            cache.update(self.layer_idx, new)
        return y

    def mix(self, x: Tensor, packing: Packing | None, entry: dict, want_state: bool):
        """Return ``(y, new cache entry)``; x is ``[B, T, D]``, or ``[1, N, D]`` packed."""
        raise NotImplementedError

    def op_kwargs(self, x: Tensor, packing: Packing | None, want_state: bool) -> dict:
        mode = self.mode
        if mode in (None, "chunk") and x.shape[1] == 1:
            mode = "recurrent"
        return {
            "mode": mode,
            "chunk_size": self.chunk_size if mode in (None, "chunk") else None,
            "cu_seqlens": None if packing is None else packing.cu_seqlens,
            "output_final_state": want_state,
        }

    def call_op(self, op, *args, **kwargs):
        """Call ``op`` with this layer's backend. With ``backend=None`` a CUDA call goes to
        Triton where a kernel serves the case, and to the PyTorch path otherwise."""
        return op(*args, backend=self.backend, **kwargs)


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``[B, T, H·Dh]`` → ``[B, T, H, Dh]``."""
    return x.unflatten(-1, (num_heads, x.shape[-1] // num_heads))


def check_divisible(name: str, dim: int, num_heads: int) -> int:
    if dim % num_heads:
        raise ValueError(f"{name}={dim} must be divisible by num_heads={num_heads}")
    return dim // num_heads


class GatedHeadsMixer(Mixer):
    """The layer shape GLA, simple GLA and retention share (GLA paper §4.4): projections
    ``q, k [B,T,H,Dk]`` (``D·expand_k``), ``v [B,T,H,Dv]`` (``D·expand_v``), the recurrence
    (:meth:`recurrence`, with the decays from :meth:`decays`), a per-head RMSNorm, a swish output
    gate ``swish(x W_g)`` and the output projection."""

    def __init__(
        self, d_model, num_heads, expand_k, expand_v, norm_eps, layer_idx, mode, chunk_size,
        backend, device, dtype,
    ) -> None:  # fmt: skip
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.num_heads = d_model, num_heads
        self.key_dim, self.value_dim = int(d_model * expand_k), int(d_model * expand_v)
        self.head_k = check_divisible("key_dim", self.key_dim, num_heads)
        self.head_v = check_divisible("value_dim", self.value_dim, num_heads)
        self.layer_idx, self.mode, self.chunk_size, self.backend = (
            layer_idx, mode, chunk_size, backend,
        )  # fmt: skip
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False, **kw)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False, **kw)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False, **kw)
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False, **kw)
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False, **kw)
        self.norm = HeadNorm(num_heads, self.head_v, "rms", norm_eps, **kw)

    def decays(self, x: Tensor) -> dict:
        """The op's decay arguments for input ``x``."""
        raise NotImplementedError

    def recurrence(self, q, k, v, initial_state, **kwargs):
        raise NotImplementedError

    def mix(self, x, packing, entry, want_state):
        q, k, v, g = project(x, self.q_proj, self.k_proj, self.v_proj, self.g_proj)
        q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))
        q, k, extra = self.rotate(q, k, packing, entry)
        o, state = self.recurrence(
            q, k, v, entry.get("state"), **self.decays(x),
            **self.op_kwargs(x, packing, want_state),
        )  # fmt: skip
        o = self.norm(o, g, "silu", self.backend)
        return self.o_proj(o), {"state": state, **extra}

    def rotate(self, q, k, packing, entry):
        """Position-dependent changes of ``q, k`` (none here; retention's rotary) →
        ``(q, k, extra cache entries)``."""
        return q, k, {}

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, key_dim={self.key_dim}, value_dim={self.value_dim}"


def upcast(x: Tensor) -> Tensor:
    """fp16/bf16 → fp32 (gate arithmetic); fp32 and fp64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
