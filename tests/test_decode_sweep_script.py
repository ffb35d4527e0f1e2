"""benchmarks/decode_sweep.py on CPU under the interpreter: every candidate runs the real
recurrent kernel with its tile, matches the default tile's output, and the default is restored;
a candidate with a different result fails the run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from linrnn.engine import triton_recurrent as tr

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def _load():
    path = ROOT / "benchmarks" / "decode_sweep.py"
    spec = importlib.util.spec_from_file_location("decode_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["decode_sweep"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_quick_sweep_runs_every_candidate(tmp_path):
    ds = _load()
    before = dict(tr.STEP_TILE)
    out = tmp_path / "sweep.json"
    assert ds.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    assert tr.STEP_TILE == before
    rows = json.loads(out.read_text())["rows"]
    assert {r["op"] for r in rows} == {"gla", "mlstm[exp]"}
    cands = [r for r in rows if r["tile"] != "default"]
    # BV 16 against the default 64 at V = 48: several value tiles (mLSTM: n/m via buffers)
    assert cands and all(r["status"] == "ok" and r["BV"] == 16 for r in cands)
    assert all(r["err"] < 1e-6 and r["ms"] > 0 for r in cands)


def test_a_tile_that_changes_the_result_fails(monkeypatch, tmp_path):
    ds = _load()
    calls = {"n": 0}

    def rel_err(a, b):  # the first candidate of each case "differs"
        calls["n"] += 1
        return 0.5

    monkeypatch.setattr(ds.decode, "rel_err", rel_err)
    assert ds.main(["--device", "cpu", "--quick", "--ops", "gla"]) == 1
    assert calls["n"] > 0


def test_candidates_option(tmp_path):
    """--candidates replaces the grid; each pair is timed at its own warps, and a bad pair is a
    usage error naming it."""
    ds = _load()
    out = tmp_path / "sweep.json"
    argv = ["--device", "cpu", "--quick", "--ops", "gla", "--out", str(out)]
    assert ds.main([*argv, "--candidates", "16,2"]) == 0
    cands = [r for r in json.loads(out.read_text())["rows"] if r["tile"] != "default"]
    assert [(r["BV"], r["warps"], r["status"]) for r in cands] == [(16, 2, "ok")]
    with pytest.raises(SystemExit):
        ds.main([*argv, "--candidates", "24,2"])
