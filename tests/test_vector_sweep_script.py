"""Smoke test of benchmarks/vector_sweep.py (its real run is one GPU call): the ``--quick`` mode
end to end under TRITON_INTERPRET=1, twice: with the profile, the tile candidates, a duplicate
skipped, SCORES skipped (no effect with gv), the combined best and a second chunk size (GLA
with gv), and with the other DIAG_LOOP form then SCORES adopted as the base and the candidates
that come with them (RWKV6; its profile with SCORES off and on). In process: the built-in
candidates are legal, the clipping that skips duplicates, and a config that fails is recorded
with the engine's config restored."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from linrnn.engine import triton_chunk_vec as tcv

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "vector_sweep.py"
ROLES = {"rows_kernel[fwd]", "rows_kernel[dq]", "cols_kernel[dk]", "cols_kernel[dv]",
         "decay_grad_kernel",
         "states_fwd_kernel", "states_bwd_kernel"}  # fmt: skip
SCORES_ROLES = {"scores_kernel", "scores_kernel[dP]", "apply_kernel[fwd]", "apply_kernel[dv]",
                "decay_grad_kernel",
                "rows_kernel[dq]", "cols_kernel[dk]", "states_fwd_kernel",
                "states_bwd_kernel"}  # fmt: skip


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("vector_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quick(tmp_path_factory, *extra):
    out = tmp_path_factory.mktemp("vector_sweep") / "sweep.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(SCRIPT), "--quick", *extra, "--commit", "abc123", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "best per kernel" in proc.stdout
    rep = json.loads(out.read_text())
    assert rep["benchmark"] == "vector_sweep" and rep["complete"]
    assert rep["machine"]["git_commit"] == "abc123" and rep["machine"]["torch"]
    return rep


def test_quick_run(tmp_path_factory):
    rep = quick(tmp_path_factory, "--profile", "--ops", "gla_gv", "--chunks", "16", "32",
                "--gated-bo", "16", str(tcv.GATED_BO), "--adopt-below", "0",
                "--base-scores", "0")  # fmt: skip
    default = rep["default_config"]
    # The engine's defaults (the interpreter keeps the block diagonal: triton_chunk_vec)
    assert default["GATED_BO"] == tcv.GATED_BO and default["DIAG_LOOP"] is False
    assert default["SCORES"] is False  # --base-scores 0
    assert default["SCORE_TILES"]["apply"] == list(tcv.SCORE_TILES["apply"])

    (prof,) = rep["profile"]  # --profile-scores both: no effect with gv, one profile
    assert prof["chunk"] == 16 and prof["fwdbwd_ms"] > 0 and prof["diag_loop"] is False
    assert prof["scores"] is None
    assert {r["role"] for r in prof["launches"]} == ROLES
    assert {r["phase"] for r in prof["phases"]} == {"_cumsums", "_forward", "_backward",
                                                     "_decay_grad", "_revsum",
                                                     "other"}  # fmt: skip
    assert prof["kernels"], prof.get("kernels_error")

    rows = [(r["chunk"], r["kernel"], r.get("tiles")) for r in rep["sweep"]]
    assert rows == [
        (16, "default", None),
        (16, "diag_loop", [1]),  # slower: not adopted (--adopt-below 0)
        (16, "scores", [1]),  # no effect with gv: skipped
        (16, "walk_unroll", [1]),  # the base has no walk: skipped
        (16, "split_inter", [1 - int(tcv.SPLIT_INTER)]),  # no stored scores with gv: skipped
        (16, "diag_span", [1 - int(bool(tcv.DIAG_SPAN))]),  # the diagonal's other form
        (16, "fast_chunks", [1 - int(tcv.FAST_CHUNKS)]),  # no fast chunks with gv: same
        (16, "skip_sub_chunks", [1 - int(tcv.SKIP_SUB_CHUNKS)]),  # no fast chunks with gv
        (16, "pre_gate", [1 - int(tcv.PRE_GATE)]),  # gk-only calls: same with gv
        (16, "rows", [16, 16, 16, 32, 4, 1]),
        (16, "states", [16, 32, 16, 4, 1]),
        (16, "cols", [16, 16, 16, 32, 4, 1]),
        (16, "gated_bo", [16]),
        (16, "gated_bo", [tcv.GATED_BO]),  # the default: skipped
        (16, "combined", None),  # --quick combines every kernel's best (not DIAG_LOOP)
        (32, "default", None),
        (32, "combined", None),
    ]
    by = {(r["chunk"], r["kernel"], str(r.get("tiles"))): r for r in rep["sweep"]}
    for (_, kernel, tiles), r in by.items():
        # the default GATED_BO, and FAST_CHUNKS, SKIP_SUB_CHUNKS and PRE_GATE with gv (no fast
        # chunks, no stored scores there): the same kernels
        same = ("fast_chunks", "skip_sub_chunks", "pre_gate")
        if (kernel == "gated_bo" and tiles == f"[{tcv.GATED_BO}]") or kernel in same:
            assert r["status"] == "skipped: same as default", r
            continue
        if kernel == "scores":
            assert r["status"] == "skipped: SCORES has no effect with gv (gk-only calls)"
            continue
        if kernel == "walk_unroll":
            assert r["status"] == "skipped: WALK_UNROLL needs the walk (DIAG_LOOP) in the base"
            continue
        if kernel == "split_inter":
            why = "skipped: SPLIT_INTER needs the stored scores (SCORES, gk only, chunk)"
            assert r["status"] == why
            continue
        assert r["status"] == "ok", r
        assert r["fwdbwd_ms"] > 0 and r["first_call_s"] > 0
        assert (r.get("fwd_ms") is None) == (kernel == "cols")  # backward only
        if kernel != "default":
            assert r["max_rel_err"] <= rep["tolerance"] and r["fwdbwd_vs_default"] > 0
            assert "fwdbwd_vs_base" not in r
    # the candidates reached the kernels (after clipping)
    seen = lambda k, t, role: by[(16, k, str(t))]["launches"][role]  # noqa: E731
    assert seen("rows", [16, 16, 16, 32, 4, 1], "rows_kernel[fwd]")["BD"] == 16
    assert seen("rows", [16, 16, 16, 32, 4, 1], "rows_kernel[dq]")["num_stages"] == 1
    assert seen("states", [16, 32, 16, 4, 1], "states_bwd_kernel")["BV"] == 16
    assert seen("gated_bo", [16], "rows_kernel[fwd]")["BO"] == 16  # gv: the gated V tile
    assert seen("gated_bo", [16], "cols_kernel[dk]")["BO"] == 16
    assert seen("default", None, "rows_kernel[dq]")["BO"] == 32
    combined = by[(16, "combined", "None")]["config"]
    assert combined["VEC_TILES"]["rows"] == [16, 16, 16, 32, 4, 1]
    assert combined["GATED_BO"] == 16 and combined["DIAG_LOOP"] is False
    assert by[(16, "combined", "None")]["launches"]["cols_kernel[dv]"]["BO"] == 16
    assert by[(32, "combined", "None")]["config"] == combined
    (best,) = rep["best"]
    assert set(best["chunks"]["16"]["kernels"]) == {"diag_loop", "diag_span", "rows", "states",
                                                     "cols", "gated_bo"}  # fmt: skip
    assert "base" not in best["chunks"]["16"]


def test_quick_run_adopts_switches(tmp_path_factory):
    """RWKV6: the profile with SCORES off and on; DIAG_LOOP, SCORES then SPLIT_INTER adopted
    (--quick adopts always), then the candidates that come with them: rows' BC 32 (the walk)
    and SCORE_TILES'."""
    rep = quick(tmp_path_factory, "--profile", "--ops", "rwkv6", "--chunks", "16", "--kernels",
                "diag_loop", "scores", "split_inter", "rows", "score_tiles", "apply_tiles",
                "--base-diag-loop", "0", "--base-scores", "0",
                "--base-split-inter", "0")  # fmt: skip
    profs = [(p["diag_loop"], p["scores"]) for p in rep["profile"]]
    assert profs == [(False, False), (False, True)]
    assert {r["role"] for r in rep["profile"][0]["launches"]} == ROLES
    on = {r["role"]: r["tiles"] for r in rep["profile"][1]["launches"]}
    assert set(on) == SCORES_ROLES and on["apply_kernel[fwd]"]["BQ"] == 16  # 64 clipped to L

    rows = [(r["kernel"], r.get("tiles"), r["status"]) for r in rep["sweep"]]
    assert rows == [
        ("default", None, "ok"),
        ("diag_loop", [1], "ok"),  # the base from here on
        ("scores", [1], "ok"),  # the base from here on (with DIAG_LOOP)
        ("split_inter", [1], "ok"),  # needs SCORES in the base; the base from here on
        ("rows", [32, 16, 16, 32, 4, 1], "ok"),  # with the walk only: BC 32
        ("score_tiles", [16, 16, 16, 4, 1], "ok"),  # with SCORES only
        ("apply_tiles", [16, 16, 16, 32, 4, 1], "ok"),
        ("rows", [16, 16, 16, 32, 4, 1], "ok"),
        ("combined", None, "ok"),
    ]
    loop, scores, split, *rest = rep["sweep"][1:]
    assert loop["config"]["DIAG_LOOP"] is True and "fwdbwd_vs_base" not in loop
    assert loop["config"]["SCORES"] is False and "scores_kernel" not in loop["launches"]
    assert scores["config"]["SCORES"] is True and scores["fwdbwd_vs_base"] > 0
    assert "rows_kernel[fwd]" not in scores["launches"] and "scores_kernel" in scores["launches"]
    assert split["config"]["SPLIT_INTER"] is True and "apply_kernel[inter dk]" in split["launches"]
    assert split["launches"]["apply_kernel[inter dq]"]["BQ"] == 16  # 64 clipped to L
    assert "apply_kernel[inter dq]" not in scores["launches"]
    for r in rest:
        assert r["config"]["DIAG_LOOP"] is True and r["config"]["SCORES"] is True
        assert r["config"]["SPLIT_INTER"] is True and r["fwdbwd_vs_base"] > 0
    assert rest[0]["launches"]["rows_kernel[dq]"]["BQ"] == 32
    assert rest[0]["launches"]["cols_kernel[dk]"]["BS"] == 16  # cols kept the default
    assert "fwd_ms" not in rest[0]  # rows: dq only with SCORES
    assert rest[1]["config"]["SCORE_TILES"]["scores"] == [16, 16, 16, 4, 1]
    assert rest[1]["launches"]["scores_kernel"]["BD"] == 16
    assert rest[1]["launches"]["apply_kernel[fwd]"]["BD"] == 32  # apply kept the default
    assert rest[2]["launches"]["apply_kernel[dv]"]["num_stages"] == 1
    tiles = rest[-1]["config"]["SCORE_TILES"]  # combined
    assert tiles == {"scores": [16, 16, 16, 4, 1], "apply": [16, 16, 16, 32, 4, 1],
                     "dscores": list(tcv.SCORE_TILES["dscores"]),
                     "inter": list(tcv.SCORE_TILES["inter"]),
                     "fast": list(tcv.SCORE_TILES["fast"])}  # fmt: skip
    base = rep["best"][0]["chunks"]["16"]["base"]
    assert base["adopted"] == "diag_loop+scores+split_inter"
    assert base["SCORES"] is True and base["SPLIT_INTER"] is True


