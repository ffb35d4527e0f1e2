"""benchmarks/long_context.py on the CPU: a row per op and length with consistent per-token
figures, the table with each length over the shortest, and the JSON."""

from __future__ import annotations

import json

from helpers import benchmark_script


def test_rows_table_and_json(tmp_path, capsys):
    lc = benchmark_script("long_context")
    out = tmp_path / "long.json"
    assert lc.main(["--ops", "simple_gla", "gla", "--lengths", "24", "48", "--heads",
                    "H2-K8-V8", "--iters", "1", "--out", str(out)]) == 0  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [(r["op"], r["T"]) for r in rows] == [
        ("simple_gla", 24), ("simple_gla", 48), ("gla", 24), ("gla", 48)
    ]  # fmt: skip
    for r in rows:
        assert r["shape"] == f"B1-T{r['T']}-H2-K8-V8"
        assert r["ms"] > 0 and r["fwd_ms"] > 0 and r["kernels_ms"] > 0 and r["top"]
        assert abs(r["us_per_token"] - r["ms"] * 1e3 / r["T"]) < 1e-3 * r["us_per_token"]
        assert r["peak_gib"] is None  # no CUDA
    text = capsys.readouterr().out
    assert "simple_gla, one sequence, H2-K8-V8 bf16 (cpu):" in text
    first = [ln.split() for ln in text.splitlines() if ln.strip().startswith("24 ")]
    assert len(first) == 2 and all(cols[3] == "1.000" for cols in first)
    assert "T=48 kernels, µs/token:" in text
