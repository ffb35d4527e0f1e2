"""The Triton key/query normalization (linrnn.engine.l2norm) against float64 autograd of
x·rsqrt(Σx² + eps): values and the input gradient, fp32 and bf16, head dims that are and are
not powers of two, row counts that are not multiples of the rows per program; and the delta
rule with ``use_qk_l2norm`` on the Triton backend against the loop on normalized q, k."""

from __future__ import annotations

import pytest
import torch
from helpers import rel_err

from linrnn.engine import l2norm as tl2
from linrnn.ops.delta_rule import L2NORM_EPS

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _ref(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 7, 3, 16), (1, 5, 2, 48), (1, 3, 1, 128)])
def test_values_and_gradient(shape, dtype):
    x = 3 * torch.randn(shape)
    x[0, 0, 0] = 0.0  # a zero row stays finite (eps)
    x = x.to(DEVICE, dtype).requires_grad_()
    dy = torch.randn(shape).to(DEVICE, dtype)
    y = tl2.l2norm(x, L2NORM_EPS)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    y64 = _ref(x64)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    assert y.dtype == dx.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    assert rel_err(y, y64) < tol and rel_err(dx, dx64) < tol


def test_delta_rule_triton_l2norm_matches_loop():
    """The op's Triton path with ``use_qk_l2norm``: outputs and q, k gradients equal the loop
    on normalized inputs (fp64 autograd)."""
    import linrnn
    from linrnn.reference.delta import delta_recurrent

    B, T, H, K, V = 1, 19, 2, 16, 8
    q, k = (3 * torch.randn(B, T, H, K) for _ in range(2))
    v, beta = torch.randn(B, T, H, V), torch.rand(B, T, H)
    do = torch.randn(B, T, H, V)
    leaves = [x.to(DEVICE).requires_grad_() for x in (q, k)]
    o, _ = linrnn.delta_rule(*leaves, v.to(DEVICE), beta.to(DEVICE), mode="chunk",
                             backend="triton", chunk_size=16, use_qk_l2norm=True)  # fmt: skip
    grads = torch.autograd.grad(o, leaves, do.to(DEVICE))
    ref_leaves = [x.double().requires_grad_() for x in (q, k)]
    o64, _ = delta_recurrent(_ref(ref_leaves[0]), _ref(ref_leaves[1]), v.double(),
                             beta.double(), scale=K**-0.5)  # fmt: skip
    ref_grads = torch.autograd.grad(o64, ref_leaves, do.double())
    assert rel_err(o.cpu(), o64) < 1e-5
    for got, ref in zip(grads, ref_grads):
        assert rel_err(got.cpu(), ref) < 1e-5
