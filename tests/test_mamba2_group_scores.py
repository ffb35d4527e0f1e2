"""Mamba2 on the Triton chunk path's dv kernel for B/C groups
(linrnn.engine.group_scores_kernels: one program forms a chunk's B·Cᵀ once for several value
heads of a group): every output and gradient against the fp64 loop, and bitwise against the
per-head kernel it stands in for (the same tiles, the same numbers per head). Small tiles (16)
give chunks of two time tiles, short last chunks and several V and depth tiles on tiny
shapes."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close
from test_mamba2_ops import DEVICE, F64, _check_triton, _packed_loop, build, loop, op, with_grads

from linrnn.engine import config, scalar
from linrnn.engine import group_scores_kernels as gsk

TILE = (16, 16, 16, 4, 2)  # (time, depth, V tile, num_warps, num_stages)

CASES = {
    # B, T, H, groups, N, P, chunk size, packed, HPP, D: one group of 8 heads in one program,
    # without D (no skip term); two groups of 4 with packed sequences, each group over two
    # programs of 2 heads (N, P not multiples of the tiles). (The group dv kernel over a batch
    # of two: test_group_kernels_fp32_all_gradients.)
    "one-group-of-8-no-D": (1, 56, 8, 1, 32, 32, 32, None, 8, False),
    "two-groups-of-4-packed": (1, 56, 8, 2, 40, 24, 32, [0, 21, 56], 2, True),
}


class Counted:
    """A kernel whose launches are counted (``kernel[grid](...)``)."""

    def __init__(self, kernel, counts, name):
        self.kernel, self.counts, self.name = kernel, counts, name

    def __getitem__(self, grid):
        self.counts[self.name] = self.counts.get(self.name, 0) + 1
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch):
    """The launch counts of the group dv kernel."""
    counts = {}
    monkeypatch.setattr(gsk, "group_dv_kernel", Counted(gsk.group_dv_kernel, counts, "dv"))
    return counts


@pytest.fixture
def small_tiles(monkeypatch, launches):
    """16-wide tiles for the group dv kernel and the per-head kernels, groups of 4 heads on
    the group paths (whatever their thresholds); returns the group dv kernel's launch count."""
    monkeypatch.setitem(scalar.GROUP_SCORE_TILES, "dv", TILE)
    monkeypatch.setattr(scalar, "GROUP_MIN_HEADS", 4)
    monkeypatch.setattr(scalar, "GROUP_DV_MIN_HEADS", 4)
    for name in ("out_fwd", "dv_bwd"):  # in every table the head dims may pick
        for table in (config.TILES, config.HD64_TILES, config.HD128_TILES):
            monkeypatch.setitem(table, name, TILE)
    return launches


def _inputs(case, dtype):
    """Seeded inputs and initial state of ``case``, rounded to ``dtype`` (fp64)."""
    Bsz, T, H, groups, N, P, _, cu, _, with_D = case
    inputs = build(Bsz, T, H, groups, N, P)
    inputs = {n: x.to(dtype).double().to(DEVICE) for n, x in inputs.items()}
    if not with_D:
        del inputs["D"]
    h0 = torch.randn(Bsz if cu is None else len(cu) - 1, H, N, P, dtype=F64)
    return inputs, h0.to(dtype).double().to(DEVICE)


def _run(case, inputs, h0, dtype, hpp, monkeypatch):
    """Mamba2's outputs and gradients in ``dtype`` on the Triton chunk path with ``hpp`` value
    heads per group dv program (1: the per-head kernel)."""
    monkeypatch.setattr(scalar, "score_heads_per_program", lambda G, programs: hpp)
    return with_grads(op, inputs, h0, dtype, mode="chunk", chunk_size=case[6],
                      cu_seqlens=case[7], backend="triton", dt_softplus=True)  # fmt: skip


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_group_kernels_match_per_head(name, dtype, backend, small_tiles, monkeypatch):
    """Outputs and every gradient bitwise equal to the per-head kernel's (both tiled alike),
    the group dv kernel launched once; y, the final state, dx and dD against the fp64 loop
    (the rest come from kernels both paths share)."""
    case = CASES[name]
    inputs, h0 = _inputs(case, dtype)
    got = _run(case, inputs, h0, dtype, case[8], monkeypatch)
    assert small_tiles == {"dv": 1}
    small_tiles.clear()
    per_head = _run(case, inputs, h0, dtype, 1, monkeypatch)
    assert small_tiles == {}
    assert torch.equal(got[0], per_head[0]), "y differs"
    assert torch.equal(got[1], per_head[1]), "final state differs"
    for n in got[2]:
        assert torch.equal(got[2][n], per_head[2][n]), f"d{n} differs from the per-head path"
    cu = case[7]
    if cu is None:
        ref = with_grads(loop, inputs, h0)
    else:
        ref = _packed_loop(inputs, h0, cu, F64)
    assert_close("y", got[0].cpu(), ref[0].cpu(), dtype)
    assert_close("final_state", got[1].cpu(), ref[1].cpu(), dtype)
    for n in ("x", "D", "initial_state") if "D" in inputs else ("x", "initial_state"):
        assert_close(f"d{n}", got[2][n].cpu(), ref[2][n].cpu(), dtype)