def test_builtin_candidates_are_legal(sweep):
    tables = (sweep.CANDIDATES, sweep.QUICK_CANDIDATES, sweep.LOOP_ONLY, sweep.QUICK_LOOP_ONLY)
    for table in tables:
        for kernel, cands in table.items():
            for t in cands:
                assert sweep.candidate_problem(kernel, t) is None, (kernel, t)
    bad = [("rows", (8, 64, 32, 64, 4, 2)), ("cols", (16, 64, 48, 64, 4, 2)),
           ("states", (64, 64, 4, 2)), ("fused", (16, 32, 32, 0, 4, 1)),
           ("gated_bo", (24,)), ("rows", (16, 64, 32, 64, 3, 2)), ("diag_loop", (2,)),
           ("scores", (2,)), ("score_tiles", (24, 64, 32, 4, 2)),
           ("apply_tiles", (64, 64, 32, 64, 4))]  # fmt: skip
    for kernel, t in bad:
        assert sweep.candidate_problem(kernel, t), (kernel, t)
    with pytest.raises(SystemExit):
        sweep.parse_args(["--rows", "16,64,32"])
    args = sweep.parse_args(["--rows", "16,64,32,256,8,2", "--cols", "--gated-bo", "64,8"])
    assert args.candidates["rows"] == [(16, 64, 32, 256, 8, 2)] and args.candidates["cols"] == []
    assert args.candidates["gated_bo"] == [(64, 8)] and args.dtype == "bf16" and args.tol == 1e-2
    assert args.candidates["diag_loop"] == [(1,)] and args.loop_candidates["rows"] == []
    assert (
        args.loop_candidates["cols"] == []
        and args.candidates["states"] == sweep.CANDIDATES["states"]
    )
    assert sweep.parse_args(["--base-diag-loop", "1"]).candidates["diag_loop"] == [(0,)]
    assert args.candidates["scores"] == [(1 - int(tcv.SCORES),)] and args.adopt_below == 0.99
    assert args.loop_candidates["score_tiles"] == sweep.LOOP_ONLY["score_tiles"]
    args = sweep.parse_args(["--apply-tiles", "128,64,32,128,8,2", "--score-tiles"])
    assert args.candidates["apply_tiles"] == [(128, 64, 32, 128, 8, 2)]
    assert args.candidates["score_tiles"] == [] and args.profile_scores == "both"
    args = sweep.parse_args(["--inter-tiles", "64,32,64,8,2", "--fast-tiles", "64,64,64,4,2"])
    assert args.candidates["inter_tiles"] == [(64, 32, 64, 8, 2)]
    assert args.candidates["fast_tiles"] == [(64, 64, 64, 4, 2)]


