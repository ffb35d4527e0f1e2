"""The ``train`` suite: whole-model training throughput of every mixer beside softmax attention.

One row per mixer and sequence length: the byte-level language model of :mod:`linrnn.train`
(``CausalLM`` with the trainer's SwiGLU blocks and RMSNorm, the shipped corpus with its 10 %
validation tail, AdamW with the trainer's parameter groups — fused on CUDA —, warm-up + cosine
schedule, gradient clipping 1.0, :func:`linrnn.train.train_step`), with only the token mixer
changed. Softmax attention (``SoftmaxAttention``: torch SDPA, flash on CUDA) runs first as the
baseline of every ratio. Precision is the trainer's: autocast in the benchmark dtype (bf16 on
CUDA, off on CPU) with fp32 parameters and fp32 AdamW state. The run is eager, or with
``--cuda-graph`` every step after the first two is a replay of one captured CUDA graph
(:class:`linrnn.train.GraphedStep`, softmax's too): the same steps without the host's launch
work, which in eager mode takes about as long as the GPU's (the rows say which).

Model (:data:`GPU_MODEL`): width 512, 6 blocks, 4 heads (head dim 128), vocabulary 256: about
19-25 M parameters depending on the mixer. Every step holds :data:`GPU_TOKENS` = 65,536 tokens
(``--batch`` changes it): B = 8 at T = 8192, B = 32 at T = 2048, so the lengths differ only in
context. On a CPU the suite runs :data:`CPU_MODEL` at B = 4, T = 64 for :data:`CPU_STEPS` steps
on the PyTorch path (a smoke test of the harness, seconds).

Per mixer, in its own worker process (:mod:`linrnn.bench.worker`; a crash or a timeout is the
row's status, with what the worker measured before it in the row): ``train_s`` seconds of
steps after the first one (the cosine schedule is sized from the median of the first
:data:`PROBE_STEPS` steps, so each mixer reaches its end), or ``max_steps`` steps. Recorded:
parameters, the first step's time (compilation and autotuning included, unless a shared Triton
cache already held the kernels), the median step time and tokens/s over the steps after
:data:`WARM_STEPS`, the mean tokens/s, peak memory (``max_memory_allocated`` over the run,
model and optimizer state included), the training loss of every step (against the step and the
training time, evaluations not counted), train and validation loss on the trainer's fixed
evaluation batches every ``eval_every_s`` seconds of training and at the end, the best
validation loss and the epochs over the corpus. The corpus is small (≈ 250 KB of training
bytes, ≈ 4 steps per epoch at 65,536 tokens a step): the models run many epochs and overfit,
so the validation curve (and its best point) says more than its last value. Ratios:
``tokens_per_s_vs_softmax`` (tokens/s over softmax's at the same shape) and the targets of
:data:`TARGETS`.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from linrnn.bench import registry, report
from linrnn.bench.worker import emit

# name -> (LMConfig.mixer, mixer_kwargs); softmax first: the baseline of the ratios.
VARIANTS = {
    "softmax": ("softmax", {}),
    "linear_attn": ("linear_attn", {}),
    "retention": ("retention", {}),
    "simple_gla": ("simple_gla", {}),
    "gla": ("gla", {}),
    "rwkv6": ("rwkv6", {}),
    "mlstm_exp": ("mlstm", {"input_gate": "exp"}),
    "mlstm_sig": ("mlstm", {"input_gate": "sigmoid"}),
    "delta_net": ("delta_net", {}),
    "gated_delta_net": ("gated_delta_net", {}),
    "mamba2": ("mamba2", {}),
}
BASELINE = "softmax"
GPU_MODEL = {"d_model": 512, "layers": 6, "heads": 4}
CPU_MODEL = {"d_model": 32, "layers": 1, "heads": 2}
GPU_TOKENS = 65_536  # tokens per step on CUDA: B·T
CPU_TOKENS = 256  # B4-T64
CPU_STEPS = 6  # steps on a CPU unless --max-steps
DEFAULT_SECONDS = 20.0  # training seconds per mixer after its first step (--train-seconds)
OVERHEAD_S = 30.0  # what a CUDA worker needs beyond its training seconds (start, compile, evals)
PROBE_STEPS = 5  # steps after the first one that size the schedule to the budget
WARM_STEPS = 3  # steps (the first included) left out of the median and mean step time
# (name, bound): tokens/s ratios the suite checks per shape (one run, side by side).
TARGETS = (
    ("linear mixer tokens/s / softmax's", ">= 1.5"),
    ("rwkv6 tokens/s / gla's", ">= 0.7"),
)


def run_shape(B: int, T: int) -> str:
    """The item id of a training shape: ``B8-T8192`` (sequences per step, their length)."""
    return f"B{B}-T{T}"


def parse_run_shape(shape: str) -> tuple[int, int]:
    """``(B, T)`` of :func:`run_shape`'s id; ``ValueError`` for another string."""
    m = re.fullmatch(r"B(\d+)-T(\d+)", shape)
    if not m or min(int(m[1]), int(m[2])) < 1:
        raise ValueError(f"training shape {shape!r}: expected B<batch>-T<length>, e.g. B8-T8192")
    return int(m[1]), int(m[2])


