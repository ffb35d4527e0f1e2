"""Packed calls build their host tables without reading a device value back, and move them to
the device with linrnn._runtime.to_device (on CUDA an asynchronous copy from pinned memory:
a blocking copy would wait for every kernel queued before the call). Meta tensors hold no
values, so building the chunk tables and the per-sequence view there shows that nothing is
read back; the CPU build gives the values."""

from __future__ import annotations

import torch

from linrnn._runtime import to_device
from linrnn.engine.config import ChunkConfig
from linrnn.engine.gate_grads import Seqs

OFFSETS = [0, 5, 5, 12, 13]  # four sequences, the second empty
T = OFFSETS[-1]


def test_to_device_values_and_dtype():
    x = to_device([0, 5, 9], "cpu", torch.int32)
    assert x.dtype == torch.int32 and x.tolist() == [0, 5, 9]
    y = to_device(torch.tensor([3, 1], dtype=torch.int32), "cpu")
    assert y.dtype == torch.int64 and y.tolist() == [3, 1]
    assert to_device([1, 2], "meta").device.type == "meta"


def test_sequence_view_reads_no_device_value():
    H = 3
    meta, cpu = Seqs(OFFSETS, 1, T, H, "meta"), Seqs(OFFSETS, 1, T, H, "cpu")
    assert meta.N == cpu.N == 4 and meta.Lmax == cpu.Lmax == 7
    assert meta.seq.shape == meta.pos.shape == (T,)
    assert cpu.seq.tolist() == [0] * 5 + [2] * 7 + [3]
    assert cpu.pos.tolist() == [*range(5), *range(7), 0]
    assert cpu.last.tolist() == [4, 0, 6, 0]
    assert cpu.nonempty.tolist() == [True, False, True, True]
    y = torch.zeros(4 * H, 7, device="meta")
    meta.add_at_last(y, torch.ones(4 * H, device="meta"))  # no host index, no read-back
    x = torch.arange(H * T, dtype=torch.float32).view(H, T)
    assert torch.equal(cpu.gather(cpu.spread(x)), x)  # spread and gather are inverse


def _config(device):
    q = torch.zeros(1, T, 2, 16, device=device)
    return ChunkConfig(q, q, q, scale=1.0, has_decay=True, has_igate=False, stabilize=False,
                       track_n=False, normalizer=None, eps=0.0, chunk_size=4,
                       offsets=OFFSETS)  # fmt: skip


def test_chunk_tables_read_no_device_value():
    meta, cpu = _config("meta"), _config("cpu")
    for name in ("CO", "CHUNKS", "tok_chunk", "tok_start", "final_slot"):
        assert getattr(meta, name).shape == getattr(cpu, name).shape, name
        assert getattr(meta, name).dtype == getattr(cpu, name).dtype, name
    assert cpu.NT == 5 and cpu.N == 4
    assert cpu.CO.tolist() == [0, 2, 2, 4, 5] and cpu.CO.dtype == torch.int32
    rows = [(0, 4, 0), (4, 5, 0), (5, 9, 2), (9, 12, 2), (12, 13, 3)]
    assert cpu.CHUNKS.view(-1, 3).tolist() == [list(r) for r in rows]
    assert cpu.tok_chunk.tolist() == [0] * 4 + [1] + [2] * 4 + [3] * 3 + [4]
    assert cpu.tok_start.tolist() == [0] * 4 + [4] + [5] * 4 + [9] * 3 + [12]
    assert cpu.final_slot.tolist() == [2, 3, 6, 8]
