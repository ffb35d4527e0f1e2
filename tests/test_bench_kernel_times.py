"""benchmarks/kernel_times.py on the CPU: rows for a tiny op (the operators' times), JSON that
--compare reads back, and the side-by-side table matching kernels by name."""

from __future__ import annotations

import json

from helpers import benchmark_script


def test_rows_json_and_comparison(tmp_path, capsys):
    kt = benchmark_script("kernel_times")
    out = tmp_path / "now.json"
    assert kt.main(["--ops", "simple_gla", "--shapes", "B1-T32-H2-K16-V16", "--iters", "1",
                    "--out", str(out)]) == 0  # fmt: skip
    (row,) = json.loads(out.read_text())["rows"]
    assert row["op"] == "simple_gla" and row["shape"] == "B1-T32-H2-K16-V16"
    assert row["kernels"] and row["total_ms"] > 0
    assert abs(sum(ms for ms, _ in row["kernels"].values()) - row["total_ms"]) < 1e-2
    # the other file: one kernel slower by 1 s, one missing, one only there
    other = dict(row, kernels=dict(row["kernels"]))
    first, second = list(row["kernels"])[:2]
    other["kernels"][first] = (row["kernels"][first][0] + 1000.0, 1)
    del other["kernels"][second]
    other["kernels"]["only_there_kernel"] = (0.5, 1)
    other["total_ms"] = row["total_ms"] + 1000.5 - row["kernels"][second][0]
    base = tmp_path / "before.json"
    base.write_text(json.dumps({"rows": [other]}))
    capsys.readouterr()
    assert kt.main(["--compare", str(out), str(base)]) == 0
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if ln.startswith("  ") and "this ms" not in ln]
    assert lines[0].split()[-1] == "-1000.000"  # the largest change first
    assert any(ln.split()[0] == "only_there_kernel" and ln.split()[1] == "0.000" for ln in lines)
    assert "simple_gla B1-T32-H2-K16-V16 bf16" in text


def test_peer_rows(tmp_path):
    """A peer's name takes that peer's builder on the op's inputs (SDPA runs on the CPU)."""
    kt = benchmark_script("kernel_times")
    out = tmp_path / "peer.json"
    assert kt.main(["--ops", "torch:sdpa_causal", "--shapes", "B1-T32-H2-K16-V16", "--iters",
                    "1", "--out", str(out)]) == 0  # fmt: skip
    (row,) = json.loads(out.read_text())["rows"]
    assert row["op"] == "torch:sdpa_causal" and row["total_ms"] > 0
    assert any("scaled_dot_product" in name for name in row["kernels"]), row["kernels"]


def test_modes_in_rows_and_comparison(tmp_path, capsys):
    """Each row names its mode; --compare matches rows by mode too (a fused_chunk row is not
    compared with a chunk row of the same op and shape). On the CPU the PyTorch path has no
    fused_chunk: that case is reported and left out, the other rows kept."""
    kt = benchmark_script("kernel_times")
    out = tmp_path / "now.json"
    assert kt.main(["--ops", "linear_attn", "--shapes", "B1-T32-H2-K16-V16", "--iters", "1",
                    "--modes", "chunk", "fused_chunk", "--out", str(out)]) == 0  # fmt: skip
    (row,) = json.loads(out.read_text())["rows"]
    assert row["mode"] == "chunk"
    assert (
        "linear_attn fused_chunk B1-T32-H2-K16-V16: NotImplementedError" in capsys.readouterr().err
    )
    base = tmp_path / "before.json"
    base.write_text(json.dumps({"rows": [dict(row, mode="fused_chunk")]}))
    assert kt.main(["--compare", str(out), str(base)]) == 0
    assert "linear_attn B1-T32-H2-K16-V16: not in the other file" in capsys.readouterr().out
