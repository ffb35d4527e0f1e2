"""Smoke test of benchmarks/gpu_engine.py on CPU: its ``--device cpu --quick`` mode runs as a
subprocess (correctness with the torch backend, a tiny benchmark, no peers), and its worker
handling turns a raise, an abort and a hang into row statuses without stopping the run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_engine.py"


@pytest.fixture(scope="module")
def engine_script():
    spec = importlib.util.spec_from_file_location("gpu_engine", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_engine") / "engine.json"
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--ops", "mlstm[exp]"]
    cmd += ["--chunk-sizes", "32", "--commit", "abc123", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return proc, out


def test_cpu_smoke_exits_zero_and_prints_tables(cpu_run):
    proc, _ = cpu_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "correctness vs fp64" in proc.stdout
    assert "fwd+bwd ms" in proc.stdout and "× floor" in proc.stdout
    assert "issue 3 targets" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("3/3 correctness cases pass")


def test_cpu_smoke_json_schema(cpu_run, engine_script):
    _, out = cpu_run
    report = json.loads(out.read_text())
    assert report["benchmark"] == "gpu_engine"
    assert set(report) >= {"machine", "command", "config", "tolerance", "correctness", "bench",
                           "ratios", "failures", "target_shape", "gpu_spec"}  # fmt: skip
    machine = report["machine"]
    assert machine["git_commit"] == "abc123" and machine["device"] == "cpu"
    assert set(machine) >= {"gpu", "driver", "torch", "triton", "date", "host"}
    assert "--device cpu" in report["command"] and "--quick" in report["command"]
    assert report["failures"] == {"correctness": 0, "linrnn_bench": 0}

    check = report["correctness"]
    assert [(r["op"], r["dtype"]) for r in check] == [
        ("mlstm[exp]", "bf16"),
        ("mlstm[exp]", "fp16"),
        ("mlstm[exp]", "fp32"),
    ]
    for r in check:
        assert r["mode"] == "chunk" and r["backend"] == "torch" and r["status"] == "PASS", r
        assert r["tol"] == engine_script.TOLERANCE[r["dtype"]]
        assert max(r["out_err"], r["state_err"], r["grad_err"]) <= r["tol"]
        # output, the state (C, n, m) and every gradient: q, k, v, gates, initial state
        assert set(r["errors"]) == {"o", "h_T[0]", "h_T[1]", "h_T[2]", "dq", "dk", "dv",
                                    "di", "df", "dh0[0]", "dh0[1]", "dh0[2]"}  # fmt: skip

    bench = report["bench"]
    # no fused_chunk and no peers on CPU
    assert [(r["op"], r["mode"], r["chunk"]) for r in bench] == [("mlstm[exp]", "chunk", 32)]
    for r in bench:
        assert r["status"] == "ok" and r["library"] == "linrnn" and r["dtype"] == "bf16"
        assert r["shape"] == engine_script.CPU_BENCH_SHAPE
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 and r["first_call_s"] > 0
        assert r["peak_fwdbwd_mib"] is None  # no CUDA memory figures on CPU
        assert r["floor_flops"] > 0 and r["floor_bytes"] > 0 and "x_floor" not in r
    assert [e["target"] for e in report["ratios"]] == [t[0] for t in engine_script.TARGETS]
    assert all(e["shape"] == engine_script.CPU_BENCH_SHAPE for e in report["ratios"])


def test_worker_failures_become_statuses(engine_script):
    """A raise fails its item only; an abort and a hang fail theirs, and the items after
    them run in a new worker process."""
    items = [{"do": d} for d in ("ok", "raise", "abort", "sleep", "ok")]
    case = {"task": "selftest", "device": "cpu"}
    rows = engine_script.run_items(case, items, 3, engine_script.worker_env(), False)
    status = [r["status"] for r in rows]
    assert status[0] == status[4] == "ok"
    assert status[1] == "error: RuntimeError: raised on purpose"
    assert status[2].startswith("aborted: signal 6 (SIGABRT) in first forward after")
    assert status[3].startswith("timeout (3 s) in first forward after")
    assert rows[2]["first_call_s_at_least"] >= 0


def test_floor_matches_design_numbers(engine_script):
    """DESIGN.md §4: B=8, T=8192, H=16, K=V=256 bf16 moves ≈ 2.15 GB and costs ≈ 0.31 TFLOP
    at L=64; on an H100 SXM the floor is the bandwidth term, ≈ 0.64 ms."""
    shape = engine_script.parse_shape("B8-T8192-H16-K256-V256")
    n_bytes, flops = engine_script.floor_counts("linear_attn", shape, 64)
    assert n_bytes == 2 * 8 * 8192 * 16 * 4 * 256
    assert flops == pytest.approx(0.309e12, rel=1e-2)
    spec = engine_script.gpu_spec("NVIDIA H100 80GB HBM3")
    assert spec["bandwidth_Bps"] == 3.35e12
    row = {"op": "linear_attn", "shape": "B8-T8192-H16-K256-V256", "chunk": 64, "fwd_ms": 1.28}
    figures = engine_script.floor(row, spec)
    assert figures["floor_ms"] == pytest.approx(1e3 * n_bytes / 3.35e12)
    assert figures["x_floor"] == pytest.approx(1.28 / figures["floor_ms"])
    assert engine_script.gpu_spec("NVIDIA H200")["bandwidth_Bps"] == 4.8e12


def test_vector_ops_only_on_request(engine_script):
    """GLA / RWKV6 and their fla peers join a run with --vector or when --ops names them
    (fla's chunk_gla takes minutes to compile on its first call); the default set is unchanged."""
    sel = engine_script.selected
    assert sel("simple_gla", None) and not sel("gla", None) and not sel("fla:chunk_rwkv6", None)
    assert sel("gla[gv]", None, vector=True) and sel("fla:chunk_gla", None, vector=True)
    assert sel("gla", ["gla"]) and sel("gla[gv]", ["gla[gv]"]) and sel("fla:chunk_rwkv6", ["rwkv6"])
    assert not sel("fla:chunk_gla", ["fla"]) and sel("fla:chunk_simple_gla", ["fla"])


def test_op_name_selects_that_op_alone(engine_script):
    """A name that is an op selects it alone; a family prefix that is no op selects every
    variant. (``--ops gla`` once also ran gla[gv], which spent a GPU call's time.)"""
    sel = engine_script.selected
    for vector in (False, True):
        assert sel("gla", ["gla"], vector) and not sel("gla[gv]", ["gla"], vector)
        assert not sel("linear_attn[normalize]", ["linear_attn"], vector)
        assert all(sel(f"mlstm[{g}]", ["mlstm"], vector) for g in ("exp", "sigmoid"))
    assert sel("mlstm_kernels:triton_xl_chunk_siging[normalize]", ["triton_xl_chunk_siging"])
    assert engine_script.parse_args(["--vector"]).vector
