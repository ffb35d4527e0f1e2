"""The packed-sequence tables of the Triton engine (``config.ChunkConfig._pack``): the chunk
rows, each sequence's first chunk and the per-token chunk start and index, against a plain loop
over tokens, for random layouts with empty sequences, sequences of length 1 and lengths that
are and are not multiples of the chunk."""

from __future__ import annotations

import random

import pytest
import torch

from linrnn.engine.config import ChunkConfig


def _loop_tables(offsets, L):
    rows, co, tok_start, tok_chunk = [], [0], [], []
    for n in range(len(offsets) - 1):
        for t in range(offsets[n], offsets[n + 1]):
            if (t - offsets[n]) % L == 0:
                rows.append((t, min(t + L, offsets[n + 1]), n))
            tok_start.append(rows[-1][0])
            tok_chunk.append(len(rows) - 1)
        co.append(len(rows))
    return rows, co, tok_start, tok_chunk


def _layouts(seed):
    rng = random.Random(seed)
    fixed = [[0, 0], [0, 1], [0, 0, 5, 5, 70], [0, 1, 2, 3], [0, 64, 128], [0, 63, 64, 65, 200]]
    drawn = []
    for _ in range(40):
        T = rng.randint(1, 300)
        cuts = sorted(rng.choices(range(T + 1), k=rng.randint(0, 8)))
        drawn.append([0, *cuts, T])
    return fixed + drawn


@pytest.mark.parametrize("L", [5, 16, 64])
def test_pack_tables_match_a_token_loop(L):
    for offsets in _layouts(int(torch.randint(0, 2**31, ()))):  # the per-test seed
        c = ChunkConfig.__new__(ChunkConfig)
        c.L = L
        c._pack(offsets, offsets[-1], "cpu")
        rows, co, tok_start, tok_chunk = _loop_tables(offsets, L)
        N = len(offsets) - 1
        assert (c.N, c.NSEQ, c.NT) == (N, N, max(len(rows), 1)), offsets
        assert c.CHUNKS.dtype == torch.int32 and c.CO.dtype == torch.int32
        assert c.CHUNKS.tolist() == [x for r in (rows or [(0, 0, 0)]) for x in r], offsets
        assert c.CO.tolist() == co, offsets
        assert c.tok_start.tolist() == tok_start and c.tok_chunk.tolist() == tok_chunk, offsets
        assert c.final_slot.tolist() == [co[n + 1] + n for n in range(N)], offsets
