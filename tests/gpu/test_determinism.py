"""Bitwise determinism: the same inputs twice through forward and backward give bitwise the
same output and gradients, for each gate kind and normalizer, in both Triton modes, at a long
sequence (a race between pipeline stages or programs shows up only with many chunks)."""

from __future__ import annotations

import os

import pytest
import torch

from linrnn.bench import registry
from linrnn.selfcheck import run

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton on CPU tensors: interpreter only")  # fmt: skip
OPS = ("linear_attn[normalize]", "simple_gla", "gla", "gla[gv]", "rwkv6", "mlstm[exp]",
       "mlstm[sigmoid,normalize]")  # fmt: skip
SHAPE = "B1-T32768-H8-K128-V128"


def outputs(op: str, mode: str, shape_id: str, device, dtype="bf16") -> list[torch.Tensor]:
    """Output and gradients of one seeded forward+backward."""
    args, kwargs, _ = registry.bench_inputs(op, registry.parse_shape(shape_id), dtype, 0, device)
    leaves = [x for x in (*args, *kwargs.values()) if x.requires_grad]
    o, _ = run(registry.selfcheck_variant(op), args, kwargs, mode=mode, backend="triton")
    gen = torch.Generator(device=o.device).manual_seed(1)
    do = torch.randn(o.shape, generator=gen, device=o.device, dtype=o.dtype)
    return [o.detach(), *torch.autograd.grad(o, leaves, do)]


def differing(first: list[torch.Tensor], second: list[torch.Tensor]) -> dict[str, float]:
    """Elements that differ bitwise (NaN equal to NaN), per tensor."""
    names = ["o", *(f"grad{j}" for j in range(len(first) - 1))]
    same = lambda a, b: (a == b) | (a.isnan() & b.isnan())  # noqa: E731
    return {n: float((~same(a, b)).sum()) for n, a, b in zip(names, first, second, strict=True)}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["chunk", "fused_chunk"])
@pytest.mark.parametrize("op", OPS)
def test_bitwise_repeatable(op, mode, worst_errors):
    diff = differing(outputs(op, mode, SHAPE, "cuda"), outputs(op, mode, SHAPE, "cuda"))
    worst_errors("determinism", f"{op} {mode} {SHAPE} (differing elements)", diff)
    assert not any(diff.values()), diff


@interpreter
def test_machinery_on_cpu():
    """A tiny run twice is equal (interpreter, fp32), and a changed element is counted."""
    a = outputs("simple_gla", "chunk", "B1-T40-H1-K16-V16", "cpu", "fp32")
    b = outputs("simple_gla", "chunk", "B1-T40-H1-K16-V16", "cpu", "fp32")
    assert len(a) == 5 and not any(differing(a, b).values())
    b[2] = b[2].clone()
    b[2].view(-1)[3] += 1
    assert differing(a, b) == {"o": 0, "grad0": 0, "grad1": 1, "grad2": 0, "grad3": 0}
