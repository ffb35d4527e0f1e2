"""The training example: a few steps on the shipped corpus lower the loss and leave a
checkpoint, a history, a sample and (with matplotlib) a plot; the command line runs it."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

import linrnn.train
from linrnn.__main__ import main
from linrnn.models import CausalLM
from linrnn.train import (
    DEFAULT_DATA,
    TrainConfig,
    get_batch,
    load_bytes,
    lr_at,
    resume_config,
    train,
)

TINY = dict(d_model=32, num_layers=1, num_heads=2, seq_len=32, batch_size=8, eval_batches=2)


def test_corpus_is_shipped_and_documented():
    data = DEFAULT_DATA.read_bytes()
    assert 200_000 < len(data) < 1_000_000 and data.isascii()
    assert data.startswith(b"# Hamlet") and b"# Macbeth" in data
    assert "public domain" in (DEFAULT_DATA.parent / "README.md").read_text()


def test_batches_are_next_byte_pairs():
    train_data, val_data = load_bytes(DEFAULT_DATA, 0.1)
    assert len(val_data) == int(0.1 * (len(train_data) + len(val_data)))
    x, y = get_batch(train_data, 4, 16, torch.Generator().manual_seed(0), "cpu")
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    cfg = TrainConfig(lr=1.0, warmup=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(110, cfg) == pytest.approx(0.1)


def test_training_lowers_the_loss_and_writes_its_outputs(tmp_path, capsys):
    cfg = TrainConfig(
        out=str(tmp_path / "run"), mixer="gla", steps=40, warmup=5, eval_every=20,
        sample_tokens=24, progress=False, **TINY,
    )  # fmt: skip
    history = train(cfg)
    losses = [loss for _, loss in history["train_step_loss"]]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0, losses
    evals = history["eval"]
    assert [e["step"] for e in evals] == [20, 40] and evals[-1]["val"] < 4.5
    run = tmp_path / "run"
    saved = json.loads((run / "history.json").read_text())
    assert saved["eval"] == evals and saved["config"]["mixer"] == "gla"
    assert (run / "sample.txt").read_text().startswith(cfg.sample_prompt)
    model = CausalLM.from_pretrained(run / "checkpoint")
    assert model.config.d_model == 32
    out = capsys.readouterr().out
    if importlib.util.find_spec("matplotlib") is not None:
        assert (run / "loss.png").stat().st_size > 1000
    else:
        assert "matplotlib is not installed" in out


@pytest.mark.parametrize("mixer", ["mlstm", "rwkv6"])
def test_command_line(tmp_path, mixer, capsys):
    argv = ["train", "--mixer", mixer, "--out", str(tmp_path / mixer), "--steps", "3",
            "--eval-every", "2", "--d-model", "32", "--num-layers", "1", "--num-heads", "2",
            "--seq-len", "16", "--batch-size", "2", "--eval-batches", "1",
            "--sample-tokens", "5", "--no-plot", "--untied"]  # fmt: skip
    if mixer == "mlstm":
        argv += ["--mixer-arg", "input_gate=sigmoid", "--mixer-arg", "gate_soft_cap=10"]
    assert main(argv) == 0
    history = json.loads((tmp_path / mixer / "history.json").read_text())
    assert len(history["train_step_loss"]) == 3 and history["model"]["tie_embeddings"] is False
    if mixer == "mlstm":
        assert history["model"]["mixer_kwargs"] == {"input_gate": "sigmoid", "gate_soft_cap": 10}
    assert not (tmp_path / mixer / "loss.png").exists()
    assert "sample" in capsys.readouterr().out


def test_packed_batches_hold_whole_documents_with_their_boundaries():
    from itertools import pairwise

    from linrnn.train import get_packed_batch, split_documents

    text = b"ab\n\ncdef\n\ng\n\nhijklmnop\n\n"
    docs = split_documents(torch.tensor(list(text)))
    assert [text[a:b] for a, b in pairwise(docs.offsets)] == [
        b"ab\n\n", b"cdef\n\n", b"g\n\n", b"hijklmnop\n\n",
    ]  # fmt: skip
    x, y, cu = get_packed_batch(docs, 5, 7, torch.Generator().manual_seed(0), "cpu")
    assert x.shape == y.shape == (1, 35) and cu[0] == 0 and cu[-1] == 35
    assert all(r * 7 in cu for r in range(5))  # every row starts a document
    for a, b in pairwise(cu):
        piece = bytes(x[0, a:b].tolist())
        whole = next(text[s:e] for s, e in pairwise(docs.offsets)
                     if text[s:e].startswith(piece))  # fmt: skip
        assert piece == whole[: len(piece)]  # a document's head, or all of it
        expect = list(whole[1 : len(piece) + 1]) + ([-100] if len(piece) == len(whole) else [])
        assert y[0, a:b].tolist() == expect[: b - a]


def test_command_line_pack(tmp_path):
    argv = ["train", "--pack", "--out", str(tmp_path / "p"), "--steps", "2", "--eval-every", "2",
            "--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--seq-len", "32",
            "--batch-size", "2", "--eval-batches", "1", "--sample-tokens", "4", "--no-plot",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    history = json.loads((tmp_path / "p" / "history.json").read_text())
    assert history["config"]["pack"] is True and len(history["train_step_loss"]) == 2


# ------------------------------------------------------------------------------------------
# Resuming, and errors of the command line


def _run_cfg(out, **kw):
    small = dict(TINY, seq_len=16, batch_size=2, eval_batches=1)
    settings = dict(mixer="gla", steps=6, warmup=2, eval_every=2, checkpoint_every=3,
                    sample_tokens=4, progress=False, plot=False, **small)  # fmt: skip
    return TrainConfig(out=str(out), **{**settings, **kw})


def test_resume_continues_the_loss_curve_bitwise(tmp_path, monkeypatch):
    """6 steps in one go against a run killed in step 5 (after its checkpoint at step 3) and
    resumed: the same per-step losses and evaluations, bitwise (CPU)."""
    full = train(_run_cfg(tmp_path / "full"))
    calls = {"n": 0}
    real_step = linrnn.train.train_step

    def dying_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # killed mid-run
        return real_step(*args, **kwargs)

    monkeypatch.setattr(linrnn.train, "train_step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        train(_run_cfg(tmp_path / "cut"))
    monkeypatch.undo()
    cfg = resume_config(tmp_path / "cut", progress=False)
    assert cfg.out == str(tmp_path / "cut") and cfg.steps == 6
    resumed = train(cfg, resume=tmp_path / "cut")
    assert resumed["train_step_loss"] == full["train_step_loss"]
    strip = lambda evals: [{k: v for k, v in e.items() if k != "time_s"} for e in evals]  # noqa: E731
    assert strip(resumed["eval"]) == strip(full["eval"])
    assert resumed["sample"] == full["sample"]
    # the command line: --resume of a finished run has nothing left to do
    assert main(["train", "--resume", str(tmp_path / "cut"), "--no-progress", "--no-plot"]) == 0


def test_resume_refuses_other_settings_and_missing_state(tmp_path):
    train(_run_cfg(tmp_path / "run", steps=3))
    with pytest.raises(ValueError, match=r"cannot resume .*lr: saved 0\.003, now 0\.1"):
        train(_run_cfg(tmp_path / "run", steps=3, lr=0.1), resume=tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="no training state to resume"):
        resume_config(tmp_path / "nothing")
    with pytest.raises(SystemExit, match="no training state to resume"):
        main(["train", "--resume", str(tmp_path / "nothing")])


def test_empty_data_file_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.txt holds 0 bytes"):
        load_bytes(empty, 0.1)
    with pytest.raises(SystemExit, match=r"linrnn.train: training text .*holds 0 bytes"):
        main(["train", "--data", str(empty), "--out", str(tmp_path / "out")])
    short = tmp_path / "short.txt"
    short.write_bytes(b"0123456789")
    with pytest.raises(ValueError, match=r"shorter than seq_len \+ 2 = 18; lower --seq-len"):
        train(_run_cfg(tmp_path / "short", data=str(short)))


@pytest.mark.parametrize(
    "flag, value", [("--steps", "-5"), ("--steps", "0"), ("--batch-size", "0"),
                    ("--eval-every", "-1"), ("--seq-len", "x")],
)  # fmt: skip
def test_bad_counts_are_argument_errors(tmp_path, flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", flag, value, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"steps must be an int ≥ 1, got -5"):
        train(TrainConfig(out=str(tmp_path / "out"), steps=-5))


def test_graphed_step_refuses_what_a_graph_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="cuda_graph takes fixed batch shapes: not with pack"):
        train(TrainConfig(out=str(tmp_path / "a"), cuda_graph=True, pack=True, **TINY))
    with pytest.raises(ValueError, match="cuda_graph takes amp bf16 or off, not fp16"):
        train(TrainConfig(out=str(tmp_path / "b"), cuda_graph=True, amp="fp16", **TINY))
    with pytest.raises(ValueError, match="cuda_graph needs a CUDA device, got cpu"):
        train(TrainConfig(out=str(tmp_path / "c"), cuda_graph=True, device="cpu", **TINY))
    model = CausalLM(linrnn.train.model_config(TrainConfig(**TINY)))
    opt = linrnn.train.make_optimizer(model, TrainConfig(**TINY), fused=False)
    with pytest.raises(ValueError, match="bf16 autocast or none, not fp16"):
        linrnn.train.GraphedStep(model, opt, torch.float16, 1.0)
    with pytest.raises(ValueError, match="warmup must be ≥ 1 eager step before the capture, got 0"):
        linrnn.train.GraphedStep(model, opt, None, 1.0, warmup=0)


def test_graphed_step_on_a_cpu_takes_the_eager_steps():
    """Without CUDA a GraphedStep runs train_step eagerly, with the learning rate it is given
    (the graph's own match with eager steps is tests/gpu/test_graphed_train.py's)."""
    cfg = TrainConfig(**TINY)
    data, _ = load_bytes(DEFAULT_DATA, cfg.val_fraction)
    gen = torch.Generator().manual_seed(3)
    batches = [get_batch(data, 4, 32, gen, "cpu") for _ in range(3)]
    runs = []
    for graphed in (False, True):
        torch.manual_seed(0)
        model = CausalLM(linrnn.train.model_config(cfg))
        opt = linrnn.train.make_optimizer(model, cfg, fused=False)
        off = lambda: torch.autocast("cpu", enabled=False)  # noqa: E731
        step = linrnn.train.GraphedStep(model, opt, None, 1.0) if graphed else None
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        losses = []
        for i, (x, y) in enumerate(batches):
            lr = 1e-2 * (i + 1)
            if graphed:
                losses.append(step(x, y, lr).item())
            else:
                linrnn.train.set_lr(opt, lr)
                losses.append(linrnn.train.train_step(model, opt, scaler, x, y, off, 1.0).item())
            assert all(g["lr"] == lr for g in opt.param_groups)
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0] and len(set(runs[0][0])) == 3
    for a, b in zip(runs[0][1], runs[1][1]):
        assert torch.equal(a, b)


def test_data_stays_on_a_cpu_and_packed_documents_stay_on_the_host():
    train_data, val_data = load_bytes(DEFAULT_DATA, 0.1)
    assert linrnn.train.data_on(torch.device("cpu"), train_data, val_data) == (train_data, val_data)
    docs = linrnn.train.split_documents(train_data)
    assert linrnn.train.data_on(torch.device("cuda"), docs)[0] is docs
