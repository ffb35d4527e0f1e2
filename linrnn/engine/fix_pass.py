"""Two launches of a kernel whose diagonal tiles must stay causal under non-finite values.

A tile whose value rows lie partly after its query rows (a chunk's diagonal tile) multiplies a
later step's value by the masked zeros of the earlier rows; a NaN or inf there would reach
those rows (0·NaN = NaN). Cleaning every tile before its product costs an elementwise pass and
registers on the common path, where inputs are finite. So such a kernel runs twice
(docs/DESIGN.md §6.1): first with plain products, storing per program whether its tile came out
finite; then with ``FIX=True``, where the programs whose tile did not re-form it with the causal
product (triton_common._causal_dot) and every other program returns at once. Both passes
are launched always: whether a tile needs the second one is known only on the device.
"""

from __future__ import annotations

import torch


def launch(kernel, grid: tuple, device: torch.device, **kwargs) -> None:
    """``kernel[grid](**kwargs)`` with plain products, then again with ``FIX`` over the programs
    whose tile was not finite; the kernel takes ``bad`` (an int8 flag per program, written by
    the first pass for every program that stores a tile) and the constexpr ``FIX``."""
    slots = 1
    for n in grid:
        slots *= n
    bad = torch.empty(slots, dtype=torch.int8, device=device)
    kernel[grid](bad=bad, FIX=False, **kwargs)
    kernel[grid](bad=bad, FIX=True, **kwargs)
