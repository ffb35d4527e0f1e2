"""benchmarks/mode_default.py without a GPU: its sweep covers every cell of the mode=None table
(FUSED_DEFAULT), the route it reports is the ops' own, mode=None's outputs are compared with the
picked mode's, and the timing run refuses a machine without CUDA."""

from __future__ import annotations

import pytest
import torch
from helpers import benchmark_script

from linrnn.bench import registry
from linrnn.engine import config


def test_the_sweep_covers_the_table():
    md = benchmark_script("mode_default")
    shapes = [registry.parse_shape(s) for s in md.SHAPES]
    dims = {(s["K"], s["V"]) for s in shapes}
    walkers = {s["B"] * s["H"] for s in shapes}
    for op, rules in config.FUSED_DEFAULT.items():
        assert any(o.startswith(op) for o in md.OPS), op
        for fewest, pairs in rules.values():
            assert set(pairs) <= dims, (op, pairs)
            # walkers on both sides of every threshold the table uses
            assert min(walkers) < fewest <= max(walkers) and fewest in walkers


def test_route_and_output_check_on_cpu():
    md = benchmark_script("mode_default")
    shape = "B1-T96-H2-K16-V16"
    # on the CPU the PyTorch path serves mode=None: chunk, with or without a gradient
    assert [md.picked("linear_attn", shape, g, device="cpu") for g in (False, True)] == [
        "chunk", "chunk",
    ]  # fmt: skip
    assert md.same_as_picked("retention", shape, ["chunk", "chunk"], device="cpu")


def test_output_check_can_fail(monkeypatch):
    """A mode=None output one ulp off the picked mode's is reported as differing."""
    md = benchmark_script("mode_default")
    real = md.build

    def build(op, shape_id, mode, device="cuda"):
        leaves, fwd = real(op, shape_id, mode, device)
        if mode is not None:
            return leaves, fwd
        return leaves, lambda: torch.nextafter(fwd(), torch.full((), float("inf")))

    monkeypatch.setattr(md, "build", build)
    assert not md.same_as_picked("retention", "B1-T96-H2-K16-V16", ["chunk", "chunk"], "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_needs_cuda(capsys):
    md = benchmark_script("mode_default")
    assert md.main([]) == 2
    assert "CUDA" in capsys.readouterr().err
