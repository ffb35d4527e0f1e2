"""linrnn bench in parts, on CPU: a time budget that leaves items unrun, --resume that runs
only what a report lacks (and --retry-failed), --plan, the shared Triton cache, and --report
merging reports into one JSON, a Markdown table and plots without running anything."""

from __future__ import annotations

import argparse
import importlib.util
import json
import time

import pytest

from linrnn.__main__ import main as linrnn_main
from linrnn.bench import cli, plots, registry, report, worker

TINY = ["--device", "cpu", "--repeats", "1", "--quiet"]


def bench(out, *argv) -> tuple[int, dict | None]:
    code = linrnn_main(["bench", *TINY, "--out", str(out), *argv])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def ops_modes(rep: dict) -> list[tuple]:
    return [(r["op"], r["mode"], r["run"]) for r in rep["bench"]]


# --- time budget ----------------------------------------------------------------------------


def test_worker_budget_leaves_the_cut_item_and_the_rest_unrun():
    """A worker killed at the run's budget is no crash: the item it was in and the ones after
    it get no row (None), the ones before keep theirs."""
    items = [{"do": "ok", "n": 0}, {"do": "sleep"}, {"do": "ok", "n": 2}]
    t0 = time.monotonic()
    rows = worker.run_items({"task": "selftest", "device": "cpu"}, items, 600,
                            worker.worker_env(), False, stop_at=t0 + 6)  # fmt: skip
    assert rows[0]["status"] == "ok" and rows[1:] == [None, None]
    assert time.monotonic() - t0 < 30  # cut at the budget, not at the 600 s item timeout
    past = worker.run_items({"task": "selftest", "device": "cpu"}, items, 600,
                            worker.worker_env(), False, stop_at=time.monotonic())  # fmt: skip
    assert past == [None, None, None]
    tasks = {"selftest": worker.selftest_case}
    case = {"task": "selftest", "device": "cpu", "in_process": True}
    assert worker.run_in_process(case, items[:1], tasks, stop_at=time.monotonic()) == [None]


def test_budget_then_resume_completes_the_report(tmp_path, capsys):
    out = tmp_path / "part.json"
    code, rep = bench(out, "--ops", "simple_gla", "--modes", "chunk", "recurrent",
                      "--time-budget", "1e-9")  # fmt: skip
    assert code == 3 and "run the same command again with --resume" in capsys.readouterr().out
    assert rep["complete"] is False and rep["bench"] == [] and rep["runs"][0]["pending"] == 2
    code, rep = bench(out, "--ops", "simple_gla", "--modes", "chunk", "recurrent", "--resume")
    assert code == 0 and rep["complete"] is True
    assert ops_modes(rep) == [("simple_gla", "chunk", 1), ("simple_gla", "recurrent", 1)]
    assert [run["rows"] for run in rep["runs"]] == [0, 2]
    assert out.with_suffix(".md").exists()


# --- resume ---------------------------------------------------------------------------------


def test_resume_runs_only_the_missing_items(tmp_path, monkeypatch):
    out = tmp_path / "paper-part.json"
    code, first = bench(out, "--ops", "simple_gla", "--modes", "chunk")
    assert code == 0 and ops_modes(first) == [("simple_gla", "chunk", 0)]
    ran = []
    real = cli.run_case
    monkeypatch.setattr(cli, "run_case", lambda case, items, *a: ran.append(
        (case["op"], case["mode"])) or real(case, items, *a))  # fmt: skip
    code, rep = bench(out, "--ops", "simple_gla", "--modes", "chunk", "parallel", "--resume")
    assert code == 0 and ran == [("simple_gla", "parallel")]
    assert ops_modes(rep) == [("simple_gla", "chunk", 0), ("simple_gla", "parallel", 1)]
    assert rep["bench"][0] == first["bench"][0] | {"run": 0}  # kept as it was
    assert len(rep["runs"]) == 2 and rep["runs"][1]["config"]["resume"] is True
    ran.clear()
    code, again = bench(out, "--ops", "simple_gla", "--modes", "chunk", "parallel", "--resume")
    assert code == 0 and ran == [] and again["bench"] == rep["bench"]


