"""Tensors beyond 2^31 elements: the Triton kernels' offsets must be 64-bit.

A batch of B = 17 sequences whose last element starts at element 2^31 of every [B, T, H, K]
tensor (and of the chunk states), with the first element's inputs copied into the last one:
forward and backward in one call, with the same cotangent on both. The two elements then run
the same code on the same values, one below 2^31 and one beyond, so their outputs, final
states and every gradient must agree (they are bitwise equal); an int32 offset anywhere reads
or writes the wrong memory and shows up as a large difference, NaN or a crash. (Comparing with
a separate call of the last element alone would not be exact: torch's CUDA cumsum, which forms
the gates' chunk-local sums, picks its kernel by shape, and a different rounding there flips
single bf16 roundings downstream.) About 45 GB of GPU memory at H = 16, K = V = 128.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import linrnn

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton on CPU tensors: interpreter only")  # fmt: skip
TOL = 1e-5
NEED_GIB = 60  # measured peak ≈ 45 GB; a smaller GPU skips


def rel_blocks(a: torch.Tensor, b: torch.Tensor, block: int = 2**26) -> float:
    """RMS-relative difference of two large tensors, in blocks (fp64 sums)."""
    a, b = a.reshape(-1), b.reshape(-1).to(a.device)
    num = den = 0.0
    for i in range(0, a.numel(), block):
        x, y = a[i : i + block].double(), b[i : i + block].double()
        num += float(((x - y) ** 2).sum())
        den += float((y**2).sum())
    return (num / max(den, 1e-300)) ** 0.5


def call(family: str, mode: str, leaves):
    """Forward and backward with the same cotangent on the first and the last batch element;
    the output, final state and gradients of those two elements."""
    q, k, v, *gates = leaves
    opts = dict(mode=mode, backend="triton", output_final_state=True)
    if family == "mlstm[exp]":
        o, state = linrnn.mlstm(q, k, v, *gates, input_gate="exp", **opts)
        S = state[0]
    else:
        o, S = linrnn.simple_gla(q, k, v, *gates, **opts)
    cot = []
    for x in (o, S):
        gen = torch.Generator(device=x.device).manual_seed(7)
        c = torch.randn(x[:1].shape, generator=gen, device=x.device, dtype=x.dtype)
        cot.append(torch.cat([c, torch.zeros_like(x[1:-1]), c]))
    grads = torch.autograd.grad([o, S], leaves, cot)
    return [(x[:1].detach(), x[-1:].detach()) for x in (o, S, *grads)]


def first_last_errors(family: str, mode: str, B: int, T: int, H: int, D: int, device,
                      dtype=torch.bfloat16) -> dict[str, float]:  # fmt: skip
    """Errors of the last batch element against the first (same inputs, same cotangents)."""
    gen = torch.Generator(device=device).manual_seed(0)
    qkv = [torch.randn(B, T, H, D, device=device, generator=gen).to(dtype) * 0.5 for _ in "qkv"]
    if family == "mlstm[exp]":
        gates = [torch.randn(B, T, H, device=device, generator=gen),
                 torch.randn(B, T, H, device=device, generator=gen) + 3]  # fmt: skip
    else:
        gates = [F.logsigmoid(torch.randn(B, T, H, device=device, generator=gen) + 3)]
    leaves = [*qkv, *gates]
    for x in leaves:
        x[-1:] = x[:1]
    pairs = call(family, mode, [x.requires_grad_() for x in leaves])
    names = ["o", "h_T", "dq", "dk", "dv", *(f"dgate{j}" for j in range(len(gates)))]
    errors = {n: rel_blocks(last, first) for n, (first, last) in zip(names, pairs, strict=True)}
    errors["non-finite"] = float(sum(int((~torch.isfinite(b)).sum()) for _, b in pairs))
    return errors


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["chunk", "fused_chunk"])
@pytest.mark.parametrize("family", ["simple_gla", "mlstm[exp]"])
def test_beyond_2_31_elements(family, mode, worst_errors):
    if torch.cuda.get_device_properties(0).total_memory < NEED_GIB * 2**30:
        pytest.skip(f"needs ≈ {NEED_GIB} GiB of GPU memory")
    H, D = 16, 128
    B, T = 17, 2**31 // (16 * H * D)  # the last element starts at element 2^31
    assert (B - 1) * T * H * D == 2**31
    errors = first_last_errors(family, mode, B, T, H, D, "cuda")
    torch.cuda.empty_cache()
    worst_errors("big offsets", f"{family} {mode} B{B}-T{T}-H{H}-K{D}", errors)
    assert errors.pop("non-finite") == 0
    assert max(errors.values()) <= TOL, errors


@interpreter
def test_machinery_on_cpu():
    """The comparison at a tiny shape (interpreter, fp32): the copied element agrees."""
    errors = first_last_errors("mlstm[exp]", "chunk", 3, 24, 2, 16, "cpu", torch.float32)
    assert set(errors) == {"o", "h_T", "dq", "dk", "dv", "dgate0", "dgate1", "non-finite"}
    assert errors.pop("non-finite") == 0 and max(errors.values()) <= TOL, errors
    a = torch.randn(1000)
    assert rel_blocks(a, a, block=64) == 0
    assert rel_blocks(a * 1.5, a, block=64) == pytest.approx(0.5)
