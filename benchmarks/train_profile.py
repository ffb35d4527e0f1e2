"""Where a training step's GPU time goes: one step of the ``train`` suite's model per mixer
(:mod:`linrnn.bench.training`: the byte-level LM, AdamW and :func:`linrnn.train.train_step`,
autocast in the benchmark dtype) under ``torch.profiler``, each kernel's device time per step
(``benchmarks/kernel_times.py``'s measurement), summed by kind:

    mixer      the token mixer's op: linrnn's engine kernels, or SDPA's attention kernels
    glue       linrnn's layer-glue kernels (norm_gate, short_conv, token_mix, swiglu)
    gemm       matrix products (projections, the MLP, the LM head)
    optimizer  multi-tensor kernels: AdamW's update, gradient clipping's norms
    torch      every other kernel (elementwise, reductions, copies, the loss)

and the step's wall time (synchronized, without the profiler); "host" is the wall time not
covered by kernels, where the GPU waited for the host; "launches" counts the step's kernels
by kind (each is host work: docs/tuning.md has a Triton launch at about 25 µs of the GPU
machine's host). With ``--cuda-graph`` also the step replayed from a CUDA graph
(:class:`linrnn.train.GraphedStep` on the same model, after the eager steps): ``graph_ms``,
what the step costs without the host's share::

    python3 benchmarks/train_profile.py --mixers softmax gla rwkv6 --seq-len 8192 --out p.json

Without a GPU it profiles the suite's CPU model on the PyTorch path, by top-level operator (a
check of the command, not a timing).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import json
import pkgutil
import statistics
import sys
import time
from pathlib import Path

import torch


def _kernel_times():
    """benchmarks/kernel_times.py, this script's neighbour (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "linrnn_kernel_times", Path(__file__).with_name("kernel_times.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KT = _kernel_times()  # its profile (the per-kernel measurement) and short_name
KINDS = ("mixer", "glue", "gemm", "optimizer", "torch")
GLUE_MODULES = ("norm_gate", "short_conv", "token_mix", "swiglu")
ATTENTION = ("flash", "fmha", "attention")  # SDPA's kernels on CUDA, its operators on the CPU
GEMM = ("gemm", "xmma", "cutlass", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm",
        "aten::linear", "aten::matmul", "mmbackward")  # fmt: skip
OPTIMIZER = ("multi_tensor_apply", "foreach", "adam")


def engine_kernels() -> dict[str, str]:
    """{kernel name: "glue" or "mixer"} for every Triton function of :mod:`linrnn.engine`."""
    import linrnn.engine

    names = {}
    for info in pkgutil.iter_modules(linrnn.engine.__path__):
        try:
            module = importlib.import_module(f"linrnn.engine.{info.name}")
        except ImportError:  # no Triton: the CPU path has no engine kernels
            continue
        for obj in vars(module).values():
            fn = getattr(obj, "fn", None)  # a JITFunction's (or the interpreter's) Python body
            if callable(fn) and getattr(fn, "__module__", None) == module.__name__:
                names[fn.__name__] = "glue" if info.name in GLUE_MODULES else "mixer"
    return names


def kind_of(name: str, engine: dict[str, str]) -> str:
    """The kind of one kernel (or CPU operator) by its name."""
    if name in engine:
        return engine[name]
    low = name.lower()
    for kind, keys in (("mixer", ATTENTION), ("optimizer", OPTIMIZER), ("gemm", GEMM)):
        if any(k in low for k in keys):
            return kind
    return "torch"


def build_step(name: str, T: int, B: int, dtype: str, device: str):
    """``(once, parameters, graphed)``: one training step of the suite's model with mixer
    ``name`` on a fixed batch (the suite's data, model, optimizer and precision:
    :func:`linrnn.bench.training.build_run`), and a maker of the same step as a CUDA-graph
    replay on that model (:class:`linrnn.train.GraphedStep`; the eager step must not run after
    it: the optimizer's learning rate becomes a device tensor)."""
    from linrnn.bench import training
    from linrnn.train import AMP_DTYPES, GraphedStep, get_batch, train_step

    mixer, kwargs = training.VARIANTS[name]
    cuda = device == "cuda"
    case = dict(
        data=str(training._default_data()), mixer=mixer, mixer_kwargs=kwargs,
        **(training.GPU_MODEL if cuda else training.CPU_MODEL), lr=1e-3, warmup=2,
        eval_batches=1, seed=0, device=device, dtype=dtype,
        backend=None if mixer == "softmax" or cuda else "torch", chunk=None,
    )  # fmt: skip
    cfg, dev, amp, autocast, model, opt, scaler, data, _ = training.build_run(case, B, T, 1000)
    x, y = get_batch(data, B, T, torch.Generator().manual_seed(0), dev)

    def once():  # the loss, not synchronized: .item() waits for the step
        return train_step(model, opt, scaler, x, y, autocast, cfg.grad_clip)

    def graphed():
        step = GraphedStep(model, opt, AMP_DTYPES[amp], cfg.grad_clip)
        return lambda: step(x, y, cfg.lr)

    return once, model.num_parameters(), graphed