def test_clipping_finds_duplicates(sweep):
    cfg = dict(sweep.current(), SCORES=False)  # the row-program form, then SCORES applied
    key = lambda c, shape, gv=False, L=64: sweep.effective(  # noqa: E731
        c, "chunk", sweep.parse_shape(shape), L, gv
    )
    gla, rwkv = "B8-T8192-H16-K256-V256", "B8-T8192-H64-K64-V64"
    wide = sweep.apply("rows", (16, 64, 32, 256, 4, 2), cfg)
    assert key(wide, rwkv) == key(cfg, rwkv)  # BO 256 clips to V = 64
    assert key(wide, gla) != key(cfg, gla)
    assert key(wide, gla, gv=True) == key(cfg, gla, gv=True)  # gv: rows' BO unused
    bs128 = sweep.apply("rows", (16, 128, 32, 64, 4, 2), cfg)
    assert key(bs128, gla, L=64) == key(cfg, gla, L=64)
    assert key(bs128, gla, L=128) != key(cfg, gla, L=128)
    warps = sweep.apply("gated_bo", (64, 8), cfg)
    assert warps["GATED_BO"] == 64 and warps["VEC_TILES"]["rows"][4] == 8
    assert (
        warps["VEC_TILES"]["cols"][4] == 8
        and warps["VEC_TILES"]["states"] == cfg["VEC_TILES"]["states"]
    )
    states = sweep.apply("states", (64, 64, 64, 4, 2), cfg)  # the gk-only and the gv tile
    assert states["VEC_TILES"]["states"] == states["VEC_TILES"]["states_gv"] == (64, 64, 64, 4, 2)
    assert key(states, gla, gv=True) != key(cfg, gla, gv=True)
    loop = sweep.apply("diag_loop", (1,), cfg)
    assert loop["DIAG_LOOP"] is True and key(loop, gla) != key(cfg, gla)
    unrolled = sweep.apply("walk_unroll", (1,), loop)
    assert unrolled["WALK_UNROLL"] is True and key(unrolled, gla) != key(loop, gla)
    assert key(sweep.apply("walk_unroll", (1,), cfg), gla) == key(cfg, gla)  # no walk: same
    with sweep.using(unrolled):
        assert tcv.DIAG_LOOP is True and tcv.WALK_UNROLL is True and tcv._walk_form() == 2
    stored = sweep.apply("scores", (1,), cfg)
    assert key(stored, gla) != key(cfg, gla) and key(stored, gla, gv=True) == key(cfg, gla, True)
    assert key(sweep.apply("rows", (16, 64, 32, 256, 4, 2), stored), gla) == key(stored, gla)
    bq128 = (128, *tcv.SCORE_TILES["apply"][1:])  # the default's tile but for BQ
    tiles = sweep.apply("apply_tiles", bq128, cfg)
    assert key(tiles, gla) == key(cfg, gla)  # SCORES off: SCORE_TILES unused
    tiles = sweep.apply("apply_tiles", bq128, stored)
    assert key(tiles, gla, L=64) == key(stored, gla, L=64)  # BQ clips to L = 64
    assert key(tiles, gla, L=128) != key(stored, gla, L=128)
    # the fast chunks' tiles: only with SPLIT_INTER (inter) / FAST_CHUNKS (fast) in the base
    split = dict(stored, SPLIT_INTER=True, FAST_CHUNKS=True)
    inter = sweep.apply("inter_tiles", (64, 32, 64, 8, 2), split)
    assert inter["SCORE_TILES"]["inter"] == (64, 32, 64, 8, 2)
    assert key(inter, gla) != key(split, gla)
    no_split = dict(split, SPLIT_INTER=False)
    assert key(sweep.apply("inter_tiles", (64, 32, 64, 8, 2), no_split), gla) == key(no_split, gla)
    fast = sweep.apply("fast_tiles", (64, 64, 64, 4, 2), split)
    assert fast["SCORE_TILES"]["fast"] == (64, 64, 64, 4, 2) and key(fast, gla) != key(split, gla)
    no_fast = dict(split, FAST_CHUNKS=False)
    assert key(sweep.apply("fast_tiles", (64, 64, 64, 4, 2), no_fast), gla) == key(no_fast, gla)
    assert cfg == dict(sweep.current(), SCORES=False)  # apply copies


