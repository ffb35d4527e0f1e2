"""linrnn bench's train suite: a run on CPU (tiny model, the PyTorch path, a few steps), its plan
at the GPU shapes, what a worker that died leaves in its row, the options, the time budget, and
scripts/gpu_runbook.sh's train stage."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics

import pytest
from test_bench_runbook import stage

from linrnn.__main__ import main as linrnn_main
from linrnn.bench import cli, registry, report, training


def bench(tmp_path, *argv) -> tuple[int, dict | None]:
    out = tmp_path / "train.json"
    code = linrnn_main(["bench", "--suite", "train", "--device", "cpu", "--quiet", "--out",
                        str(out), *argv])  # fmt: skip
    return code, (json.loads(out.read_text()) if out.exists() else None)


def parsed(*argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(["--suite", "train", *argv])


def test_cpu_run_trains_each_mixer_and_records_rows_curves_and_ratios(tmp_path, capsys):
    from linrnn.train import DEFAULT_DATA, load_bytes

    train_bytes, _ = load_bytes(DEFAULT_DATA, 0.1)
    code, rep = bench(tmp_path, "--mixers", "mlstm_sig", "softmax", "--commit", "abc1234")
    assert code == 0 and rep["suite"] == "train" and rep["complete"] is True
    assert rep["machine"]["git_commit"] == "abc1234"
    rows = rep["bench"]
    assert [r["op"] for r in rows] == ["softmax", "mlstm_sig"]  # softmax first: the baseline
    soft, mine = rows
    assert soft["library"] == "torch" and soft["backend"] is None
    assert mine["library"] == "linrnn" and mine["backend"] == "torch"
    assert mine["mixer"] == "mlstm" and mine["mixer_kwargs"] == {"input_gate": "sigmoid"}
    for r in rows:
        assert set(r) >= set(report.ROW_KEYS) and r["status"] == "ok", r
        assert r["shape"] == "B4-T64" and r["dtype"] == "fp32" and r["amp"] == "off"
        assert r["model"] == training.CPU_MODEL and r["parameters"] > 0
        assert r["steps"] == training.CPU_STEPS == 6 and r["tokens_per_step"] == 256
        assert r["first_step_s"] > 0 and r["peak_mem_mib"] is None  # no CUDA
        times = r["step_times_ms"]
        assert len(times) == len(r["curve"]["loss"]) == len(r["curve"]["time_s"]) == 6
        assert r["median_step_ms"] == pytest.approx(statistics.median(times[3:]), abs=1e-3)
        assert r["tokens_per_s"] == pytest.approx(256 / (r["median_step_ms"] * 1e-3), rel=1e-3)
        # the training time leaves the first step out; it adds up the others
        assert r["curve"]["time_s"][0] == 0.0
        assert r["train_time_s"] == pytest.approx(sum(times[1:]) / 1e3, abs=1e-3)
        # initialized near uniform over 256 bytes: the first loss is about ln 256
        assert abs(r["curve"]["loss"][0] - math.log(256)) < 0.1
        assert r["evals"][-1]["step"] == 6 and r["evals"][-1]["val"] == r["val_loss"]
        assert 4.0 < r["val_loss"] < 6.0 and r["best_val_loss"] <= r["val_loss"]
        assert r["epochs"] == pytest.approx(6 * 256 / len(train_bytes))
        # a row's key is its item's: --resume finds it
        assert report.row_key(r) in {cli.item_key(c, it) for c, items in plan_cpu() for it in items}
    assert soft["tokens_per_s_vs_softmax"] == 1.0
    ratio = mine["tokens_per_s"] / soft["tokens_per_s"]
    assert mine["tokens_per_s_vs_softmax"] == pytest.approx(ratio)
    (target,) = training.targets(rows)
    assert target["mixer"] == "mlstm_sig" and target["value"] == pytest.approx(ratio)
    assert target["verdict"] == ("met" if ratio >= 1.5 else "missed")
    printed = capsys.readouterr().out
    assert "vs softmax" in printed and "targets:" in printed
    md = (tmp_path / "train.md").read_text()
    assert "| mlstm_sig | B4-T64 |" in md and "### targets" in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "train" / "loss-curves-B4-T64.png").stat().st_size > 1000
    code = linrnn_main(
        [
            "bench",
            "--suite",
            "train",
            "--device",
            "cpu",
            "--plan",
            "--resume",
            "--mixers",
            "softmax",
            "mlstm_sig",
            "--out",
            str(tmp_path / "train.json"),
        ]
    )
    assert code == 0 and "0 cases, 0 items (2 already in the report)" in capsys.readouterr().out
    assert linrnn_main(["bench", "--report", str(tmp_path / "train.json")]) == 0
    assert "vs softmax" in capsys.readouterr().out  # the train table, from the JSON alone
    assert "| mlstm_sig | B4-T64 |" in (tmp_path / "train.md").read_text()


def plan_cpu() -> list:
    return cli.plan(parsed("--mixers", "softmax", "mlstm_sig"), registry.SUITES["train"], "cpu")[0]


def test_gpu_plan_every_mixer_at_65536_tokens_per_step_softmax_first():
    args = parsed("--seq-len", "8192", "2048")
    cases, notes = cli.plan(args, registry.SUITES["train"], "cuda")
    names = list(training.VARIANTS)
    assert names[0] == "softmax" and len(names) == 11
    assert [c["op"] for c, _ in cases] == names * 2
    shapes = [items[0]["shape"] for _, items in cases]
    assert shapes == ["B8-T8192"] * 11 + ["B32-T2048"] * 11
    for case, _ in cases:
        assert case["task"] == "train" and case["dtype"] == "bf16"
        assert (case["d_model"], case["layers"], case["heads"]) == (512, 6, 4)
        assert case["backend"] is None and case["max_steps"] == 0 and case["train_s"] == 20
        assert case["needs_s"] == 20 + training.OVERHEAD_S
    assert "65,536 tokens per step" in notes[0] and "eager steps" in notes[0]
    assert not any(c["cuda_graph"] for c, _ in cases)
    cases, notes = cli.plan(parsed("--cuda-graph"), registry.SUITES["train"], "cuda")
    assert all(c["cuda_graph"] for c, _ in cases) and "replayed from a CUDA graph" in notes[0]
    cases, _ = cli.plan(parsed("--batch", "2", "--mixers", "gla"), registry.SUITES["train"], "cuda")
    assert [(c["op"], items) for c, items in cases] == [("gla", [{"shape": "B2-T8192"}])]


def test_graphed_and_eager_rows_have_their_own_baselines_and_targets():
    def row(op, tps, graph):
        return dict(suite="train", op=op, shape="B8-T8192", dtype="bf16", tokens_per_s=tps,
                    cuda_graph=graph)  # fmt: skip

    rows = [row("softmax", 100.0, False), row("gla", 140.0, False), row("rwkv6", 70.0, False),
            row("softmax", 110.0, True), row("gla", 176.0, True),
            row("rwkv6", 121.0, True)]  # fmt: skip
    got = {(t["shape"], t["mixer"], t["target"]): t["value"] for t in training.targets(rows)}
    assert [r["tokens_per_s_vs_softmax"] for r in rows] == pytest.approx([1, 1.4, 0.7, 1, 1.6, 1.1])
    linear, rwkv = (t for t, _ in training.TARGETS)
    assert got[("B8-T8192", "gla", linear)] == pytest.approx(1.4)
    assert got[("B8-T8192 graph", "gla", linear)] == pytest.approx(1.6)
    assert got[("B8-T8192", "rwkv6", rwkv)] == pytest.approx(0.5)
    assert got[("B8-T8192 graph", "rwkv6", rwkv)] == pytest.approx(121 / 176)
    assert "| gla | B8-T8192 graph |" in "\n".join(training.markdown_lines(rows))


def test_the_gpu_model_has_about_twenty_million_parameters():
    from linrnn.models import CausalLM
    from linrnn.train import TrainConfig, model_config

    m = training.GPU_MODEL
    for mixer, kwargs in training.VARIANTS.values():
        cfg = TrainConfig(mixer=mixer, mixer_kwargs=kwargs, d_model=m["d_model"],
                          num_layers=m["layers"], num_heads=m["heads"])  # fmt: skip
        n = CausalLM(model_config(cfg), device="meta").num_parameters()
        assert 19e6 < n < 26e6, (mixer, n)


def test_a_dead_worker_keeps_what_it_measured(tmp_path):
    """The worker writes its row so far; when it dies (here: a timeout in the final evaluation)
    the report row has those figures under the failure's status, and the file goes."""
    (case, items), *_ = plan_cpu()
    partial = tmp_path / "part" / "softmax.json"
    case = dict(case, partial=str(partial))
    report.write_json(partial, {"status": "ok", "steps": 40, "tokens_per_s": 1234.5})
    failed = {"status": "timeout (300 s) in eval after 290.0 s", "died_after_s": 300.0}
    row = training.full_row(case, items[0], failed, None)
    assert row["status"] == failed["status"] and row["steps"] == 40
    assert row["tokens_per_s"] == 1234.5 and row["op"] == "softmax"
    assert not partial.exists() and not partial.parent.exists()
    report.write_json(partial, {"status": "ok", "steps": 3})  # an ok row keeps its own figures
    row = training.full_row(case, items[0], {"status": "ok", "steps": 6}, None)
    assert row["steps"] == 6 and not partial.exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "paper", "--mixers", "gla"], "--mixers: options of --suite train only"),
        (["--suite", "paper", "--cuda-graph"], "--cuda-graph: options of --suite train only"),
        (["--suite", "train", "--ops", "gla"], "--ops does not apply to --suite train"),
        (["--suite", "train", "--mixers", "gpt"], "unknown --mixers ['gpt']"),
        (["--suite", "train", "--seq-len", "0"], "--seq-len must be ≥ 1"),
        (["--suite", "train", "--chunk-sizes", "64", "128"], "takes one --chunk-sizes value"),
        (["--suite", "train", "--train-seconds", "300"], "--timeout 300 s leaves a worker"),
    ],
)
def test_bad_options_are_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        linrnn_main(["bench", "--device", "cpu", "--plan", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_case_that_needs_more_than_the_time_left_waits_for_resume(tmp_path, monkeypatch):
    real = training.plan

    def slow_plan(*args):
        cases, notes = real(*args)
        return [(dict(c, needs_s=60.0), items) for c, items in cases], notes

    monkeypatch.setattr(training, "plan", slow_plan)
    code, rep = bench(tmp_path, "--mixers", "softmax", "--time-budget", "30")
    assert code == 3 and rep["bench"] == [] and rep["runs"][0]["pending"] == 1


def test_runbook_train_stage(tmp_path):
    calls, res = stage(tmp_path, "train", "2048")
    assert res.returncode == 0, res.stderr
    run, left = [c for c in calls if "linrnn.bench" in c[:3]]
    for call in (run, left):
        assert call[call.index("--suite") + 1] == "train" and "--resume" in call
        assert call[call.index("--seq-len") + 1] == "2048"
        assert call[call.index("--out") + 1].endswith("/out/train-T2048.json")
    assert "--plan" in left and float(run[run.index("--time-budget") + 1]) > 400
    assert run[run.index("--commit") + 1] == "abc"
    assert "--cuda-graph" not in run
    calls, res = stage(tmp_path, "train", "8192", env={"TRAIN_GRAPH": "1"})
    assert res.returncode == 0, res.stderr
    run, left = [c for c in calls if "linrnn.bench" in c[:3]][-2:]
    for call in (run, left):
        assert "--cuda-graph" in call
        assert call[call.index("--out") + 1].endswith("/out/train-graph-T8192.json")
