"""RWKV6's token shift and interpolations on Triton (linrnn.engine.token_mix) against float64
autograd of the formula written here: values and the gradients of x, mu and the LoRA's mix;
the plain shift-mix (one output, no mix) and the five data-dependent ones, dense rows and
packed sequences (an empty one, one token long), widths below and above a channel tile, more
tokens than one backward program takes, the mix contiguous and strided as the LoRA's einsum
leaves it (read in place), fp32 and bf16, outputs in another dtype (autocast's)."""

from __future__ import annotations

import pytest
import torch
from helpers import rel_err

from linrnn.layers.common import sequence_ids

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _ref(x, mu, mix, cu):
    """fp64: x_t + (x_{t−1} − x_t)(mu_f + mix_f,t), x_{t−1} = 0 at each sequence's start."""
    prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
    if cu is not None:
        keep = torch.ones(x.shape[1], 1, dtype=x.dtype)
        keep[[c for c in cu[:-1] if c < x.shape[1]]] = 0
        prev = prev * keep
    c = mu if mix is None else mu + mix  # [F, D] or [B, T, F, D]
    c = c.movedim(-2, 0) if mix is not None else c[:, None, None]
    return x + (prev - x) * c


CASES = [  # B, T, D, F, mix, packed offsets
    (2, 37, 48, 1, False, None),
    (2, 37, 48, 5, True, None),
    (1, 300, 160, 5, True, None),
    (1, 45, 24, 5, True, [0, 1, 1, 20, 45]),
    (1, 290, 16, 1, False, [0, 260, 290]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "case",
    CASES,
    ids=lambda c: (
        f"B{c[0]}-T{c[1]}-D{c[2]}-F{c[3]}-"
        f"{'mix' if c[4] else 'nomix'}-{'packed' if c[5] else 'dense'}"
    ),
)
def test_values_and_gradients(case, dtype):
    from linrnn.engine.token_mix import lerp_shift

    B, T, D, F, has_mix, cu = case
    x, mu = torch.randn(B, T, D), torch.rand(F, D)
    mix = None
    if has_mix:  # laid out as the LoRA's einsum leaves it, [F, B, T, D] underneath, but once
        mix = 0.3 * torch.randn(F, B, T, D).permute(1, 2, 0, 3)
        mix = mix.contiguous() if T == 37 else mix
        assert mix.is_contiguous() == (T == 37)
    dy = torch.randn(F, B, T, D)
    leaves = [t for t in (x, mu, mix) if t is not None]
    got = [x.to(DEVICE, dtype).requires_grad_(), mu.to(DEVICE).requires_grad_()]
    if has_mix:
        got.append(mix.to(DEVICE, dtype).requires_grad_())
        assert got[-1].is_contiguous() == (T == 37)
    out_dtype = torch.bfloat16 if dtype == torch.float32 and has_mix else dtype
    y = lerp_shift(got[0], sequence_ids(cu, DEVICE), got[1], got[2] if has_mix else None,
                   out_dtype)  # fmt: skip
    grads = torch.autograd.grad(y, got, dy.to(DEVICE, out_dtype))
    ref_leaves = [t.double().requires_grad_() for t in leaves]
    y64 = _ref(ref_leaves[0], ref_leaves[1], ref_leaves[2] if has_mix else None, cu)
    ref_grads = torch.autograd.grad(y64, ref_leaves, dy.to(out_dtype).double())
    assert y.dtype == out_dtype and y.shape == (F, B, T, D)
    tol = 1e-5 if out_dtype == torch.float32 else 2e-2
    assert rel_err(y.cpu(), y64) < tol
    for name, g, r in zip(("x", "mu", "mix"), grads, ref_grads):
        assert g.dtype == (torch.float32 if name == "mu" else dtype), name
        assert rel_err(g.cpu(), r) < (1e-5 if dtype == torch.float32 else 2e-2), name
