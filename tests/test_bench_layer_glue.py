"""benchmarks/layer_glue.py on the CPU: a row per kind and width, the JSON; and with the Triton
pass (the interpreter) beside the PyTorch form, the memory each keeps for the backward."""

from __future__ import annotations

import json

import pytest
from helpers import benchmark_script


def test_rows_and_json(tmp_path, capsys):
    ng = benchmark_script("layer_glue")
    out = tmp_path / "ng.json"
    assert ng.main(["--tokens", "32", "--kinds", "rms+silu", "conv+bias", "token mix",
                    "--out", str(out)]) == 0  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kind"], r["heads"]) for r in rows] == [
        (kind, heads) for heads in (4, 16) for kind in ("rms+silu", "conv+bias", "token mix")
    ]
    assert all(r["ms"] > 0 and r["fwd_ms"] > 0 and r["saved_mib"] > 0 for r in rows)
    assert "H16x128 rms+silu" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["triton"])
def test_fused_pass_keeps_less_for_the_backward(backend, monkeypatch):
    """The PyTorch form keeps fp32 copies of its [tokens, H·D] intermediates; the Triton pass
    keeps its bf16 inputs and one fp32 number per row (per row also the mean for LayerNorm)."""
    ng = benchmark_script("layer_glue")
    # Each timed pass (forward, forward+backward) runs once: the CPU times are not checked here
    # (test_rows_and_json checks the timer's rows), the saved bytes are.
    monkeypatch.setattr(ng, "_timer", lambda device: lambda fn: (fn(), 1.0)[1])
    tokens, heads, dim = 128, 4, 128  # (enough tokens for the weights not to count)
    for kind in ("rms+silu", "layer+sigmoid", "gate-first", "conv"):
        torch_row, fused_row = ng.measure(kind, tokens, heads, dim, "cpu", ("torch", backend))
        inputs = (1 if kind == "conv" else 2) * tokens * heads * dim * 2 / 2**20  # bf16 x, gate
        assert fused_row["saved_mib"] < inputs * 1.1, kind
        assert torch_row["saved_mib"] > 1.9 * fused_row["saved_mib"], kind
    # SwiGLU: the Triton pass keeps the packed projection alone, PyTorch also SiLU's output
    torch_row, fused_row = ng.measure("swiglu", 32, heads, dim, "cpu", ("torch", backend))
    projection = 32 * 2 * 1376 * 2 / 2**20  # bf16 [32 tokens, 2·hidden], hidden 8/3 of 512
    assert projection * 0.99 < fused_row["saved_mib"] < projection * 1.01
    assert torch_row["saved_mib"] > 1.45 * fused_row["saved_mib"]
