"""Smoke test of benchmarks/cpu_chunk_vs_reference.py: --quick in-process, JSON checked."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_chunk_vs_reference.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("cpu_chunk_vs_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_complete_json(bench, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--quick", "-T", "40", "--families", "gla", "mlstm", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"machine", "config", "results"}
    assert set(report["machine"]) >= {"cpu", "cpu_count", "torch", "git_commit", "date"}
    assert report["machine"]["cpu_count"] >= 1
    assert report["config"]["T"] == 40 and report["config"]["quick"] is True

    names = [r["variant"] for r in report["results"]]
    assert names == ["gla", "gla[gv]", "mlstm[exp]", "mlstm[sigmoid]"]
    for r in report["results"]:
        assert set(r["chunk"]) == {"32", "64", "128"}
        times = [r["ref_fwd_ms"], r["ref_fwdbwd_ms"], r["chunk_fwd_ms"], r["chunk_fwdbwd_ms"]]
        times += [t for per_L in r["chunk"].values() for t in (per_L["fwd_ms"], per_L["fwdbwd_ms"])]
        assert all(t > 0 for t in times), r
        for key in ("fwd", "fwdbwd"):
            best = r[f"best_{key}"]
            assert best["chunk_size"] in (32, 64, 128) and best["ms"] > 0
            assert r[f"speedup_{key}"] == pytest.approx(r[f"ref_{key}_ms"] / r[f"chunk_{key}_ms"])
        assert all(per_L["out_err_vs_ref"] < 1e-4 for per_L in r["chunk"].values()), r

    table = capsys.readouterr().out
    assert "speedup fwd+bwd" in table and "mlstm[sigmoid]" in table


def test_unknown_family_is_rejected(bench):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--quick", "--families", "nope"])
    assert exc.value.code == 2