@pytest.mark.parametrize("backend", ["triton"])
def test_group_kernels_fp32_all_gradients(backend, small_tiles, monkeypatch):
    """Two groups of 4 heads, the whole group per program: every output and gradient of fp32
    against the fp64 loop (dA, d(dt_bias) to their summed terms' size, as in
    test_mamba2_ops)."""
    monkeypatch.setattr(scalar, "score_heads_per_program", lambda G, programs: G)
    _check_triton(("chunk", 2, 45, 8, 2, 16, 16, 32, False, True), backend)
    assert small_tiles == {"dv": 1}


@pytest.mark.parametrize("backend", ["triton"])
def test_shipped_tiles_two_time_tiles(backend, launches, monkeypatch):
    """The shipped tile at the longest chunk the group dv kernel takes (two time tiles: 256 rows
    at the 128-row tile), one group of 8 heads, a short last chunk: every output and gradient
    of fp32 against the fp64 loop."""
    BT = scalar.GROUP_SCORE_TILES["dv"][0]
    monkeypatch.setattr(scalar, "score_heads_per_program", lambda G, programs: G)
    _check_triton(("chunk", 1, 2 * BT + 44, 8, 1, 16, 8, 2 * BT, False, False), backend)
    assert launches == {"dv": 1}


def _config(B, T, H, groups, N, P, L=None, **kw):
    """The ChunkConfig of a Mamba2-like call (meta tensors: no data, no launch)."""
    q = torch.empty(B, T, groups, N, device="meta", dtype=torch.bfloat16)
    v = torch.empty(B, T, H, P, device="meta", dtype=torch.bfloat16)
    opts = dict(scale=1.0, g=q, gi=q, stabilize=False, track_n=False, normalizer=None, eps=0.0,
                chunk_size=L, fused=False, offsets=None)  # fmt: skip
    return scalar.config(q, q, v, **dict(opts, **kw))


@pytest.mark.parametrize(
    "shape,kw,hpp",
    [
        # 512 programs per set of heads (a 128-row chunk is one time tile): the group's 64
        # heads split in two to reach GROUP_MIN_PROGRAMS
        ((8, 8192, 64, 1, 128, 64), {}, 32),
        ((2, 8192, 64, 8, 128, 64), {}, 8),
        ((1, 256, 64, 1, 128, 64), {}, 1),  # too few programs: the per-head kernels
        ((8, 8192, 32, 8, 128, 64), {}, 4),  # groups of 4
        ((8, 8192, 64, 32, 128, 64), {}, 2),  # groups of 2: GROUP_DV_MIN_HEADS
        ((8, 8192, 64, 64, 128, 64), {}, 0),  # no groups
        ((8, 8192, 64, 1, 128, 64), dict(chunk_size=256), 32),  # two time tiles per chunk
        ((8, 8192, 64, 1, 128, 64), dict(chunk_size=512), 0),  # four time tiles per chunk
        ((8, 8192, 64, 1, 128, 64), dict(stabilize=True), 0),
        ((8, 8192, 64, 1, 128, 64), dict(normalizer="sum"), 0),
        ((8, 8192, 64, 1, 128, 64), dict(fused=True, chunk_size=64), 0),
    ],
)
def test_group_path_choice(shape, kw, hpp):
    """Where the group dv kernel serves and with how many heads per program (HPP); the group
    dq/dk kernels from GROUP_MIN_HEADS heads per group on."""
    c = _config(*shape, **kw)
    G, N, P = shape[2] // shape[3], shape[4], shape[5]
    assert scalar._group_dv_heads(c, G, N, P) == hpp
    assert scalar.group_path(G, c) == (
        G >= 4 and not kw.get("stabilize") and "normalizer" not in kw
    )


def test_unrolled_heads_are_bounded():
    """The per-head dq/dk kernels unroll their loop over a program's heads: never more than
    UNROLLED_MAX_HEADS of them (a 64-head group unrolled took minutes to compile), while the
    group kernels' loops take the whole group."""
    assert scalar.heads_per_program(64, 10**6) == scalar.UNROLLED_MAX_HEADS == 4
    assert scalar.heads_per_program(6, 10**6) == 3  # the largest divisor within the bound
    assert scalar.heads_per_program(64, 100) == 4  # 100·16 programs reach 1024
    assert scalar.heads_per_program(64, 10) == 1  # too few programs at any split
    assert scalar.score_heads_per_program(64, 10**6) == 64
