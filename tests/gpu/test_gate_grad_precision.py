"""Per-channel log-decay gradients over a long sequence: GLA with gk and gv in fp16, bf16 and
fp32, both Triton modes, against float64 on the PyTorch path (RMS-relative errors of o, dq,
dk, dv, dgk, dgv). The decay gradients are sums over the whole sequence of terms that cancel
(q ⊙ dq − k ⊙ dk), so they show a precision loss first."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import linrnn

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton on CPU tensors: interpreter only")  # fmt: skip
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 1e-4}
NAMES = ("o", "dq", "dk", "dv", "dgk", "dgv")


def gla_errors(mode: str, dtype, B: int, T: int, H: int, D: int, device, chunk=64) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    r = lambda: torch.randn(B, T, H, D, dtype=torch.float64, device=device, generator=gen)  # noqa: E731
    q, k, v, do = r(), r(), r(), r()
    gk, gv = F.logsigmoid(r() + 4), F.logsigmoid(r() + 4)

    def grads(mode, backend, dtype):
        xs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        gs = [t.to(gate_dtype).requires_grad_() for t in (gk, gv)]
        o, _ = linrnn.gla(*xs, gs[0], gv=gs[1], mode=mode, backend=backend, chunk_size=chunk)
        return [o.detach(), *torch.autograd.grad(o, xs + gs, do.to(o.dtype))]

    ref = grads("chunk", "torch", torch.float64)
    got = grads(mode, "triton", dtype)
    return {n: float((a.double() - b).norm() / b.norm()) for n, a, b in zip(NAMES, got, ref)}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("mode", ["chunk", "fused_chunk"])
def test_long_sequence_gate_gradients(mode, dtype, worst_errors):
    errors = gla_errors(mode, dtype, 2, 8192, 4, 64, "cuda")
    worst_errors("gate grads", f"gla[gv] {mode} {dtype} B2-T8192-H4-K64-V64", errors)
    assert max(errors.values()) <= TOLERANCE[dtype], errors


@interpreter
def test_machinery_on_cpu():
    errors = gla_errors("chunk", torch.float32, 1, 40, 1, 16, "cpu", chunk=16)
    assert set(errors) == set(NAMES) and max(errors.values()) <= TOLERANCE[torch.float32]
