"""Integer helpers for the kernels' host code (grids and tile sizes).

``triton.cdiv`` and ``triton.next_power_of_2`` are Triton functions whose Python calls cost
microseconds each, and a decode step or a small chunk call makes several to dozens of them.
These are the same functions on Python ints.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for integers (b > 0)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ n for n ≥ 1, and 0 for 0 (as triton.next_power_of_2)."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()
