"""Smoke test of benchmarks/compile_graphs.py: --quick on CPU (aot_eager, no CUDA graph)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_graphs.py"


def test_quick_run_writes_json(tmp_path):
    spec = importlib.util.spec_from_file_location("compile_graphs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "cg.json"
    argv = ["--quick", "--mixers", "mlstm", "--device", "cpu", "--out", str(out)]
    assert module.main(argv) == 0
    report = json.loads(out.read_text())
    assert set(report["machine"]) >= {"gpu", "torch", "triton", "git_commit", "date"}
    res = report["results"]["mlstm"]
    assert res["training"]["compiled"]["compilations"] == 1
    for b in (1, 3):
        assert res[f"decode_b{b}"]["same_tokens"] is True
        assert res[f"decode_b{b}"]["graph"]["tokens_per_s"] > 0