def test_retry_failed_reruns_only_the_failed_rows(tmp_path):
    out = tmp_path / "part.json"
    bench(out, "--ops", "simple_gla", "--modes", "chunk", "parallel")
    rep = json.loads(out.read_text())
    rep["bench"][1].update(status="timeout (1 s) in first forward after 1.0 s", fwd_ms=None)
    out.write_text(json.dumps(rep))
    code, kept = bench(out, "--ops", "simple_gla", "--modes", "chunk", "parallel", "--resume")
    assert code == 1 and kept["bench"][1]["status"].startswith("timeout")  # a failed linrnn row
    code, retried = bench(out, "--ops", "simple_gla", "--modes", "chunk", "parallel",
                          "--resume", "--retry-failed")  # fmt: skip
    assert code == 0 and ops_modes(retried) == [
        ("simple_gla", "chunk", 0), ("simple_gla", "parallel", 2)
    ]  # fmt: skip
    assert all(r["status"] == "ok" for r in retried["bench"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--retry-failed"], "--retry-failed goes with --resume"),
        (["--time-budget", "0"], "--time-budget must be > 0"),
        (["--suite", "headdim", "--resume"], "holds suite 'quick', not 'headdim'"),
    ],
)
def test_parts_reject_bad_arguments(tmp_path, argv, message, capsys):
    out = tmp_path / "quick.json"
    report.write_json(out, {"benchmark": "linrnn bench", "suite": "quick", "bench": []})
    with pytest.raises(SystemExit) as exc:
        bench(out, "--ops", "simple_gla", *argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_row_keys_match_the_planned_items():
    """The key a plan's item will have is the key of the row it makes (resume relies on it)."""
    args = argparse.Namespace(ops=None, modes=None, shapes=None, chunk_sizes=None, dtype=None,
                              seed=0, warmup_ms=25, rep_ms=100, repeats=1, threads=None,
                              isolate="process", backend=None, no_peers=False, plan=True,
                              triton_cache=None)  # fmt: skip
    cases, _ = cli.plan(args, registry.SUITES["paper"], "cuda")
    keys = {cli.item_key(c, it) for c, items in cases for it in items}
    assert len(keys) == sum(len(items) for _, items in cases) == 186
    case, items = next((c, i) for c, i in cases if c["op"] == "fla:chunk_gla")
    row = cli.full_row(case, items[0], {"status": "ok"}, None)
    assert report.row_key(row) == cli.item_key(case, items[0])


# --- plan and Triton cache ------------------------------------------------------------------


def test_plan_lists_the_gpu_run_with_peers_and_what_is_left(tmp_path, capsys):
    assert linrnn_main(["bench", "--suite", "paper", "--plan"]) == 0
    text = capsys.readouterr().out
    assert "plan: suite paper on cuda: 33 cases, 186 items" in text
    assert "fla:chunk_gla - - L=64: B32-T2048-H16-K256-V256" in text
    assert "rwkv6 fused_chunk triton L=default: B32-T2048-H64-K64-V64" in text
    out = tmp_path / "paper.json"
    done = {"suite": "paper", "op": "rwkv6", "mode": "chunk", "backend": "triton",
            "chunk_requested": None, "dtype": "bf16", "status": "ok"}  # fmt: skip
    rows = [dict(done, shape=registry.shape_id(B, T, 64, 64, 64)) for B, T in registry.PAPER_BT]
    report.write_json(out, {"benchmark": "linrnn bench", "suite": "paper", "bench": rows})
    argv = ["bench", "--suite", "paper", "--ops", "rwkv6", "--plan", "--resume", "--out", str(out)]
    assert linrnn_main(argv) == 0
    text = capsys.readouterr().out
    assert "1 cases, 3 items (3 already in the report)" in text and "rwkv6 fused_chunk" in text


def test_triton_cache_is_shared_only_when_asked(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(worker, "run_items", lambda case, items, timeout, env, *a, **k: seen.append(
        (case["fresh_triton_cache"], env["TRITON_CACHE_DIR"])) or [None] * len(items))  # fmt: skip
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    for extra in ([], ["--triton-cache", str(tmp_path / "tc")]):
        args = parser.parse_args(["--suite", "paper", "--ops", "linear_attn", "--modes", "chunk",
                                  "--isolate", "process", *extra])  # fmt: skip
        (case, items), *_ = cli.plan(args, registry.SUITES["paper"], "cuda")[0]
        cli.run_case(case, items, args)
        cli.run_case(case, items, args)
    (fresh1, dir1), (fresh2, dir2), (fresh3, dir3), (fresh4, dir4) = seen
    assert fresh1 and fresh2 and dir1 != dir2  # a new cache per case: compile included
    assert not fresh3 and not fresh4 and dir3 == dir4 == str((tmp_path / "tc").resolve())


# --- report: merge, Markdown, plots ---------------------------------------------------------


def fake_row(op, shape, run=0, status="ok", fwd=1.0, fwdbwd=3.0, suite="paper", chunk=None):
    lib = "linrnn" if op in registry.OPS else op.split(":")[0]
    row = {k: None for k in report.ROW_KEYS}
    row.update(op=op, library=lib, family=registry.OPS[cli.peers.like_of(op)].family,
               mode="chunk" if lib == "linrnn" else None, backend="triton" if lib == "linrnn"
               else None, chunk=chunk or 128, chunk_requested=chunk, shape=shape, dtype="bf16",
               suite=suite, status=status, fwd_ms=fwd, fwdbwd_ms=fwdbwd, run=run,
               peak_fwdbwd_mib=1000.0 * (chunk or 128) / 64, fwd_tflops=10.0, intensity=50.0,
               first_call_s=7.5)  # fmt: skip
    return row


def part(rows, suite="paper", command="linrnn bench"):
    machine = {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "fla-core": "0.6.0",
               "git_commit": "abc123", "date": "2026-11-22T10:00:00+00:00"}  # fmt: skip
    return {"benchmark": "linrnn bench", "suite": suite, "complete": True, "machine": machine,
            "command": command, "bench": rows, "gpu_spec": None}  # fmt: skip


def test_merge_keeps_every_run_and_prefers_ok_rows():
    a, b = "B32-T2048-H16-K256-V256", "B8-T8192-H16-K256-V256"
    first = part([fake_row("gla", a), fake_row("gla", b, status="timeout (300 s)", fwd=None)],
                 command="part 1")  # fmt: skip
    second = part([fake_row("gla", b, fwd=2.0), fake_row("fla:chunk_gla", a, fwd=5.0)],
                  command="part 2")  # fmt: skip
    third = part([fake_row("gla", a, status="error (first forward): boom", fwd=None)])
    merged = report.merge_reports([first, second, third])
    assert [r["command"] for r in merged["runs"]] == ["part 1", "part 2", "linrnn bench"]
    assert [(r["op"], r["shape"], r["run"], r["status"]) for r in merged["bench"]] == [
        ("gla", a, 0, "ok"), ("gla", b, 1, "ok"), ("fla:chunk_gla", a, 1, "ok")
    ]  # fmt: skip
    assert merged["suite"] == "paper" and merged["failures"] == {"linrnn_bench": 0}
    assert report.merge_reports([first, part([], suite="chunksize")])["suite"] == "paper+chunksize"


def test_markdown_pivots_each_family_over_the_shapes():
    shapes = [registry.shape_id(B, T, H, d, d) for H, d in ((32, 128), (16, 256))
              for B, T in registry.PAPER_BT]  # fmt: skip
    rows = [fake_row("mlstm[exp]", s, fwd=3.5, fwdbwd=15.25) for s in shapes]
    rows[1].update(status="aborted: signal 6 (SIGABRT) in first forward after 3.0 s", fwd_ms=None,
                   fwdbwd_ms=None)  # fmt: skip
    rows.append(fake_row("mlstm_kernels:triton_xl_chunk", shapes[0], run=1, fwdbwd=None,
                         status="error (first backward): RuntimeError: no | bwd"))  # fmt: skip
    rows.append(fake_row("gla", shapes[0]))
    text = report.markdown({**part(rows), "runs": [part([], command="a"), part([], command="b")]})
    assert text.startswith("## linrnn bench: paper")
    assert "- run 0: NVIDIA H200, torch 2.11.0, Triton 3.6.0, fla-core 0.6.0, commit `abc1" in text
    assert "Rows from 2 runs" in text
    table = text[text.index("### mlstm") : text.index("### gla")].strip().splitlines()
    header = table[2]
    assert header.split(" | ")[3:5] == [shapes[3], shapes[4]]  # K=256 first, then by T
    linrnn_line, peer_line = table[4:6]
    assert linrnn_line.startswith("| linrnn mlstm[exp] | chunk | 128 | 15.2 / 3.500 |")
    assert "| aborted |" in linrnn_line
    assert peer_line.startswith("| mlstm_kernels:triton_xl_chunk |  | 128 |")
    assert "— / 1.000 (error (first backward))" in peer_line
    assert "no \\| bwd" in text  # a pipe in a status stays inside its cell
    assert "<details>" in text and "| run | status |" in text


def test_report_command_merges_parts_without_running(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "run_case", lambda *a: pytest.fail("--report ran a case"))
    a, b = tmp_path / "part-1.json", tmp_path / "part-2.json"
    report.write_json(a, part([fake_row("gla", "B32-T2048-H16-K256-V256")]))
    report.write_json(b, part([fake_row("fla:chunk_gla", "B32-T2048-H16-K256-V256")]))
    out = tmp_path / "merged" / "paper.json"
    assert linrnn_main(["bench", "--report", str(a), str(b), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert [r["op"] for r in merged["bench"]] == ["gla", "fla:chunk_gla"]
    assert "### gla" in out.with_suffix(".md").read_text()
    assert "2 rows from 2 run(s)" in capsys.readouterr().out
    assert linrnn_main(["bench", "--report", str(a)]) == 0  # one file: its .md beside it
    assert a.with_suffix(".md").exists() and json.loads(a.read_text())["bench"][0]["op"] == "gla"
    with pytest.raises(SystemExit) as exc:
        linrnn_main(["bench", "--report", str(a), str(tmp_path / "missing.json"), "--out",
                     str(out)])  # fmt: skip
    assert exc.value.code == 2


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib missing")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # matplotlib's mathtext on pyparsing
def test_plots_of_a_merged_paper_and_chunksize_report(tmp_path):
    """Runtime against T from the paper rows only; memory against L from the chunksize rows."""
    paper = [fake_row("gla", registry.shape_id(B, T, 16, 256, 256)) for B, T in registry.PAPER_BT]
    sizes = [fake_row("gla", "B8-T8192-H16-K256-V256", suite="chunksize", chunk=L)
             for L in (64, 128, 256)]  # fmt: skip
    merged = report.merge_reports([part(paper), part(sizes, suite="chunksize")])
    made = plots.make_plots(merged, tmp_path)
    assert {p.name for p in made} == {"runtime-vs-T-gla.png", "memory-vs-chunk.png",
                                      "roofline.png"}  # fmt: skip
    assert len(plots.length_rows(merged["bench"], "fwdbwd_ms")) == 3  # no chunksize row
    assert len(plots.length_rows(sizes, "fwdbwd_ms")) == 3  # one suite: its rows as they are


# --- scripts/paper_runbook.sh ---------------------------------------------------------------


def runbook_parts() -> dict[str, list[str]]:
    """Each numbered part of scripts/paper_runbook.sh: its linrnn bench arguments (its
    part_args function, run by bash without running the script)."""
    import subprocess

    script = worker.ROOT / "scripts" / "paper_runbook.sh"
    harness = (
        f'eval "$(sed -n "/^PARTS=/p; /^part_args()/,/^}}/p" "{script}")"; '
        'for p in "${PARTS[@]}"; do part_args "$p"; printf "%s\\0" "@$p" "${ARGS[@]}"; done'
    )
    out = subprocess.run(["bash", "-c", harness], capture_output=True, text=True, check=True,
                         env={"TC": "/tmp/tc", "PATH": "/usr/bin:/bin"}).stdout  # fmt: skip
    parts: dict[str, list[str]] = {}
    for word in out.split("\0")[:-1]:
        if word.startswith("@"):
            parts[word[1:]] = []
        else:
            parts[next(reversed(parts))].append(word)
    return parts


def test_runbook_parts_cover_the_paper_and_chunksize_suites_once():
    """Parts 1-6 and 12 together plan every item of the paper suite once (186), parts 7-8 every item
    of the chunksize suite once, and the headdim parts every linrnn item once (fla left out)."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)

    def keys(argv):
        args = parser.parse_args([*argv, "--plan"])
        args.isolate = "process"
        cases, _ = cli.plan(args, registry.SUITES[args.suite], "cuda")
        return [cli.item_key(c, it) for c, items in cases for it in items]

    parts = runbook_parts()
    assert list(parts) == [str(n) for n in range(1, 13)]
    for suite in ("paper", "chunksize", "headdim"):
        planned = [k for argv in parts.values() if argv[1] == suite for k in keys(argv)]
        assert len(planned) == len(set(planned)), suite  # no item in two parts
        full = set(keys(["--suite", suite]))
        if suite == "headdim":
            assert set(planned) == {k for k in full if '"fla:' not in k}
        else:
            assert set(planned) == full and len(full) == {"paper": 186, "chunksize": 70}[suite]
    fla = [argv for argv in parts.values() if any(op.startswith("fla:") for op in argv)]
    assert all("--triton-cache" in argv for argv in fla)
    assert parts["6"][parts["6"].index("--ops") + 1 :][:1] == ["fla:chunk_gla"]
