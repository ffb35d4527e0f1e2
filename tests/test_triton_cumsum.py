"""The chunk-local cumulative log decays. vector_cumsum_kernels.chunk_cumsum_kernel (through
vector._cumsums): the chunk-local
inclusive and exclusive sums of a log decay against an fp64 loop over each chunk's tokens,
dense and packed, chunks of one and of several row tiles, a partial last chunk, bf16 input;
the exclusive sum equal to the inclusive one shifted by one step, bit for bit; each chunk's
span (the fast chunks' test) against the fp64 sums' range. The outputs are NaN-poisoned
allocations (conftest), so a row the kernel skips fails. scalar_cumsum_kernels (through
scalar._chunk_cumsum): a scalar gate's sums as [B·H, T] rows against the same fp64 loop, dense
and packed, chunks of one and of several column tiles, strided and bf16 gates; and the running
maximum of a − b within each chunk (mLSTM-exp's row maxima) against torch's cummax."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_triton_engine import DEVICE

from linrnn.engine import scalar, vector
from linrnn.engine.config import ChunkConfig

pytest.importorskip("triton")


def _chunks(T, L, offsets):
    """[(c0, c1)] of every chunk: L-token pieces of each sequence."""
    bounds = offsets if offsets is not None else [0, T]
    out = []
    for a, b in itertools.pairwise(bounds):
        out += [(c0, min(c0 + L, b)) for c0 in range(a, b, L)]
    return out


@pytest.mark.parametrize(
    "B, T, H, D, L, offsets",
    [
        (2, 45, 3, 20, 16, None),  # one row tile per chunk, a partial last chunk
        (1, 200, 2, 80, 160, None),  # three row tiles per chunk (64, 64, 32), two D tiles
        (1, 200, 2, 24, 64, [0, 1, 10, 10, 75, 200]),  # packed: lengths 1, 9, 0, 65, 125
    ],
    ids=["T45-L16", "T200-L160-D80", "packed"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cumsums_match_fp64(B, T, H, D, L, offsets, dtype):
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device=DEVICE) * 3).to(dtype)
    q = torch.empty(B, T, H, D, device=DEVICE)
    c = ChunkConfig(q, q, q, scale=1.0, has_decay=True, has_igate=False, stabilize=False,
                    track_n=False, normalizer=None, eps=0.0, chunk_size=L,
                    offsets=offsets)  # fmt: skip
    inc, exc, spans = vector._cumsums(g, c, exclusive=True, span=True)
    inc_only, same, spans_inc = vector._cumsums(g, c, exclusive=False, span=True)
    assert inc.dtype == exc.dtype == torch.float32 and same is inc_only

    ref_inc = torch.full(g.shape, float("nan"), dtype=torch.float64)
    ref_exc = ref_inc.clone()
    g64 = g.double().cpu()
    for c0, c1 in _chunks(T, L, offsets):
        run = torch.zeros(B, H, D, dtype=torch.float64)
        for t in range(c0, c1):
            ref_exc[:, t] = run
            run = run + g64[:, t]
            ref_inc[:, t] = run
    for got, ref in ((inc, ref_inc), (exc, ref_exc), (inc_only, ref_inc)):
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got.double().cpu(), ref, rtol=1e-5, atol=1e-4)

    # exclusive = inclusive shifted by one step, exactly; 0 at each chunk's first step
    for c0, c1 in _chunks(T, L, offsets):
        assert bool((exc[:, c0] == 0).all())
        assert torch.equal(exc[:, c0 + 1 : c1], inc[:, c0 : c1 - 1])

    # the chunks' spans: max over channels of (max − min) of every G^X and G^K value of the
    # chunk (the exclusive form adds its 0 at the chunk start), per (chunk, b·h)
    B_, H_ = g.shape[0], g.shape[2]
    for i, (c0, c1) in enumerate(_chunks(T, L, offsets)):
        for b, h in itertools.product(range(B_), range(H_)):
            vals = ref_inc[b, c0:c1, h]  # [rows, D]
            lo = vals.min(0).values
            want_inc = float((vals.max(0).values - lo).max())
            want_exc = float((torch.clamp(vals.max(0).values, min=0.0) - lo).max())
            got_inc = float(spans_inc[i, b * H_ + h])
            got_exc = float(spans[i, b * H_ + h])
            assert abs(got_inc - want_inc) <= 1e-4 * max(1.0, want_inc), (i, b, h)
            assert abs(got_exc - want_exc) <= 1e-4 * max(1.0, want_exc), (i, b, h)


@pytest.mark.parametrize(
    "B, T, H, L, offsets",
    [
        (2, 45, 3, 16, None),  # several chunks a program, a partial last chunk
        (1, 700, 2, 600, None),  # three column tiles per chunk (256, 256, 88)
        (3, 1100, 2, 32, None),  # more chunks than one program takes (CH = 32)
        (1, 200, 2, 64, [0, 1, 10, 10, 75, 200]),  # packed: lengths 1, 9, 0, 65, 125
    ],
    ids=["T45-L16", "T700-L600", "T1100-L32", "packed"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_scalar_cumsum_matches_fp64(B, T, H, L, offsets, dtype):
    # a [B, H, T] tensor moved to [B, T, H]: strided, as a gate the kernel reads in place
    g = torch.nn.functional.logsigmoid(torch.randn(B, H, T, device=DEVICE) * 3)
    g = g.to(dtype).transpose(1, 2)
    q = torch.empty(B, T, H, 8, device=DEVICE)
    c = ChunkConfig(q, q, q, scale=1.0, has_decay=True, has_igate=False, stabilize=False,
                    track_n=False, normalizer=None, eps=0.0, chunk_size=L,
                    offsets=offsets)  # fmt: skip
    a = torch.randn(B * H, T, device=DEVICE) * 5  # log input gate rows (mLSTM-exp)
    got, rmax = scalar._chunk_cumsum(g, c.L, c, a)
    assert got.shape == rmax.shape == (B * H, T) and got.dtype == rmax.dtype == torch.float32
    assert torch.equal(scalar._chunk_cumsum(g, c.L, c)[0], got)
    # the running maximum of a − b within each chunk, exactly (a maximum rounds nothing)
    ref_max = torch.full((B * H, T), float("nan"), device=DEVICE)
    for c0, c1 in _chunks(T, c.L, offsets):
        ref_max[:, c0:c1] = (a - got)[:, c0:c1].cummax(1).values
    assert torch.equal(rmax, ref_max)

    ref = torch.full((B, T, H), float("nan"), dtype=torch.float64)
    g64 = g.double().cpu()
    for c0, c1 in _chunks(T, c.L, offsets):
        ref[:, c0:c1] = g64[:, c0:c1].cumsum(1)
    ref = ref.permute(0, 2, 1).reshape(B * H, T)
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got.double().cpu(), ref, rtol=1e-5, atol=1e-4)
