"""The fused SwiGLU activation (linrnn.engine.swiglu, and SwiGLU with backend="triton")
against float64 autograd of silu(g)·u written here: values and the gradient of the packed
projection; hidden widths below, at and above one channel tile and not multiples of it,
token counts that are not multiples of a tile's, a projection read in place from a wider
tensor, fp32 and bf16; every element of the outputs written (they start as NaN); the module
on the Triton path equals its PyTorch path."""

from __future__ import annotations

import pytest
import torch
from helpers import rel_err

from linrnn.models.feedforward import SwiGLU, swiglu

eng = pytest.importorskip("linrnn.engine.swiglu")  # (needs triton)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _ref(gu):
    """fp64: silu(g)·u with silu(g) = g·σ(g) (torch's σ: finite gradients at |g| = 1e4)."""
    g, u = gu[..., : gu.shape[-1] // 2], gu[..., gu.shape[-1] // 2 :]
    return g * torch.sigmoid(g) * u


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, H", [(1, 3), (37, 128), (19, 200), (70, 300)])
def test_kernels_values_and_gradient(n, H, dtype):
    # The reference starts from the inputs as the kernels see them (rounded to `dtype`), so
    # the bound measures the kernels' error, not the inputs' rounding. That error is the
    # output's rounding: under 2^-7 relative for bf16 (Triton's interpreter truncates).
    wide = (3 * torch.randn(n, 2 * H + 5, dtype=torch.float64)).to(dtype).double()
    gu64 = wide[:, 5:].clone().requires_grad_()  # the kernels read the strided view below
    dh = torch.randn(n, H, dtype=torch.float64).to(dtype).double()
    y64 = _ref(gu64)
    (dgu64,) = torch.autograd.grad(y64, gu64, dh)

    gu = wide.to(DEVICE, dtype)[:, 5:]
    assert gu.stride() == (2 * H + 5, 1)
    h = torch.full((n, H), float("nan"), device=DEVICE, dtype=dtype)
    eng.swiglu_fwd(gu, h)
    dgu = torch.full((n, 2 * H), float("nan"), device=DEVICE, dtype=dtype)
    eng.swiglu_bwd(gu, dh.to(DEVICE, dtype), dgu)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.isfinite(h).all() and torch.isfinite(dgu).all()
    assert rel_err(h.cpu(), y64) < tol
    assert rel_err(dgu.cpu(), dgu64) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_leading_dims_and_extremes(dtype):
    gu64 = (4 * torch.randn(2, 21, 2 * 136, dtype=torch.float64)).to(dtype).double()
    gu64[0, 0, :4] = torch.tensor([80.0, -80.0, 1e4, -1e4])  # SiLU's saturated ends
    gu64.requires_grad_()
    dh = torch.randn(2, 21, 136, dtype=torch.float64).to(dtype).double()
    gu = gu64.detach().to(DEVICE, dtype).requires_grad_()
    y = eng.swiglu(gu)
    (dgu,) = torch.autograd.grad(y, gu, dh.to(DEVICE, dtype))
    y64 = _ref(gu64)
    (dgu64,) = torch.autograd.grad(y64, gu64, dh)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert y.shape == (2, 21, 136) and y.dtype == dtype and dgu.dtype == dtype
    assert torch.isfinite(y).all() and torch.isfinite(dgu).all()
    assert rel_err(y.cpu(), y64) < tol and rel_err(dgu.cpu(), dgu64) < tol


def test_module_paths_agree():
    mlp = SwiGLU(48, 100).to(DEVICE)
    mlp.reset_parameters(0.2, 2)
    x = torch.randn(3, 17, 48, device=DEVICE, requires_grad=True)
    outs = []
    for backend in ("triton", "torch"):
        mlp.backend = backend
        y, _ = mlp(x)
        grads = torch.autograd.grad(y.square().sum(), [x, mlp.gate_up.weight])
        outs.append((y, *grads))
    for a, b in zip(*outs):
        assert rel_err(a.double().cpu(), b.double().cpu()) < 1e-5


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_odd_width_is_refused(backend):
    with pytest.raises(ValueError, match=r"even.*\(2, 5\)"):
        swiglu(torch.randn(2, 5, device=DEVICE), backend)
