"""The host-side integer helpers (linrnn.engine.host_math) against Triton's own."""

from __future__ import annotations

import pytest
import torch

from linrnn.engine.host_math import cdiv, next_pow2

triton = pytest.importorskip("triton")


def test_host_math_matches_triton():
    sizes = [*range(0, 600), *(2**k + d for k in range(10, 34) for d in (-1, 0, 1))]
    assert [next_pow2(n) for n in sizes] == [triton.next_power_of_2(n) for n in sizes]
    a = torch.randint(0, 10**9, (2000,)).tolist()
    b = torch.randint(1, 5000, (2000,)).tolist()
    assert [cdiv(x, y) for x, y in zip(a, b)] == [triton.cdiv(x, y) for x, y in zip(a, b)]
