"""The block loads every Triton kernel of the engine shares (int64 row offsets), in a module of
their own so that the scalar and the vector kernels both use the same ones."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile(ptr, rows, cols, row_stride, m_rows, m_cols):
    """Load ``ptr[rows, cols]`` as a [len(rows), len(cols)] block (row-major, int64 rows)."""
    p = ptr + rows.to(tl.int64)[:, None] * row_stride + cols[None, :]
    return tl.load(p, mask=m_rows[:, None] & m_cols[None, :], other=0.0)


@triton.jit
def _tile_t(ptr, rows, cols, row_stride, m_rows, m_cols):
    """Load ``ptr[rows, cols]`` transposed, as a [len(cols), len(rows)] block."""
    p = ptr + rows.to(tl.int64)[None, :] * row_stride + cols[:, None]
    return tl.load(p, mask=m_cols[:, None] & m_rows[None, :], other=0.0)
