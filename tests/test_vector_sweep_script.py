"""Smoke test of benchmarks/vector_sweep.py (its real run is one GPU call): the ``--quick`` mode
end to end under TRITON_INTERPRET=1 (profile, candidates, a duplicate skipped, the combined
best, a second chunk size, the JSON), and in process: the built-in candidates are legal, the
clipping that skips duplicates, and a config that fails is recorded with the tiles restored."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "vector_sweep.py"
ROLES = {"rows_kernel[fwd]", "rows_kernel[dq]", "cols_kernel[dk]", "cols_kernel[dv]",
         "states_fwd_kernel", "states_bwd_kernel"}  # fmt: skip


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("vector_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vector_sweep") / "sweep.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--profile", "--ops", "gla_gv", "rwkv6",
           "--chunks", "16", "32", "--gated-bo", "16", "32", "--commit", "abc123",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc, out


def test_quick_run(quick_run):
    proc, out = quick_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "best per kernel" in proc.stdout
    rep = json.loads(out.read_text())
    assert rep["benchmark"] == "vector_sweep" and rep["complete"]
    assert rep["machine"]["git_commit"] == "abc123" and rep["machine"]["torch"]
    assert rep["default_tiles"]["GATED_BO"] == 32

    for prof in rep["profile"]:
        assert prof["chunk"] == 16 and prof["fwdbwd_ms"] > 0, prof
        assert {r["role"] for r in prof["launches"]} == ROLES
        phases = {r["phase"] for r in prof["phases"]}
        assert {"_cumsums", "_forward", "_backward", "_revsum", "other"} <= phases
        assert ("_bonus" in phases) == (prof["op"] == "rwkv6")
        assert prof["kernels"], prof.get("kernels_error")
    assert [p["op"] for p in rep["profile"]] == ["gla_gv", "rwkv6"]

    for op in ("gla_gv", "rwkv6"):
        rows = [(r["chunk"], r["kernel"], r.get("tiles")) for r in rep["sweep"] if r["op"] == op]
        assert rows == [
            (16, "default", None),
            (16, "rows", [16, 16, 16, 32, 4, 1]),
            (16, "states", [16, 32, 16, 4, 1]),
            (16, "cols", [16, 16, 16, 32, 4, 1]),
            (16, "gated_bo", [16]),
            (16, "gated_bo", [32]),  # the default: skipped
            (16, "combined", None),
            (32, "default", None),
            (32, "combined", None),
        ]
    by = {(r["op"], r["chunk"], r["kernel"], str(r.get("tiles"))): r for r in rep["sweep"]}
    for key, r in by.items():
        if key[2] == "gated_bo" and r["tiles"] == [32]:
            assert r["status"] == "skipped: same tiles as default after clipping"
            continue
        assert r["status"] == "ok", r
        assert r["fwdbwd_ms"] > 0 and r["first_call_s"] > 0
        backward_only = key[2] == "cols" or (key[2] == "gated_bo" and key[0] == "rwkv6")
        assert (r.get("fwd_ms") is None) == backward_only  # no forward timing then
        if key[2] != "default":
            assert r["max_rel_err"] <= rep["tolerance"] and r["fwdbwd_vs_default"] > 0
    # the candidates reached the kernels (after clipping)
    seen = lambda op, k, t, role: by[(op, 16, k, str(t))]["launches"][role]  # noqa: E731
    assert seen("rwkv6", "rows", [16, 16, 16, 32, 4, 1], "rows_kernel[fwd]")["BD"] == 16
    assert seen("rwkv6", "rows", [16, 16, 16, 32, 4, 1], "rows_kernel[dq]")["num_stages"] == 1
    assert seen("rwkv6", "states", [16, 32, 16, 4, 1], "states_bwd_kernel")["BV"] == 16
    assert seen("gla_gv", "gated_bo", [16], "rows_kernel[fwd]")["BO"] == 16  # gv: gated V
    assert seen("gla_gv", "gated_bo", [16], "cols_kernel[dk]")["BO"] == 16
    assert seen("gla_gv", "default", None, "rows_kernel[dq]")["BO"] == 32
    combined = by[("gla_gv", 16, "combined", "None")]
    assert combined["vec_tiles"]["rows"] == [16, 16, 16, 32, 4, 1] and combined["gated_bo"] == 16
    assert combined["launches"]["cols_kernel[dv]"]["BO"] == 16
    assert {b["op"] for b in rep["best"]} == {"gla_gv", "rwkv6"}
    assert set(rep["best"][0]["chunks"]["16"]["kernels"]) == {"rows", "states", "cols", "gated_bo"}


def test_builtin_candidates_are_legal(sweep):
    for table in (sweep.CANDIDATES, sweep.QUICK_CANDIDATES):
        for kernel, cands in table.items():
            for t in cands:
                assert sweep.candidate_problem(kernel, t) is None, (kernel, t)
    bad = [("rows", (8, 64, 32, 64, 4, 2)), ("cols", (16, 64, 48, 64, 4, 2)),
           ("states", (64, 64, 4, 2)), ("fused", (16, 32, 32, 0, 4, 1)),
           ("gated_bo", (24,)), ("rows", (16, 64, 32, 64, 3, 2))]  # fmt: skip
    for kernel, t in bad:
        assert sweep.candidate_problem(kernel, t), (kernel, t)
    with pytest.raises(SystemExit):
        sweep.parse_args(["--rows", "16,64,32"])
    args = sweep.parse_args(["--rows", "16,64,32,256,8,2", "--cols", "--gated-bo", "64,8"])
    assert args.candidates["rows"] == [(16, 64, 32, 256, 8, 2)] and args.candidates["cols"] == []
    assert args.candidates["gated_bo"] == [(64, 8)] and args.dtype == "bf16" and args.tol == 1e-2


def test_clipping_finds_duplicates(sweep):
    tiles, bo = sweep.defaults()
    key = lambda t, b, shape, gv=False, L=64: sweep.effective(  # noqa: E731
        t, b, "chunk", sweep.parse_shape(shape), L, gv
    )
    gla, rwkv = "B8-T8192-H16-K256-V256", "B8-T8192-H64-K64-V64"
    wide = sweep.apply("rows", (16, 64, 32, 256, 4, 2), tiles, bo)
    assert key(*wide, rwkv) == key(tiles, bo, rwkv)  # BO 256 clips to V = 64
    assert key(*wide, gla) != key(tiles, bo, gla)
    assert key(*wide, gla, gv=True) == key(tiles, bo, gla, gv=True)  # gv: rows' BO unused
    bs128 = sweep.apply("rows", (16, 128, 32, 64, 4, 2), tiles, bo)
    assert key(*bs128, gla, L=64) == key(tiles, bo, gla, L=64)
    assert key(*bs128, gla, L=128) != key(tiles, bo, gla, L=128)
    warps = sweep.apply("gated_bo", (64, 8), tiles, bo)
    assert warps[1] == 64 and warps[0]["rows"][4] == 8 and warps[0]["cols"][4] == 8
    assert warps[0]["states"] == tiles["states"]


def test_failing_config_is_recorded_and_tiles_restored(sweep):
    args = sweep.parse_args(["--quick"])
    device = torch.device("cpu")
    unit = {"op": "gla", "shape": "B1-T20-H1-K16-V16", "mode": "chunk", "chunk": 16}
    x = sweep.make_inputs("gla", sweep.parse_shape(unit["shape"]), torch.float32, device, 0)
    do = torch.randn_like(x["v"])
    tiles, bo = sweep.defaults()
    row, ref = sweep.measure(args, unit, x, do, None, tiles, bo, False, device)
    assert row["status"] == "ok" and set(ref) == {"o", "dq", "dk", "dv", "dg"}
    bad = sweep.apply("rows", (24, 64, 32, 64, 4, 2), tiles, bo)  # BC not a power of two
    row, out = sweep.measure(args, unit, x, do, ref, *bad, False, device)
    assert row["status"].startswith("error: ") and "power of 2" in row["status"] and out is None
    assert sweep.defaults() == (tiles, bo)