# --- worker side ----------------------------------------------------------------------------


def _stage(case: dict, name: str) -> None:
    if not case.get("in_process"):
        emit({"event": "stage", "stage": name})


def build_run(case: dict, B: int, T: int, steps: int):
    """``(cfg, device, amp, autocast, model, opt, scaler, train_data, val_data)``: the
    trainer's config, model, optimizer and data for one mixer of a case (its keys as
    :func:`plan` makes them) at B sequences of T tokens, scheduled for ``steps`` steps."""
    import torch

    from linrnn.models import CausalLM
    from linrnn.train import (
        TrainConfig,
        data_on,
        load_bytes,
        make_optimizer,
        model_config,
        resolve_device,
    )

    amp = {"bf16": "bf16", "fp16": "fp16", "fp32": "off"}[case["dtype"]]
    cfg = TrainConfig(
        data=case["data"], mixer=case["mixer"], mixer_kwargs=case["mixer_kwargs"],
        d_model=case["d_model"], num_layers=case["layers"], num_heads=case["heads"],
        seq_len=T, batch_size=B, steps=steps, lr=case["lr"],
        warmup=case["warmup"], eval_batches=case["eval_batches"], seed=case["seed"],
        device=case["device"], amp=amp, progress=False, plot=False,
    )  # fmt: skip
    device, amp, autocast = resolve_device(cfg)
    torch.manual_seed(cfg.seed)
    train_data, val_data = data_on(device, *load_bytes(cfg.data, cfg.val_fraction))
    lm_cfg = model_config(cfg, backend=case["backend"], chunk_size=case["chunk"])
    model = CausalLM(lm_cfg, device=device)
    opt = make_optimizer(model, cfg, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    return cfg, device, amp, autocast, model, opt, scaler, train_data, val_data


def train_case(case: dict, item: dict) -> dict:
    """Train one mixer at ``item["shape"]`` for ``case["train_s"]`` seconds after its first
    step (or ``case["max_steps"]`` steps); the row of the module docstring."""
    import torch

    from linrnn.train import AMP_DTYPES, GraphedStep, evaluate, get_batch, lr_at, set_lr, train_step

    _stage(case, "build")
    B, T = parse_run_shape(item["shape"])
    max_steps = case["max_steps"] or None
    cfg, device, amp, autocast, model, opt, scaler, train_data, val_data = build_run(
        case, B, T, max_steps or 10**9
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    cuda = device.type == "cuda"
    graphed = None
    if case.get("cuda_graph"):
        graphed = GraphedStep(model, opt, AMP_DTYPES[amp], cfg.grad_clip)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    row = {"status": "ok", "parameters": model.num_parameters(), "amp": amp,
           "train_s": case["train_s"]}  # fmt: skip
    partial = Path(case["partial"]) if case.get("partial") else None
    _stage(case, "first step")
    budget, planned = case["train_s"], max_steps
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

    def measured() -> dict:
        timed = step_s[WARM_STEPS:] or step_s[1:] or step_s
        tokens = B * T
        return dict(
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
            step_times_ms=[round(1e3 * t, 3) for t in step_s], evals=evals,
        )  # fmt: skip

    step = 0
    while (planned is None or step < planned) and (step == 0 or train_s < budget):
        t0 = time.perf_counter()
        x, y = get_batch(train_data, cfg.batch_size, cfg.seq_len, gen, device)
        if graphed is not None:
            value = graphed(x, y, lr_at(step, cfg)).item()
        else:
            set_lr(opt, lr_at(step, cfg))
            value = train_step(model, opt, scaler, x, y, autocast, cfg.grad_clip).item()
        dt = time.perf_counter() - t0
        if step == 0:
            row["first_step_s"] = dt
            if partial:  # for the parent, should the worker die later
                report.write_json(partial, row)
            _stage(case, "training")
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
    row.update(measured())
    if partial:
        report.write_json(partial, row)
    if row["status"] == "ok":
        _stage(case, "eval")
        ev = run_eval()
        best = min(evals, key=lambda e: e["val"])
        row.update(
            eval_s=evals[-1]["eval_s"], train_loss=ev["train"], val_loss=ev["val"],
            best_val_loss=best["val"], best_val_step=best["step"],
        )  # fmt: skip
    return row


# --- planning and rows ----------------------------------------------------------------------


def _partial_dir() -> Path:
    """Where the workers of this run leave what they measured before the end of an item."""
    return Path(tempfile.gettempdir()) / f"linrnn-bench-train-{os.getpid()}"


def plan(args, suite: registry.Suite, device: str, common: dict) -> tuple[list, list]:
    """One case per sequence length × mixer (softmax first at each length), one item each: a
    worker process per mixer."""
    cuda = device == "cuda"
    model = GPU_MODEL if cuda else CPU_MODEL
    lengths = args.seq_len or [parse_run_shape(s)[1] for s in suite.shapes_for("", device)]
    tokens = GPU_TOKENS if cuda else CPU_TOKENS
    names = [n for n in VARIANTS if n in (args.mixers or VARIANTS)]  # softmax first
    train_s = DEFAULT_SECONDS if args.train_seconds is None else args.train_seconds
    max_steps = args.max_steps if args.max_steps is not None else (0 if cuda else CPU_STEPS)
    common = dict(
        common, task="train", data=str(_default_data()), **model, lr=1e-3,
        warmup=20 if cuda else 2, eval_batches=4 if cuda else 1,
        eval_every_s=3.0 if cuda else 0.0, train_s=train_s, max_steps=max_steps,
        needs_s=train_s + OVERHEAD_S if cuda else 0.0, cuda_graph=bool(args.cuda_graph and cuda),
    )  # fmt: skip
    cases, shapes = [], []
    for T in lengths:
        B = args.batch or max(1, tokens // T)
        shape = run_shape(B, T)
        shapes.append(f"{shape} ({B * T:,} tokens per step)")
        for name in names:
            mixer, kwargs = VARIANTS[name]
            backend = None if mixer == "softmax" else (args.backend or (None if cuda else "torch"))
            chunk = None if mixer == "softmax" else (args.chunk_sizes or (None,))[0]
            partial = _partial_dir() / f"{name}-{shape}.json"
            case = dict(common, op=name, mode=None, backend=backend, chunk=chunk, mixer=mixer,
                        mixer_kwargs=kwargs, partial=str(partial))  # fmt: skip
            cases.append((case, [{"shape": shape}]))
    precision = "no autocast" if common["dtype"] == "fp32" else f"{common['dtype']} autocast"
    notes = [
        f"train: byte-level LM, width {model['d_model']}, blocks {model['layers']}, "
        f"heads {model['heads']}, {', '.join(shapes)}; {precision}, fp32 parameters and AdamW "
        f"state; {train_s:g} s of training per mixer"
        + (f" or {max_steps} steps" if max_steps else "")
        + ("; steps replayed from a CUDA graph" if common["cuda_graph"] else "; eager steps")
    ]
    return cases, notes


def _default_data() -> Path:
    from linrnn.train import DEFAULT_DATA

    return DEFAULT_DATA


def full_row(case: dict, item: dict, row: dict, spec: dict | None) -> dict:
    """The report row of one mixer: the case's settings and the worker's measurements; after a
    worker died, what it recorded before (its partial file) under the failure's status."""
    B, T = parse_run_shape(item["shape"])
    full = {k: None for k in report.ROW_KEYS}
    full.update(
        op=case["op"], library="torch" if case["mixer"] == "softmax" else "linrnn",
        family=case["mixer"], mode=None, backend=case["backend"], chunk=case["chunk"],
        chunk_requested=case["chunk"], shape=item["shape"], dtype=case["dtype"],
        suite=case["suite"], mixer=case["mixer"], mixer_kwargs=case["mixer_kwargs"],
        batch=B, seq_len=T, cuda_graph=case.get("cuda_graph", False),
        model={k: case[k] for k in ("d_model", "layers", "heads")},
    )  # fmt: skip
    partial = Path(case["partial"]) if case.get("partial") else None
    if partial and partial.is_file():
        if not report.ok_status(row.get("status", "")):
            full.update(json.loads(partial.read_text()))
        partial.unlink(missing_ok=True)
        try:
            partial.parent.rmdir()
        except OSError:  # other workers' files still there
            pass
    full.update(row)
    full.pop("first_in_process", None)
    return full


def add_ratios(rows: list[dict]) -> None:
    """Set ``tokens_per_s_vs_softmax`` on every train row: its tokens/s over the softmax row's
    at the same shape and dtype, both eager or both graphed (None where either is missing)."""
    key = lambda r: (r["shape"], r["dtype"], bool(r.get("cuda_graph")))  # noqa: E731
    base = {key(r): r.get("tokens_per_s") for r in rows
            if r.get("suite") == "train" and r["op"] == BASELINE}  # fmt: skip
    for r in rows:
        if r.get("suite") == "train":
            b, tps = base.get(key(r)), r.get("tokens_per_s")
            r["tokens_per_s_vs_softmax"] = tps / b if tps and b else None


def _verdict(value, bound: str) -> str:
    if value is None:
        return "—"
    op, limit = bound.split()
    return "met" if (value >= float(limit) if op == ">=" else value <= float(limit)) else "missed"


def targets(rows: list[dict]) -> list[dict]:
    """:data:`TARGETS` per shape: every linear mixer's tokens/s over softmax's, and RWKV6's
    over GLA's; ``{"target", "shape", "mixer", "value", "bound", "verdict"}``."""
    add_ratios(rows)
    out = []
    by = {(r["op"], _run(r)): r for r in rows if r.get("suite") == "train"}
    (linear, bound), (rwkv, rwkv_bound) = TARGETS
    for shape in dict.fromkeys(run for _op, run in by):
        if (BASELINE, shape) not in by:
            continue
        for (op, s), r in by.items():
            if s == shape and op != BASELINE:
                value = r.get("tokens_per_s_vs_softmax")
                out.append(dict(target=linear, shape=shape, mixer=op, value=value, bound=bound,
                                verdict=_verdict(value, bound)))  # fmt: skip
        mine, gla = by.get(("rwkv6", shape)), by.get(("gla", shape))
        if mine and gla:
            a, b = mine.get("tokens_per_s"), gla.get("tokens_per_s")
            value = a / b if a and b else None
            out.append(dict(target=rwkv, shape=shape, mixer="rwkv6", value=value,
                            bound=rwkv_bound, verdict=_verdict(value, rwkv_bound)))  # fmt: skip
    return out


# --- tables ---------------------------------------------------------------------------------


def _run(r: dict) -> str:
    """A row's shape, marked "graph" where its steps were CUDA-graph replays."""
    return r["shape"] + (" graph" if r.get("cuda_graph") else "")


def _num(value, fmt: str) -> str:
    return value if isinstance(value, str) else "—" if value is None else format(value, fmt)


HEADER = ("mixer", "shape", "params M", "first s", "steps", "step ms", "tokens/s", "vs softmax",
          "peak MiB", "epochs", "train", "val", "best val", "status")  # fmt: skip
NUMERIC = (0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0)
TARGET_HEADER = ("target", "shape", "mixer", "value", "bound", "verdict")


def cells(r: dict) -> tuple:
    params = r.get("parameters")
    first = _num(r.get("first_step_s"), ".1f")
    if r.get("first_step_s") is not None and r.get("triton_cache") == "shared":
        first += "c"
    return (
        r["op"], _run(r), _num(params and params / 1e6, ".2f"), first,
        _num(r.get("steps"), "d"), _num(r.get("median_step_ms"), ".1f"),
        _num(r.get("tokens_per_s"), ",.0f"), _num(r.get("tokens_per_s_vs_softmax"), ".2f"),
        _num(r.get("peak_mem_mib"), ",.0f"), _num(r.get("epochs"), ".0f"),
        _num(r.get("train_loss"), ".3f"), _num(r.get("val_loss"), ".3f"),
        _num(r.get("best_val_loss"), ".3f"), str(r.get("status", "?"))[:60],
    )  # fmt: skip


def target_cells(rows: list[dict]) -> list[tuple]:
    return [(t["target"], t["shape"], t["mixer"], _num(t["value"], ".2f"), t["bound"],
             t["verdict"]) for t in targets(rows)]  # fmt: skip


def table(rows: list[dict]) -> str:
    """The rows and the targets as plain text."""
    add_ratios(rows)
    text = report.format_table(HEADER, [cells(r) for r in rows], NUMERIC)
    tcells = target_cells(rows)
    if tcells:
        text += "\n\ntargets:\n" + report.format_table(TARGET_HEADER, tcells, (0, 0, 0, 1, 0, 0))
    return text


SUMMARY = (
    'train, {dtype} (autocast; fp32: none), fp32 parameters and AdamW state; shape "graph": '
    "steps replayed from a CUDA graph (both warm-up steps eager); step ms = median "
    f"step after {WARM_STEPS} warm-up steps (batch, forward, backward, clipping, AdamW); "
    "tokens/s = tokens per step / step ms; vs softmax = tokens/s over softmax's (SDPA) at the "
    "same shape; first s = first step (c: shared Triton cache); peak = max_memory_allocated "
    "over the run; train / val = loss (nats/byte) on fixed batches at the end; best val over "
    "the periodic evaluations"
)


def markdown_lines(rows: list[dict]) -> list[str]:
    """The train rows as Markdown: the table, the note on what it shows, the targets."""
    add_ratios(rows)
    lines = ["", SUMMARY.format(dtype=rows[0].get("dtype") if rows else "?") + ".", ""]
    lines += report.md_table(HEADER, [cells(r) for r in rows])
    tcells = target_cells(rows)
    if tcells:
        lines += ["", "### targets", ""]
        lines += report.md_table(TARGET_HEADER, tcells)
    lines += ["", "Loss curves: `loss-curves-<shape>.png` in the folder named after the JSON "
              "(matplotlib; `linrnn bench --report <json> --plots` redraws them)."]  # fmt: skip
    return lines
