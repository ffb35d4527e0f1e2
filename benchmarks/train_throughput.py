"""GPU training run for issue 7: a ~20M-parameter byte-level LM at T=2048 with every mixer,
tokens/s beside the same model with softmax attention (torch SDPA), and the loss curves.

Each mixer trains in its own subprocess (``linrnn.bench.worker``: a compile crash or a hang
is that mixer's status, with the stage it died in and its stderr tail; the next mixer runs in
a fresh process). The model, the data, the optimizer and the step are the trainer's
(``linrnn.train``: ``CausalLM``, byte-level ``data/shakespeare.txt`` with its 10 % validation
tail, AdamW with the trainer's parameter groups — fused on CUDA —, warm-up + cosine
schedule, gradient clipping 1.0). Precision is the trainer's: **bf16 autocast with fp32
parameters and fp32 AdamW state** (the fp32 weights are the master copy); no GradScaler.
The run is eager (torch.compile of the training step is benchmarks/compile_graphs.py, issue 9).

Per mixer it trains for a fixed wall-time budget (``--budget`` seconds of steps after the first
one; the cosine schedule is sized from the step time measured after 5 steps, so every mixer
reaches the end of its schedule), evaluating train and validation loss on the trainer's fixed
evaluation batches every ``--eval-every-s`` seconds of training and at the end. Recorded:
parameters, worker start-up, first-step time (Triton/cuBLAS compilation and autotuning
included), median step time and tokens/s after 3 warm-up steps, mean tokens/s, peak memory,
the per-step train loss (vs step and vs training time, evaluations not counted), the
evaluations, final and best validation loss, and epochs over the corpus. The corpus is small
(≈ 250 KB of training bytes, ≈ 15 steps per epoch at the default batch): the fast mixers run
tens of epochs and overfit, so read the validation curve (and its best value), not only its
last point. ``--deadline`` caps the whole run: later mixers get a smaller budget when earlier
ones ran long, and a mixer that would start past it is recorded as skipped.

Writes ``--out`` (JSON, rewritten after every mixer; GPU name, torch/Triton versions, the
commit from ``--commit`` since a copied checkout's .git may be stale) and the loss curves
next to it (same name, ``.png``), and prints a table::

    python3 benchmarks/train_throughput.py --commit <sha> --out $OUT/train-throughput.json

``--tiny`` runs a tiny model for a few steps on the PyTorch path (CPU works) to check the
script; ``--plot-only`` redraws the PNG from an existing JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from linrnn.bench.report import format_table, machine_info, write_json  # noqa: E402
from linrnn.bench.worker import emit, failure_row, launch, serve, worker_env  # noqa: E402

SCRIPT = Path(__file__).resolve()
WORKER = (sys.executable, str(SCRIPT), "--worker")

# name -> (LMConfig.mixer, mixer_kwargs); softmax first: the baseline of the tokens/s ratio.
VARIANTS = {
    "softmax": ("softmax", {}),
    "linear_attn": ("linear_attn", {}),
    "retention": ("retention", {}),
    "simple_gla": ("simple_gla", {}),
    "gla": ("gla", {}),
    "rwkv6": ("rwkv6", {}),
    "mlstm_exp": ("mlstm", {"input_gate": "exp"}),
    "mlstm_sig": ("mlstm", {"input_gate": "sigmoid"}),
}
PROBE_STEPS = 5  # steps after the first one that size the schedule to the budget
WARM_STEPS = 3  # steps (the first included) left out of the median and mean step time
MIN_BUDGET_S = 5.0


# --- worker side ----------------------------------------------------------------------------


def _fault(name: str) -> None:
    """Test hook: ``TRAIN_THROUGHPUT_FAULT=<mixer>:abort`` (or ``:sleep``) makes that mixer's
    worker die (or hang) after training, as a crashing or hanging compile would."""
    target, _, kind = os.environ.get("TRAIN_THROUGHPUT_FAULT", "").partition(":")
    if target == name and kind == "abort":
        os.kill(os.getpid(), signal.SIGABRT)
    if target == name and kind == "sleep":
        time.sleep(3600)


def _write_partial(case: dict, item: dict, row: dict) -> None:
    """What the worker knows so far, for the parent in case it dies or hangs later."""
    write_json(Path(case["partial_dir"]) / f"{item['name']}.json", row)


def train_task(case: dict, item: dict) -> dict:
    """Train one mixer for ``item["budget_s"]`` seconds (or ``case["max_steps"]`` steps)."""
    import torch

    from linrnn.bench.report import info_case
    from linrnn.models import CausalLM
    from linrnn.train import (
        TrainConfig,
        _optimizer,
        evaluate,
        get_batch,
        load_bytes,
        lr_at,
        model_config,
        resolve_device,
        train_step,
    )

    startup_s = time.time() - item["launched_at"]
    emit({"event": "stage", "stage": "build"})
    max_steps = case["max_steps"] or None
    cfg = TrainConfig(
        data=case["data"], mixer=item["mixer"], mixer_kwargs=item["mixer_kwargs"],
        d_model=case["d_model"], num_layers=case["layers"], num_heads=case["heads"],
        seq_len=case["T"], batch_size=case["batch"], steps=max_steps or 10**9, lr=case["lr"],
        warmup=case["warmup"], eval_batches=case["eval_batches"], seed=case["seed"],
        device=case["device"], amp=case["amp"], progress=False, plot=False,
    )  # fmt: skip
    device, amp, autocast = resolve_device(cfg)
    torch.manual_seed(cfg.seed)
    train_data, val_data = load_bytes(cfg.data, cfg.val_fraction)
    lm_cfg = model_config(cfg, backend=case["backend"], chunk_size=case["chunk_size"])
    model = CausalLM(lm_cfg, device=device)
    opt = _optimizer(model, cfg, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    gen = torch.Generator().manual_seed(cfg.seed)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    row = {
        "status": "ok", "name": item["name"], "mixer": item["mixer"],
        "mixer_kwargs": item["mixer_kwargs"], "parameters": model.num_parameters(),
        "amp": amp, "backend": case["backend"], "info": info_case(case, item),
        "budget_s": item["budget_s"], "startup_s": startup_s,
    }  # fmt: skip
    emit({"event": "stage", "stage": "first step"})
    budget, planned = item["budget_s"], max_steps
    steps, times, losses, step_s = [], [], [], []
    train_s = 0.0  # wall time of the steps after the first one
    evals, every = [], case["eval_every_s"]
    next_eval = every or math.inf
    splits = {"train": train_data, "val": val_data}

    def run_eval():
        t0 = time.perf_counter()
        ev = evaluate(model, splits, cfg, device, autocast)
        evals.append({"step": step, "time_s": round(train_s, 4), **ev,
                      "eval_s": time.perf_counter() - t0})  # fmt: skip
        return ev

    step = 0
    while (planned is None or step < planned) and (step == 0 or train_s < budget):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        t0 = time.perf_counter()
        x, y = get_batch(train_data, cfg.batch_size, cfg.seq_len, gen, device)
        value = train_step(model, opt, scaler, x, y, autocast, cfg.grad_clip).item()
        dt = time.perf_counter() - t0
        if step == 0:
            row["first_step_s"] = dt
            _write_partial(case, item, row)
            emit({"event": "stage", "stage": "training"})
        else:
            train_s += dt
        steps.append(step)
        times.append(train_s)
        losses.append(value)
        step_s.append(dt)
        step += 1
        if not math.isfinite(value):
            row["status"] = f"diverged: loss {value} at step {step - 1}"
            break
        if planned is None and step == PROBE_STEPS + 1:  # size the cosine schedule
            est = statistics.median(step_s[1:])
            planned = step + max(1, int((budget - train_s) / est))
            cfg.steps = planned
        if train_s >= next_eval and train_s < budget and (planned is None or step < planned):
            run_eval()  # not counted in train_s: the curve's time axis is training only
            while next_eval <= train_s:
                next_eval += every
    timed = step_s[WARM_STEPS:] or step_s[1:] or step_s
    tokens = cfg.batch_size * cfg.seq_len
    row.update(
        steps=step, scheduled_steps=cfg.steps if cfg.steps < 10**9 else step,
        train_time_s=train_s, tokens_per_step=tokens,
        epochs=step * tokens / len(train_data),
        median_step_ms=1e3 * statistics.median(timed),
        tokens_per_s=tokens / statistics.median(timed),
        tokens_per_s_mean=tokens * len(timed) / sum(timed),
        peak_mem_mib=torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
        peak_reserved_mib=torch.cuda.max_memory_reserved(device) / 2**20 if cuda else None,
        last_train_loss=statistics.fmean(losses[-20:]),
        curve={"step": steps, "time_s": [round(t, 4) for t in times],
               "loss": [round(v, 5) for v in losses]},
        step_ms=[round(1e3 * t, 3) for t in step_s], evals=evals,
    )  # fmt: skip
    _write_partial(case, item, row)
    if row["status"] == "ok":
        emit({"event": "stage", "stage": "eval"})
        _fault(item["name"])
        ev = run_eval()
        best = min(evals, key=lambda e: e["val"])
        row.update(
            eval_s=evals[-1]["eval_s"], train_loss=ev["train"], val_loss=ev["val"],
            best_val_loss=best["val"], best_val_step=best["step"],
        )  # fmt: skip
    return row


# --- parent side ----------------------------------------------------------------------------


def _versions() -> dict:
    import torch

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    return {"torch": torch.__version__, "triton": triton, "cuda_runtime": torch.version.cuda}


def _case(args) -> dict:
    keys = ("d_model", "layers", "heads", "T", "batch", "lr", "warmup", "eval_batches",
            "eval_every_s", "seed", "amp", "backend", "chunk_size", "max_steps",
            "threads")  # fmt: skip
    case = {k: getattr(args, k) for k in keys}
    case.update(task="train", device=args.device, data=str(args.data))
    return case


def run(args) -> dict:
    png = args.out.with_suffix(".png")
    partial_dir = args.out.with_name(args.out.stem + "-partial")
    partial_dir.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = {
        "issue": 7,
        "machine": machine_info(_versions(), args.device, args.commit),
        "config": config,
        "precision": f"autocast {args.amp} (auto: bf16 on CUDA, off on CPU), fp32 parameters "
        "and AdamW state (linrnn.train's setting)",
        "results": {},
        "finished": False,
    }  # fmt: skip
    case = dict(_case(args), partial_dir=str(partial_dir))
    env = worker_env()
    t_start = time.monotonic()
    overhead = args.overhead_guess  # worker wall time beyond the training budget
    from_worker = False
    names = list(args.mixers)
    for index, name in enumerate(names):
        left = len(names) - index
        remaining = args.deadline - (time.monotonic() - t_start)
        budget = min(args.budget, (remaining - left * overhead) / left)
        if budget < MIN_BUDGET_S:
            if remaining < MIN_BUDGET_S + overhead:
                report["results"][name] = {"status": "skipped: deadline", "name": name}
                print(f"{name}: skipped ({remaining:.0f} s of the deadline left)", flush=True)
                continue
            budget = MIN_BUDGET_S
        # Room for compilation; a hang may not take the time the later mixers need.
        reserve = (left - 1) * (MIN_BUDGET_S + overhead)
        timeout = max(budget + overhead, min(budget + args.allowance, remaining - reserve))
        mixer, kwargs = VARIANTS[name]
        item = {"name": name, "mixer": mixer, "mixer_kwargs": kwargs, "budget_s": budget,
                "launched_at": time.time()}  # fmt: skip
        print(f"{name}: budget {budget:.1f} s, timeout {timeout:.0f} s", flush=True)
        (partial_dir / f"{name}.json").unlink(missing_ok=True)
        t0 = time.monotonic()
        res = launch(dict(case, items=[item]), timeout, env, args.verbose, command=WORKER)
        wall = time.monotonic() - t0
        if res.rows:
            row = res.rows[0][1]
        elif res.failure:
            row = failure_row(res)
        else:
            row = {"status": "error: the worker returned no result"}
        if row.get("status") != "ok":
            part = partial_dir / f"{name}.json"
            if part.is_file():  # what the worker recorded before it failed
                row = {**json.loads(part.read_text()), **row}
            row.setdefault("stderr_tail", res.stderr_tail[-1500:])
        row.pop("first_in_process", None)
        (partial_dir / f"{name}.json").unlink(missing_ok=True)  # the row has it all now
        row.update(name=name, worker_wall_s=wall, timeout_s=timeout)
        report["results"][name] = row
        info = row.pop("info", None)
        if info and not from_worker:  # the GPU as a worker sees it (the parent stays off CUDA)
            report["machine"] = machine_info(info, args.device, args.commit)
            from_worker = True
        if "train_time_s" in row:
            overhead = max(overhead, wall - row["train_time_s"])
        write_json(args.out, report)
        plot(report, png)
        print(f"{name}: {row['status']} ({wall:.0f} s) {summary(row)}", flush=True)
    if not any(partial_dir.iterdir()):
        partial_dir.rmdir()
    report["finished"] = True
    report["wall_s"] = time.monotonic() - t_start
    write_json(args.out, report)
    print(plot(report, png))
    print(table(report))
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")
    return report


def summary(row: dict) -> str:
    if "tokens_per_s" not in row:
        return ""
    val = row.get("val_loss")
    val = "—" if val is None else f"{val:.3f}"
    return f"{row['tokens_per_s']:,.0f} tok/s, {row['steps']} steps, val {val}"


def _fmt(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def table(report: dict) -> str:
    results = report["results"]
    base = results.get("softmax", {}).get("tokens_per_s")
    rows = []
    for name, r in results.items():
        tps = r.get("tokens_per_s")
        ratio = tps / base if tps and base else None
        params = r.get("parameters")
        rows.append([
            name, _fmt(params and params / 1e6, ".2f"), _fmt(r.get("first_step_s"), ".1f"),
            _fmt(r.get("steps"), "d"), _fmt(r.get("median_step_ms"), ".1f"),
            _fmt(tps, ",.0f"), _fmt(ratio, ".2f"), _fmt(r.get("peak_mem_mib"), ",.0f"),
            _fmt(r.get("epochs"), ".0f"), _fmt(r.get("train_loss"), ".3f"),
            _fmt(r.get("val_loss"), ".3f"), _fmt(r.get("best_val_loss"), ".3f"),
            str(r.get("status", "?"))[:60],
        ])  # fmt: skip
    header = ["mixer", "params M", "first s", "steps", "step ms", "tok/s", "vs softmax",
              "peak MiB", "epochs", "train", "val", "best val", "status"]  # fmt: skip
    return format_table(header, rows, [False] + [True] * 11 + [False])


def _smooth(values: list, beta: float = 0.9) -> list:
    """Bias-corrected exponential moving average (the per-step loss is noisy)."""
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta**i))
    return out


def plot(report: dict, path: Path) -> str:
    """All mixers' train loss (smoothed) and validation loss vs step and vs training time, on
    one figure."""
    try:
        import matplotlib
    except ImportError:
        return "loss plot skipped: matplotlib is not installed (pip install matplotlib==3.10.0)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    low, high = math.inf, -math.inf
    for name, r in report["results"].items():
        curve = r.get("curve")
        if not curve or not curve["loss"]:
            continue
        loss = _smooth(curve["loss"])
        tps = r.get("tokens_per_s")
        label = name if tps is None else f"{name} ({tps:,.0f} tok/s)"
        (line,) = by_step.plot(curve["step"], loss, lw=1.2, label=label)
        by_time.plot(curve["time_s"], loss, lw=1.2, color=line.get_color())
        val = [e["val"] for e in r.get("evals", [])]
        if val:
            style = {"ls": "--", "marker": ".", "lw": 1.0, "color": line.get_color()}
            by_step.plot([e["step"] for e in r["evals"]], val, **style)
            by_time.plot([e["time_s"] for e in r["evals"]], val, **style)
        low = min(low, *loss, *val)
        high = max(high, loss[min(len(loss) - 1, max(len(loss) // 10, 1))], *val)
    if math.isfinite(low):
        by_step.set_ylim(max(low - 0.1, 0.0), max(high, low + 0.5) + 0.1)
    c = report["config"]
    gpu = report["machine"].get("gpu") or report["machine"].get("device")
    fig.suptitle(
        f"byte-level LM, d_model {c['d_model']}, {c['layers']} layers, T {c['T']}, batch "
        f"{c['batch']}, {gpu}: train loss (EMA 0.9, solid), validation (dashed)",
        fontsize=10,
    )
    by_step.set_xlabel("step")
    by_time.set_xlabel("training wall time (s, first step excluded)")
    by_step.set_ylabel("cross-entropy (nats / byte)")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"loss plot: {path}"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mixers", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("-T", type=int, default=2048, help="training sequence length (bytes)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--budget", type=float, default=40.0,
                   help="seconds of training per mixer after its first step (40)")  # fmt: skip
    p.add_argument("--max-steps", type=int, default=0, help="also stop after N steps (0: off)")
    p.add_argument("--deadline", type=float, default=480.0,
                   help="seconds for the whole run; later mixers get less time (480)")  # fmt: skip
    p.add_argument("--allowance", type=float, default=150.0,
                   help="a worker's timeout is its budget plus this much (150)")  # fmt: skip
    p.add_argument("--overhead-guess", type=float, default=15.0,
                   help="expected start-up + first step + evals per mixer, in s (15; an H200 "
                   "took 6-13 s)")  # fmt: skip
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--eval-batches", type=int, default=4,
                   help="batches per evaluation (linrnn.train's fixed ones; 4)")  # fmt: skip
    p.add_argument("--eval-every-s", type=float, default=2.0,
                   help="also evaluate every N s of training (0: at the end only; 2)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--amp", default="auto", choices=["auto", "bf16", "fp16", "off"],
                   help="autocast dtype (auto: bf16 on CUDA, off on CPU, as linrnn.train); "
                   "parameters and optimizer state stay fp32")  # fmt: skip
    p.add_argument("--backend", default=None, choices=["torch", "triton"],
                   help="linrnn op backend (default: the library's choice)")  # fmt: skip
    p.add_argument("--chunk-size", default=None,
                   help="linrnn chunk size (int or 'auto'; default: the library's)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per worker")
    p.add_argument("--data", type=Path, default=ROOT / "data" / "shakespeare.txt")
    p.add_argument("--device", default=None, help="cuda (when available) or cpu")
    p.add_argument("--commit", default=None, help="git commit to record (else git's HEAD)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/train-throughput.json")
    p.add_argument("--tiny", action="store_true",
                   help="tiny model, few steps, PyTorch path: checks the script")  # fmt: skip
    p.add_argument("--plot-only", action="store_true", help="redraw the PNG of --out's JSON")
    p.add_argument("--verbose", action="store_true", help="show the workers' output")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.chunk_size not in (None, "auto"):
        args.chunk_size = int(args.chunk_size)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    if args.tiny:
        args.d_model, args.layers, args.heads, args.T, args.batch = 32, 1, 2, 64, 4
        args.max_steps, args.warmup, args.eval_batches = args.max_steps or 6, 2, 1
        args.budget, args.overhead_guess = min(args.budget, 20.0), min(args.overhead_guess, 10.0)
        args.backend = args.backend or "torch"
        args.threads = args.threads or 1
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker is not None:
        return serve(args.worker, {"train": train_task})
    if args.plot_only:
        print(plot(json.loads(args.out.read_text()), args.out.with_suffix(".png")))
        return 0
    report = run(args)
    ok = [r for r in report["results"].values() if r.get("status") == "ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
