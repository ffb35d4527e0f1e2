"""benchmarks/step_ops.py: a training step's operators and Triton launches, counted on the CPU
(Triton's interpreter runs the kernels)."""

from __future__ import annotations

import json

import pytest
from helpers import benchmark_script


@pytest.mark.interpreter
def test_counts(tmp_path):
    so = benchmark_script("step_ops")
    out = tmp_path / "ops.json"
    assert so.main(["--mixers", "linear_attn", "--seq-len", "8", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["mixer"] == "linear_attn" and row["shape"] == "B1-T8"
    assert row["ops"] == row["views"] + row["kernel_ops"] and row["views"] > 0
    # 6 blocks: per block the linear-attention kernels (a chunk state and an output pass
    # forward, four backward), norm and SwiGLU kernels each way
    assert row["triton_launches"] >= 6 * 8
    # matrix products, each once forward and twice backward (∂x, ∂w), per block: the q, k, v
    # projections one each forward and together backward (bf16 autocast: project), the output
    # projection and the MLP's two; then the LM head
    assert dict(row["top"])["mm"] == 6 * (3 + 2 + 3 * 3) + 3
