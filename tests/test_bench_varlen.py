"""linrnn bench's varlen suite in parts, on CPU: its plan (linrnn ops first, the peer last, one
key per item), a time budget that keeps the finished items, a run killed from outside (SIGKILL,
SIGTERM; a worker in progress killed with it) that leaves the finished cases in the JSON,
--resume that runs only the rest, and scripts/gpu_runbook.sh's varlen stage."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from linrnn.__main__ import main as linrnn_main
from linrnn.bench import cli, registry, report, varlen, worker

TINY = ["--device", "cpu", "--repeats", "1", "--quiet"]
SMALL = ["--suite", "varlen", "--ops", "simple_gla", "mlstm[exp]", "--shapes", "B1-T48-H2-K8-V8",
         "--docs", "3"]  # fmt: skip
ITEMS = [(op, lay) for op in ("simple_gla", "mlstm[exp]") for lay in ("packed", "padded")]


def bench(out, *argv) -> tuple[int, dict | None]:
    code = linrnn_main(["bench", *TINY, "--out", str(out), *SMALL, *argv])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def done(rep: dict) -> list[tuple]:
    return [(r["op"], r["layout"], r["run"]) for r in rep["bench"]]


def spy_on_items(monkeypatch) -> list[tuple]:
    """The (op, layout) of every varlen item run in this process, in order."""
    ran = []
    real = varlen.varlen_case
    monkeypatch.setattr(varlen, "varlen_case", lambda case, item: ran.append(
        (case["op"], item["layout"])) or real(case, item))  # fmt: skip
    return ran


def test_plan_runs_the_linrnn_ops_first_and_the_peer_last():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--suite", "varlen", "--plan"])
    args.isolate = "process"
    cases, _ = cli.plan(args, registry.SUITES["varlen"], "cuda")
    ops = [case["op"] for case, _ in cases]
    chunk_kernels = [name for name, op in registry.OPS.items()
                     if "chunk" in op.kernel_modes() and op.family != "mamba2"]  # fmt: skip
    assert {"delta_rule", "gated_delta_rule"} < set(chunk_kernels)
    assert ops == [*chunk_kernels, "fla:chunk_simple_gla[varlen]"]  # every family, the peer last
    keys = [cli.item_key(c, it) for c, items in cases for it in items]
    assert len(keys) == len(set(keys)) == 26
    for case, items in (cases[0], cases[-1]):
        assert [it["layout"] for it in items] == ["packed", "padded"]
        assert {it["shape"] for it in items} == {"B1-T65536-H16-K256-V256"}  # not shrunk
        for it in items:  # a row's key is its item's key (--resume relies on it)
            row = varlen.full_row(case, it, {"status": "ok"}, None)
            assert report.row_key(row) == cli.item_key(case, it)


def test_budget_keeps_the_finished_items_and_resume_runs_the_rest(tmp_path, monkeypatch, capsys):
    """The budget passes in the first item: it keeps its row; the rest is left to --resume."""
    out = tmp_path / "varlen.json"
    real = varlen.varlen_case
    monkeypatch.setattr(varlen, "varlen_case", lambda case, item: time.sleep(3.5) or real(
        case, item))  # fmt: skip
    code, rep = bench(out, "--time-budget", "3")
    assert code == 3 and "run the same command again with --resume" in capsys.readouterr().out
    assert done(rep) == [("simple_gla", "packed", 0)] and rep["bench"][0]["status"] == "ok"
    assert rep["complete"] is False and rep["runs"][0]["pending"] == 3
    monkeypatch.setattr(varlen, "varlen_case", real)
    ran = spy_on_items(monkeypatch)
    code, again = bench(out, "--resume")
    assert code == 0 and ran == ITEMS[1:]
    assert done(again) == [("simple_gla", "packed", 0), *((op, lay, 1) for op, lay in ITEMS[1:])]
    assert again["bench"][0] == rep["bench"][0] and again["complete"] is True
    assert [r["rows"] for r in again["runs"]] == [1, 3]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_run_leaves_the_finished_cases_for_resume(tmp_path, monkeypatch, sig):
    """A run killed in its second case (in-process, hanging there on purpose) leaves the first
    case's rows in the JSON; SIGTERM also marks it stopped. --resume runs the second case only."""
    out = tmp_path / "varlen.json"
    script = textwrap.dedent(f"""
        import sys, time
        from linrnn.bench import varlen
        from linrnn.__main__ import main
        real = varlen.varlen_case
        def hang(case, item):
            if case["op"] == "mlstm[exp]":
                time.sleep(600)
            return real(case, item)
        varlen.varlen_case = hang
        argv = {["bench", "--device", "cpu", "--repeats", "1", "--out", str(out), *SMALL]!r}
        sys.exit(main(argv))
    """)  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=worker.ROOT)  # fmt: skip
    try:
        t0 = time.monotonic()
        while not (out.exists() and len(json.loads(out.read_text())["bench"]) == 2):
            assert proc.poll() is None and time.monotonic() - t0 < 120, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.3)  # in mlstm[exp]'s first item
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "[1/2] simple_gla chunk L=default: ok, ok" in stderr  # flushed progress
    assert "[2/2] start mlstm[exp]" in stderr
    rep = json.loads(out.read_text())
    assert done(rep) == [("simple_gla", "packed", 0), ("simple_gla", "padded", 0)]
    assert rep["complete"] is False
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in stderr
        assert "2 items not run (SIGTERM stopped the run)" in stdout
        assert rep["runs"][0]["pending"] == 2 and out.with_suffix(".md").exists()
    else:
        assert proc.returncode == -signal.SIGKILL
    ran = spy_on_items(monkeypatch)
    code, again = bench(out, "--resume")
    assert code == 0 and ran == ITEMS[2:] and again["complete"] is True
    assert done(again) == [*done(rep), ("mlstm[exp]", "packed", 1), ("mlstm[exp]", "padded", 1)]


