"""scripts/gpu_runbook.sh's check and paper-rows stages, with a stand-in python3 that logs its
arguments (no GPU, nothing run)."""

from __future__ import annotations

import subprocess

from linrnn.bench import worker

SCRIPT = worker.ROOT / "scripts" / "gpu_runbook.sh"


def stage(tmp_path, *argv, env=None) -> tuple[list[list[str]], subprocess.CompletedProcess]:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    # One write per call: the check stage runs several python3 processes at once.
    fake.write_text(f'#!/bin/sh\nline=$(for a in "$@"; do printf "%s\\037" "$a"; done)\n'
                    f'printf "%s\\n" "$line" >>"{log}"\n')  # fmt: skip
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"),
           "LINRNN_COMMIT": "abc", **(env or {})}  # fmt: skip
    res = subprocess.run(["bash", str(SCRIPT), *argv], capture_output=True, text=True, env=env,
                         timeout=60, cwd=tmp_path)  # fmt: skip
    calls = [c.split("\037")[:-1] for c in log.read_text().splitlines()] if log.exists() else []
    return calls, res


def test_check_runs_tests_gpu_and_every_kernel_test_file(tmp_path):
    calls, res = stage(tmp_path, "check")
    assert res.returncode == 0, res.stderr
    pytest_calls = [c for c in calls if c[:2] == ["-m", "pytest"]]
    kernel_tests = {f"tests/{p.name}" for p in (worker.ROOT / "tests").glob("test_triton_*.py")}
    others = {"tests/test_hardening_numerics.py", "tests/test_mamba2_group_scores.py"}
    assert kernel_tests and _targets(pytest_calls) == {"tests/gpu", *kernel_tests, *others}
    # the kernel test files in one pytest, over xdist workers
    (files,) = [c for c in pytest_calls if "tests/gpu" not in c]
    assert "-n" in files


def test_check_parts_run_alone(tmp_path):
    kernel_tests = {f"tests/{p.name}" for p in (worker.ROOT / "tests").glob("test_triton_*.py")}
    kernel_tests |= {"tests/test_hardening_numerics.py", "tests/test_mamba2_group_scores.py"}
    for part, want in (("matrix", {"tests/gpu"}), ("kernels", kernel_tests)):
        log = tmp_path / "calls"
        log.unlink(missing_ok=True)
        calls, res = stage(tmp_path, "check", part)
        assert res.returncode == 0, res.stderr
        pytest_calls = [c for c in calls if c[:2] == ["-m", "pytest"]]
        assert _targets(pytest_calls) == want


def _targets(pytest_calls) -> set:
    """The test paths the logged pytest calls name."""
    return {a for c in pytest_calls for a in c if a.startswith("tests")}


def test_check_matrix_takes_a_selection(tmp_path):
    """`check matrix EXPR` hands EXPR to pytest's -k, as one argument (spaces and parentheses
    kept), and runs no kernel test file."""
    expr = "not (matches_fp64 and (gla or rwkv6))"
    calls, res = stage(tmp_path, "check", "matrix", expr)
    assert res.returncode == 0, res.stderr
    (call,) = [c for c in calls if c[:2] == ["-m", "pytest"]]
    assert call[2] == "tests/gpu" and call[call.index("-k") + 1] == expr


def test_paper_rows_times_the_linrnn_chunk_rows_of_both_checkouts(tmp_path):
    other = tmp_path / "base"
    other.mkdir()
    calls, res = stage(tmp_path, "paper-rows", str(other))
    assert res.returncode == 0, res.stderr
    bench = [c for c in calls if c[:2] == ["-m", "linrnn.bench"]]
    assert len(bench) == 2
    for call in bench:
        assert call[call.index("--suite") + 1] == "paper"
        assert call[call.index("--ops") + 1] == "linrnn"
        assert call[call.index("--modes") + 1] == "chunk"
    outs = [c[c.index("--out") + 1] for c in bench]
    assert outs[0].endswith("paper-rows.json") and outs[1].endswith("paper-rows-other.json")
    assert any(c[:1] == ["-"] for c in calls)  # the comparison reads both reports


def test_kernels_profiles_both_checkouts_with_this_trees_script(tmp_path):
    other = tmp_path / "base"
    other.mkdir()
    calls, res = stage(tmp_path, "kernels", str(other))
    assert res.returncode == 0, res.stderr
    script = str(worker.ROOT / "benchmarks" / "kernel_times.py")
    runs = [c for c in calls if c[:1] == [script] and "--out" in c]
    assert len(runs) == 2
    assert {c[c.index("--out") + 1].rsplit("/", 1)[1] for c in runs} == {
        "kernels.json", "kernels-other.json"}  # fmt: skip
    assert all("gla[gv]" in c and "B8-T8192-H32-K128-V128" in c for c in runs)
    assert any("--compare" in c for c in calls)


def test_glue_times_the_layer_glue(tmp_path):
    calls, res = stage(tmp_path, "glue")
    assert res.returncode == 0, res.stderr
    (run,) = [c for c in calls if c[:1] == ["benchmarks/layer_glue.py"]]
    assert run[run.index("--out") + 1] == str(tmp_path / "out" / "glue.json")


def test_unknown_stage_exits_2(tmp_path):
    _, res = stage(tmp_path, "bogus")
    assert res.returncode == 2 and "unknown stage" in res.stderr


def test_train_profile_takes_a_length_and_mixers(tmp_path):
    calls, res = stage(tmp_path, "train-profile", "2048", "gla", "rwkv6")
    assert res.returncode == 0, res.stderr
    (call,) = [c for c in calls if c and c[0].endswith("train_profile.py")]
    assert call[call.index("--seq-len") + 1] == "2048"
    assert call[call.index("--mixers") + 1 :][:2] == ["gla", "rwkv6"]
    assert call[-1].endswith("train-profile-T2048.json")
    assert "--cuda-graph" not in call
    calls, res = stage(tmp_path, "train-profile", env={"TRAIN_GRAPH": "1"})
    assert "--cuda-graph" in [c for c in calls if c and c[0].endswith("train_profile.py")][-1]
    calls, res = stage(tmp_path, "train-profile")
    call = [c for c in calls if c and c[0].endswith("train_profile.py")][-1]
    assert "--mixers" not in call and call[call.index("--seq-len") + 1] == "8192"


def test_mode_default_runs_two_passes(tmp_path):
    """The mode-default stage compiles, then times the sweep twice, the second pass in reverse
    shape order, each into its own JSON; OP... narrows every call to those ops."""
    calls, res = stage(tmp_path, "mode-default", "retention", "linear_attn")
    assert res.returncode == 0, res.stderr
    runs = [c for c in calls if c and c[0] == "benchmarks/mode_default.py"]
    assert len(runs) == 3 and "--warm" in runs[0]
    for call in runs:
        i = call.index("--ops")
        assert call[i + 1 : i + 3] == ["retention", "linear_attn"]
    outs = [c[c.index("--out") + 1] for c in runs[1:]]
    assert outs[0].endswith("mode-default-1.json") and outs[1].endswith("mode-default-2.json")
    assert "--reverse" not in runs[1] and "--reverse" in runs[2]
    assert runs[1][runs[1].index("--commit") + 1] == "abc"
