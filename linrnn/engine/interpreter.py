"""Whether Triton's interpreter (``TRITON_INTERPRET=1``, Triton kernels on CPU tensors) can run
the engine's kernels here.

The kernels loop over chunk ranges read from tables (``for i_c in range(c_lo, c_hi)`` with
loaded bounds). The interpreters of Triton 3.6 and before turn such a bound into an int from a
one-element NumPy array, which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted
to Python scalars"; fixed in later Triton: github.com/triton-lang/triton/issues/9171): every
kernel call would fail deep inside the interpreter. :func:`problem` runs that construct once on
a tiny kernel, so a call can say up front what is wrong and how to fix it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _loaded_bound_kernel(n, out):
    """out[0] = n[0], counted by a loop whose bound is loaded (as the kernels' chunk loops)."""
    count = 0
    for _ in range(tl.load(n)):
        count += 1
    tl.store(out, count)


@functools.cache
def problem() -> str | None:
    """None when the interpreter runs a loop over a loaded bound correctly; else a sentence
    naming the versions and the way out. Computed once per process."""
    import numpy
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(_loaded_bound_kernel, InterpretedFunction):
        return (
            "TRITON_INTERPRET=1 was set after triton was imported, so its kernels were built "
            "for a GPU; set it before the first import of triton (or linrnn), or use "
            "backend='torch'"
        )
    n = torch.tensor([3], dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    try:
        _loaded_bound_kernel[(1,)](n=n, out=out)
        if int(out[0]) == 3:
            return None
        failure = f"a loop over a loaded bound of 3 ran {int(out[0])} times"
    except Exception as exc:  # the interpreter's own error, whatever its type
        failure = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return (
        f"the Triton interpreter (triton {triton.__version__}, numpy {numpy.__version__}) "
        f"cannot run linrnn's kernels ({failure}); Triton 3.6 and older need numpy < 2.4 "
        "under TRITON_INTERPRET=1 (github.com/triton-lang/triton/issues/9171). Install "
        "numpy<2.4 or a newer Triton, or use backend='torch'"
    )