def test_failing_config_is_recorded_and_tiles_restored(sweep, monkeypatch):
    args = sweep.parse_args(["--quick"])
    device = torch.device("cpu")
    unit = {"op": "gla", "shape": "B1-T20-H1-K16-V16", "mode": "chunk", "chunk": 16}
    x = sweep.make_inputs("gla", sweep.parse_shape(unit["shape"]), torch.float32, device, 0)
    do = torch.randn_like(x["v"])
    monkeypatch.setattr(tcv, "SCORES", False)  # the row-program form: rows' tiles in the fwd
    cfg = sweep.current()
    row, ref = sweep.measure(args, unit, x, do, None, cfg, False, device)
    assert row["status"] == "ok" and set(ref) == {"o", "dq", "dk", "dv", "dg"}
    bad = sweep.apply("rows", (24, 64, 32, 64, 4, 2), cfg)  # BC not a power of two
    bad["DIAG_LOOP"] = True
    row, out = sweep.measure(args, unit, x, do, ref, bad, False, device)
    assert row["status"].startswith("error: ") and "power of 2" in row["status"] and out is None
    assert sweep.current() == cfg
    bad = sweep.apply("score_tiles", (24, 64, 32, 4, 2), dict(cfg, SCORES=True))
    row, out = sweep.measure(args, unit, x, do, ref, bad, False, device)
    assert row["status"].startswith("error: ") and "power of 2" in row["status"] and out is None
    assert sweep.current() == cfg
