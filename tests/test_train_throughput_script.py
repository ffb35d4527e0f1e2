"""Smoke test of benchmarks/train_throughput.py: --tiny on CPU, one worker process per mixer;
a worker that dies is that mixer's status, with what it measured before it died."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_throughput.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_writes_json_and_plot(script, tmp_path, capsys):
    out = tmp_path / "tt.json"
    argv = ["--tiny", "--mixers", "softmax", "mlstm_sig", "--commit", "abc1234", "--out", str(out)]
    assert script.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["finished"] is True
    machine = report["machine"]
    assert set(machine) >= {"gpu", "torch", "triton", "git_commit", "date"}
    assert machine["git_commit"] == "abc1234"
    assert report["config"]["T"] == 64 and report["config"]["backend"] == "torch"
    assert list(report["results"]) == ["softmax", "mlstm_sig"]
    for name, r in report["results"].items():
        assert r["status"] == "ok", r
        assert r["mixer_kwargs"] == ({"input_gate": "sigmoid"} if name == "mlstm_sig" else {})
        assert r["parameters"] > 0 and r["steps"] == 6 and r["first_step_s"] > 0
        assert r["median_step_ms"] > 0 and r["tokens_per_s"] > 0 and r["tokens_per_step"] == 256
        assert len(r["curve"]["loss"]) == len(r["curve"]["time_s"]) == len(r["step_ms"]) == 6
        assert r["curve"]["time_s"][0] == 0.0  # the first step (compilation) is not counted
        assert 3.0 < r["val_loss"] < 6.0 and 3.0 < r["train_loss"] < 6.0
        assert r["evals"][-1]["step"] == 6 and r["evals"][-1]["val"] == r["val_loss"]
        assert r["best_val_loss"] <= r["val_loss"] and r["epochs"] > 0
    if importlib.util.find_spec("matplotlib") is not None:
        assert out.with_suffix(".png").stat().st_size > 1000
    assert not out.with_name("tt-partial").exists()
    printed = capsys.readouterr().out
    assert "vs softmax" in printed and "mlstm_sig" in printed


def test_a_dying_worker_is_recorded(script, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAIN_THROUGHPUT_FAULT", "gla:abort")
    out = tmp_path / "tt.json"
    assert script.main(["--tiny", "--mixers", "gla", "--out", str(out)]) == 1
    r = json.loads(out.read_text())["results"]["gla"]
    assert r["status"].startswith("aborted: signal 6") and "in eval" in r["status"], r
    assert r["steps"] == 6 and r["tokens_per_s"] > 0 and "val_loss" not in r