def _workers_of(pid: int) -> list[int]:
    """Children of ``pid`` run with ``--worker``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text, cmd = stat.read_text(), (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == pid and b"--worker" in cmd:
            found.append(int(stat.parent.name))
    return found


def _gone(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rindex(")") + 2] == "Z"  # killed, not reaped yet


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_sigterm_kills_the_worker_in_progress(tmp_path, monkeypatch):
    """Workers lead their own process group, so an outer timeout's SIGTERM would leave one
    running (on the GPU); the CLI kills it, keeps the rows it has and returns 128 + 15."""
    real = cli.run_case
    seen: list[int] = []

    def run_case(case, items, args, stop_at=None):
        if case["op"] != "mlstm[exp]":
            return real(case, items, args, stop_at)

        def signal_when_started():
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:
                seen.extend(_workers_of(os.getpid()))
                if seen:
                    os.kill(os.getpid(), signal.SIGTERM)  # the handler of stop_on_signals
                    return
                time.sleep(0.05)

        threading.Thread(target=signal_when_started, daemon=True).start()
        return worker.run_items({"task": "selftest", "device": "cpu"}, [{"do": "sleep"}], 600,
                                worker.worker_env(), False)  # fmt: skip

    monkeypatch.setattr(cli, "run_case", run_case)
    out = tmp_path / "varlen.json"
    code, rep = bench(out)
    assert code == 128 + signal.SIGTERM and len(seen) == 1
    t0 = time.monotonic()
    while not _gone(seen[0]):
        assert time.monotonic() - t0 < 10, f"worker {seen[0]} still running"
        time.sleep(0.05)
    assert done(rep) == [("simple_gla", "packed", 0), ("simple_gla", "padded", 0)]
    assert rep["complete"] is False and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# --- scripts/gpu_runbook.sh varlen ----------------------------------------------------------


def runbook_varlen(tmp_path, *argv, budget=None) -> tuple[list[list[str]], str, Path]:
    """The stage with a stand-in python3 that logs its arguments: the linrnn bench calls."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\037" "$a"; done >>"{log}"\n'
                    f'echo >>"{log}"\n')  # fmt: skip
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(out), "LINRNN_COMMIT": "abc"}
    if budget is not None:
        env["BUDGET"] = str(budget)
    script = worker.ROOT / "scripts" / "gpu_runbook.sh"
    res = subprocess.run(["bash", str(script), "varlen", *argv], capture_output=True, text=True,
                         env=env, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    calls = [c.split("\037")[:-1] for c in log.read_text().splitlines()] if log.exists() else []
    return [c for c in calls if c[:2] == ["-u", "-m"] or "--plan" in c], res.stdout, out


def test_runbook_varlen_stage_runs_linrnn_then_the_peer_resumable(tmp_path):
    calls, _, out = runbook_varlen(tmp_path)
    (lin, peer, left) = calls
    J = str(out / "varlen.json")
    for call, ops, item in ((lin, "linrnn", "120"), (peer, "peers", "220")):
        assert call[call.index("--ops") + 1] == ops and call[call.index("--timeout") + 1] == item
        assert "--resume" in call and call[call.index("--out") + 1] == J
        assert 240 <= float(call[call.index("--time-budget") + 1]) <= 510
        assert call[call.index("--suite") + 1] == "varlen" and "--shapes" not in call
    assert "--plan" in left and "--resume" in left


def test_runbook_varlen_stage_leaves_the_peer_and_takes_a_report_to_resume(tmp_path):
    previous = tmp_path / "previous.json"
    previous.write_text('{"suite": "varlen", "bench": []}\n')
    previous.chmod(0o444)  # as the device machine's files come back
    calls, stdout, out = runbook_varlen(tmp_path, str(previous), budget=200)
    (lin, left) = calls  # no peer part
    assert lin[lin.index("--ops") + 1] == "linrnn" and float(
        lin[lin.index("--time-budget") + 1]) <= 190  # fmt: skip
    assert "--plan" in left
    assert "waits for the next call" in stdout
    copied = out / "varlen.json"
    assert copied.read_text() == previous.read_text() and os.access(copied, os.W_OK)
