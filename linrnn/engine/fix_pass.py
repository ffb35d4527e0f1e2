"""Two launches of a kernel whose diagonal tiles must stay causal under non-finite values.

A tile whose value rows lie partly after its query rows (a chunk's diagonal tile) multiplies a
later step's value by the masked zeros of the earlier rows; a NaN or inf there would reach
those rows (0·NaN = NaN). Cleaning every tile before its product costs an elementwise pass and
registers on the common path, where inputs are finite. So such a kernel runs twice
(docs/DESIGN.md §6.1): first over its grid with plain products, each program storing whether
its tile came out finite; then with ``FIX=True`` over a few programs, one or two per SM, that
read those flags a block at a time and form the flagged tiles again with the causal product
(triton_common._causal_dot). Whether a tile needs it is known only on the device, so the
second launch always runs; it is one short wave when nothing is flagged, where relaunching the
whole grid would take a wave of early exits per resident set of programs (about 60 waves at
B = 8, T = 8192, H = 16, K = V = 256, two programs per SM).
"""

from __future__ import annotations

import functools

import torch

FIX_PROGRAMS_PER_SM = 2  # the output kernels fit two programs per SM (255 registers, 4 warps)
INTERPRETER_PROGRAMS = 3  # without a GPU: several slots per program, so the scan is exercised


@functools.cache
def _fix_programs(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_PROGRAMS
    return FIX_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def launch(kernel, grid: tuple, device: torch.device, **kwargs) -> None:
    """``kernel[grid](**kwargs)`` with plain products, then the fix pass over the programs
    whose tile was not finite. The kernel takes ``bad`` (int8, one flag per program of
    ``grid``, zero unless the first launch flags its tile), ``SLOTS`` (the number of those
    programs) and the constexpr ``FIX``."""
    slots = 1
    for n in grid:
        slots *= n
    # zeros: a program without rows (past a short chunk's end) stores no flag
    bad = torch.zeros(slots, dtype=torch.int8, device=device)
    kernel[grid](bad=bad, SLOTS=slots, FIX=False, **kwargs)
    fix_grid = (max(1, min(slots, _fix_programs(torch.device(device)))),)
    kernel[fix_grid](bad=bad, SLOTS=slots, FIX=True, **kwargs)
