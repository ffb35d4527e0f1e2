"""A layer's input projections of one x under autocast: one cast of the weights, contiguous
outputs, one product each way in the backward (:func:`project`)."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn._runtime import tracing

PROJECT_ALIGN = 16  # rows: each projection's padded width in the backward's products (cuBLAS)


@functools.lru_cache(maxsize=64)
def _cached_zeros(shape: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.zeros(shape, dtype=dtype, device=device)


def _zeros(shape: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A read-only block of zeros, made once per shape in eager mode: a padded projection's
    rows would otherwise cost an allocation and a fill launch per call (the concatenations only
    read them, so one made under inference mode serves training too). While torch.compile
    traces, a fresh one (the compiled graph makes it; dynamo warns about cached calls)."""
    if tracing():
        return torch.zeros(shape, dtype=dtype, device=device)
    return _cached_zeros(shape, dtype, device)


class _Projections(torch.autograd.Function):
    """``x wᵢᵀ + bᵢ`` for the row spans ``(offset, rows)`` of one weight ``w [N, D]``, each
    output its own contiguous tensor; the backward stacks the outputs' gradients (zeros for
    the rows between spans and for outputs without one) into ``[M, N]`` once and takes dx and
    dw from it as one product each, as the backward of one product of all N rows would."""

    @staticmethod
    def forward(ctx, x, w, b, spans):
        ctx.save_for_backward(x, w)
        ctx.spans, ctx.has_bias = spans, b is not None
        return tuple(
            F.linear(x, w[o : o + n], None if b is None else b[o : o + n]) for o, n in spans
        )

    @staticmethod
    def backward(ctx, *dys):
        x, w = ctx.saved_tensors
        M, N = math.prod(x.shape[:-1]), w.shape[0]
        z = lambda n: _zeros((M, n), w.dtype, w.device)  # noqa: E731
        parts, at = [], 0
        for (o, n), dy in zip(ctx.spans, dys):
            if o > at:
                parts.append(z(o - at))
            parts.append(z(n) if dy is None else dy.reshape(M, n).to(w.dtype))
            at = o + n
        if at < N:
            parts.append(z(N - at))
        dy = torch.cat(parts, dim=1)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = (dy @ w).view(x.shape)
        if ctx.needs_input_grad[1]:
            dw = dy.t() @ x.reshape(M, -1)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(0)
        return dx, dw, db, None


def project(x: Tensor, *linears: nn.Module) -> list[Tensor]:
    """``[m(x) for m in linears]``, under autocast with the weights (and biases, zeros where a
    projection has none) concatenated and cast once, and each output a contiguous tensor of
    its own: q, k and v reach the kernels without a copy (a split of one product's output
    would be strided views, which the ops copy, forward and backward). The backward takes the
    input's and the weights' gradients as one product each from the outputs' gradients laid
    side by side, so it adds no fp32 passes for the input gradient; the saved tensors are the
    bf16 input and weight one product would save. Without autocast the concatenation would
    be a saved copy of the weights, so each projection runs alone, as it does for a module
    that is not a plain ``nn.Linear`` or has hooks (LoRA wrappers, parametrizations, forward
    hooks see their own call).

    A projection whose width is no multiple of :data:`PROJECT_ALIGN` (a per-head gate) is
    followed by zero rows up to one, so the backward's products have a row length and
    offsets of multiples of 16 elements: with DeltaNet's 2,052 columns cuBLAS fell back to
    its sm80 kernels on an H200 (docs/tuning.md, "Input projections")."""
    if (
        len(linears) < 2
        or not torch.is_autocast_enabled(x.device.type)
        or x.dtype == torch.float64  # (autocast leaves fp64 alone)
        or not all(
            type(m) is nn.Linear and not m._forward_hooks and not m._forward_pre_hooks
            for m in linears
        )
    ):
        return [m(x) for m in linears]
    weights, biases, spans, at = [], [], [], 0
    has_bias = any(m.bias is not None for m in linears)
    for m in linears:
        n, pad = m.out_features, -m.out_features % PROJECT_ALIGN
        dtype, device = m.weight.dtype, m.weight.device
        spans.append((at, n))
        at += n + pad
        weights += [m.weight] + ([_zeros((pad, m.in_features), dtype, device)] if pad else [])
        if has_bias:
            bias = _zeros((n,), dtype, device) if m.bias is None else m.bias
            biases += [bias] + ([_zeros((pad,), dtype, device)] if pad else [])
    kind = x.device.type
    dtype = torch.get_autocast_dtype(kind)
    w = torch.cat(weights).to(dtype)
    b = torch.cat(biases).to(dtype) if has_bias else None
    with torch.autocast(kind, enabled=False):
        return list(_Projections.apply(x.to(dtype), w, b, tuple(spans)))
