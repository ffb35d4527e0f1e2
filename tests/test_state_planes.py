"""The split chunk states (triton_kernels' ST_PLANES: an fp32 state stored as a bf16 high
plane and an int16 remainder) round-trip exactly; the engine paths that use them are checked
in test_triton_vector (fp32 inputs forced onto them) and on the GPU (bf16)."""

from __future__ import annotations

import pytest
import torch
from test_triton_engine import DEVICE

triton = pytest.importorskip("triton")
tl = triton.language

from linrnn.engine.triton_kernels import _split_load, _split_store  # noqa: E402


@triton.jit
def _round_trip(X, HI, LO, Y, n, B: tl.constexpr):
    o = tl.arange(0, B)
    m = o < n
    _split_store(HI + o, LO + o, tl.load(X + o, mask=m), m)
    tl.store(Y + o, _split_load(HI + o, LO + o, m), mask=m)


def test_round_trip():
    """Split states (triton_kernels._split_store/_split_load): any fp32 value — signed zeros,
    subnormals, values over the whole exponent range, exact bf16 ties either way — comes back
    bit for bit, and the high plane is that value rounded to the nearest bf16 (ties away
    from zero, so off RTNE by one unit at ties of even values only)."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    x = torch.randn(2000, generator=g) * torch.exp(torch.randn(2000, generator=g) * 25)
    bits = torch.randint(-(2**31), 2**31 - 1, (2000,), generator=g, dtype=torch.int32)
    ties = ((bits & ~0xFFFF) | 0x8000).view(torch.float32)  # exactly halfway between bf16s
    ties = ties[torch.isfinite(ties) & (ties.abs() < 1e38)]
    x = torch.cat([torch.tensor([0.0, -0.0, 1e-40, -3e-42, 3e38]), x, ties[:500]])
    n = x.numel()
    x = x.to(DEVICE)
    hi = torch.full((n,), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lo = torch.full((n,), 12345, dtype=torch.int16, device=DEVICE)
    y = torch.full((n,), float("nan"), device=DEVICE)
    _round_trip[(1,)](x, hi, lo, y, n, B=triton.next_power_of_2(n))
    assert torch.equal(y.view(torch.int32), x.view(torch.int32)), "round trip not bit-exact"
    tie = (x.view(torch.int32) & 0xFFFF) == 0x8000
    rne = x.to(torch.bfloat16)
    assert torch.equal(hi[~tie].view(torch.int16), rne[~tie].view(torch.int16))
    away = (x[tie].view(torch.int32) + 0x8000) >> 16  # ties: the neighbour away from zero
    assert torch.equal(hi[tie].view(torch.int16).int(), away.to(torch.int16).int())
    assert int(tie.sum()) >= 400