def _wall_ms(step, n: int) -> float:
    """The median wall time of ``n`` synchronized calls of ``step`` (ms)."""
    wall = []
    for _ in range(n):
        t0 = time.perf_counter()
        step().item()
        wall.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(wall)


def profile_mixer(name: str, T: int, B: int, dtype: str, steps: int, timed: int = 10,
                  graph: bool = False) -> dict:  # fmt: skip
    """One row: the step's wall time (the median of ``timed`` steps after the profiled ones),
    the host's time to queue it (until the step returns, before the loss is read: a queue time
    near the step time leaves the GPU waiting on launches), its kernels by kind (over
    ``steps`` profiled steps) and the largest kernels; with ``graph`` also the median of
    ``timed`` CUDA-graph replays of the step after its warm-up and capture (graph_ms)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    once, params, graphed = build_step(name, T, B, dtype, device)
    kernels, total = KT.profile(lambda: once().item(), steps, device)
    wall, queue = [], []
    for _ in range(timed):
        t0 = time.perf_counter()
        loss = once()
        queue.append(time.perf_counter() - t0)
        loss.item()
        wall.append(time.perf_counter() - t0)
    engine = engine_kernels()
    kinds = collections.Counter({k: 0.0 for k in KINDS})
    launches = collections.Counter({k: 0.0 for k in KINDS})
    for kernel, (ms, n) in kernels.items():
        kinds[kind_of(kernel, engine)] += ms
        launches[kind_of(kernel, engine)] += n
    step_ms = 1e3 * statistics.median(wall)
    graph_ms = None
    if graph:
        # The last eager loss keeps its autograd graph, and with it each parameter's gradient
        # accumulator made on the default stream: a capture on the graph's side stream that
        # meets those accumulators is invalidated.
        del loss
        replay = graphed()
        for _ in range(3):  # two eager warm-up steps, then the capture and its first replay
            replay().item()
        graph_ms = round(_wall_ms(replay, timed), 3)
    return dict(
        mixer=name, shape=f"B{B}-T{T}", dtype=dtype, device=device, parameters=params,
        steps=steps, timed_steps=timed, step_ms=round(step_ms, 3), kernels_ms=total,
        host_ms=round(max(0.0, step_ms - total), 3),
        queue_ms=round(1e3 * statistics.median(queue), 3), graph_ms=graph_ms,
        kinds={k: round(kinds[k], 4) for k in KINDS},
        launches={k: round(launches[k], 2) for k in KINDS},
        top=[(k, ms, n, kind_of(k, engine)) for k, (ms, n) in list(kernels.items())[:12]],
    )  # fmt: skip


def print_rows(rows: list) -> None:
    head = f"{'mixer':<16} {'step ms':>8} {'kernels':>8} " + " ".join(f"{k:>9}" for k in KINDS)
    print(head + f" {'host':>8} {'queue':>8} {'launches':>8} {'graph':>8}")
    for r in rows:
        cells = " ".join(f"{r['kinds'][k]:9.2f}" for k in KINDS)
        graph = "—" if r.get("graph_ms") is None else f"{r['graph_ms']:.2f}"
        print(f"{r['mixer']:<16} {r['step_ms']:8.2f} {r['kernels_ms']:8.2f} {cells} "
              f"{r['host_ms']:8.2f} {r['queue_ms']:8.2f} "
              f"{sum(r['launches'].values()):8.0f} {graph:>8}")  # fmt: skip
    print("launches per step by kind: " + ", ".join(
        f"{r['mixer']} " + "/".join(f"{r['launches'][k]:g}" for k in KINDS) for r in rows
    ))  # fmt: skip
    for r in rows:
        print(f"\n{r['mixer']} {r['shape']} {r['dtype']} ({r['device']}): largest kernels")
        for kernel, ms, n, kind in r["top"]:
            print(f"  {KT.short_name(kernel):<58} {ms:9.3f} ms  ×{n:g}  {kind}")


def main(argv=None) -> int:
    from linrnn.bench import training

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixers", nargs="+", default=list(training.VARIANTS),
                    choices=list(training.VARIANTS))  # fmt: skip
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="sequences per step (default: the suite's tokens per step / T)",
    )
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--steps", type=int, default=3, help="profiled steps")
    ap.add_argument(
        "--timed-steps",
        type=int,
        default=10,
        help="steps timed without the profiler after them (their median)",
    )
    ap.add_argument(
        "--cuda-graph",
        action="store_true",
        help="also time the step replayed from a CUDA graph (graph_ms; eager on a CPU)",
    )
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    tokens = training.GPU_TOKENS if cuda else training.CPU_TOKENS
    B = a.batch or max(1, tokens // a.seq_len)
    rows = []
    for name in a.mixers:
        try:
            rows.append(profile_mixer(name, a.seq_len, B, a.dtype, a.steps, a.timed_steps,
                                      a.cuda_graph))  # fmt: skip
        except Exception as e:  # one failing mixer does not lose the others' rows
            print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
        if cuda:
            torch.cuda.empty_cache()
    print_rows(rows)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
