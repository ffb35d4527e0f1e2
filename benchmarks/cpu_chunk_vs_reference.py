"""CPU benchmark: the torch chunk engine (``mode="chunk"``) against the reference loop
(``mode="reference"``), forward and forward+backward, for every family variant.

    python benchmarks/cpu_chunk_vs_reference.py                 # B=1, T=4096, H=4, K=V=64, fp32
    python benchmarks/cpu_chunk_vs_reference.py --quick         # tiny shapes, smoke test
    python benchmarks/cpu_chunk_vs_reference.py --families gla mlstm --repeats 3

Inputs are the self-check's seeded recipe (:data:`linrnn.selfcheck.VARIANTS`: log decays are
``logsigmoid(randn) / 16`` as in GLA's layers, ``--decay-normalizer 1`` for strong decays;
rwkv6's u is ``randn``; mLSTM's i, f are ``randn`` and ``randn + 3``).
Times are wall-clock (``time.perf_counter``) medians, with the minimum kept alongside (the
table's speedup in parentheses is the ratio of minima); one warm-up call is excluded. The chunk
engine is timed at its default chunk size and at each of ``--chunk-sizes``. The reference's
forward+backward warm-up runs at T=128 (its one-time costs do not depend on T, and a
full-length warm-up would double the slowest part of the run). Forward is timed under
``torch.no_grad()``; forward+backward is ``((o * do).sum()).backward()`` with gradients for
every tensor input. Threads: torch's default unless ``--threads``. Run on an otherwise idle
machine: with other processes on the cores, multi-threaded torch ops slow down by an order of
magnitude (the JSON records the load average at the start). Prints a table and writes JSON
(machine, config, per-variant times, speedups, and the chunk output's error against the
reference).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from linrnn.ops._generic import DEFAULT_CHUNK_SIZE
from linrnn.selfcheck import (
    DECAY_NORMALIZER,
    VARIANTS,
    make_inputs,
    map_tensors,
    rel_err,
    run,
)

ROOT = Path(__file__).resolve().parents[1]
FULL = dict(B=1, T=4096, H=4, K=64, V=64)
QUICK = dict(B=1, T=48, H=2, K=16, V=16)
REF_WARMUP_T = 128


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def git(*args):
        try:
            out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
            return out.stdout.strip() if out.returncode == 0 else None
        except OSError:
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def time_ms(fn, repeats: int, warmup=None) -> tuple[float, float]:
    """``(median, min)`` wall time of ``fn()`` in ms over ``repeats`` calls, after one untimed
    call of ``warmup`` (default: ``fn`` itself). The median is the figure quoted; the minimum
    is kept too because on a shared VM bursts of contention inflate whole runs of calls."""
    (warmup or fn)()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times), 1e3 * min(times)


def leaf_inputs(variant, shape, seed, normalizer):
    """Inputs as leaf tensors that require grad, plus a fixed output gradient ``do``."""
    args, kwargs = make_inputs(variant, **shape, seed=seed, normalizer=normalizer)
    args, kwargs = map_tensors(args, kwargs, lambda x: x.detach().requires_grad_())
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(*args[2].shape, generator=gen)
    return args, kwargs, do


def timers(variant, shape, seed, normalizer, **call):
    """``(fwd, fwd_bwd)`` closures for one variant, shape and call configuration."""
    args, kwargs, do = leaf_inputs(variant, shape, seed, normalizer)

    def fwd():
        with torch.no_grad():
            return run(variant, args, kwargs, **call)[0]

    def fwd_bwd():
        for x in [*args, *kwargs.values()]:
            x.grad = None
        o, _ = run(variant, args, kwargs, **call)
        (o * do).sum().backward()

    return fwd, fwd_bwd


def bench_variant(variant, shape, chunk_sizes, repeats, ref_repeats, seed, normalizer) -> dict:
    ref = dict(mode="reference")
    fwd, fwd_bwd = timers(variant, shape, seed, normalizer, **ref)
    small = dict(shape, T=min(shape["T"], REF_WARMUP_T))
    _, warm_fwd_bwd = timers(variant, small, seed, normalizer, **ref)
    o_ref = fwd()  # the chunk outputs are checked against it; also the forward's warm-up
    res = {
        "variant": variant.name,
        "family": variant.family,
        "options": variant.options,
        "chunk": {},
    }
    res["ref_fwd_ms"], res["ref_fwd_min_ms"] = time_ms(fwd, ref_repeats, warmup=lambda: None)
    res["ref_fwdbwd_ms"], res["ref_fwdbwd_min_ms"] = time_ms(
        fwd_bwd, ref_repeats, warmup=warm_fwd_bwd
    )
    for L in chunk_sizes:
        fwd, fwd_bwd = timers(variant, shape, seed, normalizer, mode="chunk", chunk_size=L)
        (f_med, f_min), (fb_med, fb_min) = time_ms(fwd, repeats), time_ms(fwd_bwd, repeats)
        res["chunk"][str(L)] = {
            "fwd_ms": f_med,
            "fwd_min_ms": f_min,
            "fwdbwd_ms": fb_med,
            "fwdbwd_min_ms": fb_min,
            "out_err_vs_ref": rel_err(fwd(), o_ref),  # same fp32 inputs, ‖a−b‖/‖b‖
        }
    default = res["chunk"][str(DEFAULT_CHUNK_SIZE)]
    res["default_chunk_size"] = DEFAULT_CHUNK_SIZE
    for key, label in (("fwd_ms", "fwd"), ("fwdbwd_ms", "fwdbwd")):
        best_L = min(res["chunk"], key=lambda L: res["chunk"][L][key])
        best_ms = res["chunk"][best_L][key]
        res[f"chunk_{label}_ms"] = default[key]
        res[f"speedup_{label}"] = res[f"ref_{label}_ms"] / default[key]
        res[f"speedup_{label}_of_min"] = res[f"ref_{label}_min_ms"] / default[f"{label}_min_ms"]
        res[f"best_{label}"] = {
            "chunk_size": int(best_L),
            "ms": best_ms,
            "speedup": res[f"ref_{label}_ms"] / best_ms,
        }
    return res


def format_table(results: list[dict], markdown: bool = False) -> str:
    """Aligned plain-text table, or a Markdown table (for the README)."""
    header = ("family", "ref fwd ms", "chunk fwd ms", "speedup fwd (of min)",
              "ref fwd+bwd ms", "chunk fwd+bwd ms", "speedup fwd+bwd (of min)",
              "best fwd ms (L)", "best fwd+bwd ms (L)")  # fmt: skip
    rows = [
        (
            r["variant"],
            f"{r['ref_fwd_ms']:.1f}",
            f"{r['chunk_fwd_ms']:.1f}",
            f"{r['speedup_fwd']:.1f}x ({r['speedup_fwd_of_min']:.1f}x)",
            f"{r['ref_fwdbwd_ms']:.1f}",
            f"{r['chunk_fwdbwd_ms']:.1f}",
            f"{r['speedup_fwdbwd']:.1f}x ({r['speedup_fwdbwd_of_min']:.1f}x)",
            f"{r['best_fwd']['ms']:.1f} ({r['best_fwd']['chunk_size']})",
            f"{r['best_fwdbwd']['ms']:.1f} ({r['best_fwdbwd']['chunk_size']})",
        )
        for r in results
    ]
    if markdown:
        fmt = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
        rule = "|---|" + "---:|" * (len(header) - 1)
        return "\n".join([fmt(header), rule, *map(fmt, rows)])
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def parse_args(argv):
    names = sorted({v.family for v in VARIANTS} | {v.name for v in VARIANTS})
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"tiny shapes {QUICK}, 1 repeat")
    p.add_argument("--families", nargs="+", metavar="NAME", help=f"subset of {names}")
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    p.add_argument("--repeats", type=int, help="timed chunk calls (default 5, --quick 1)")
    p.add_argument("--ref-repeats", type=int, default=1, help="timed reference calls (1)")
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("-T", type=int, help=f"sequence length (default {FULL['T']})")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--decay-normalizer",
        type=float,
        default=DECAY_NORMALIZER,
        help="log decays are logsigmoid(randn) / this (default %(default)s, GLA's τ; 1 = strong)",
    )
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    args = p.parse_args(argv)
    unknown = set(args.families or ()) - set(names)
    if unknown:
        p.error(f"unknown --families {sorted(unknown)}; choose from {names}")
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5
    if min(args.repeats, args.ref_repeats, *args.chunk_sizes, args.T or 1) < 1:
        p.error("-T, --repeats, --ref-repeats and --chunk-sizes must be ≥ 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = dict(QUICK if args.quick else FULL)
    if args.T:
        shape["T"] = args.T
    repeats, ref_repeats = args.repeats, args.ref_repeats
    chunk_sizes = sorted({*args.chunk_sizes, DEFAULT_CHUNK_SIZE})
    wanted = set(args.families or ())
    variants = [v for v in VARIANTS if not wanted or {v.name, v.family} & wanted]
    machine = machine_info()
    date = machine["date"][:10]
    out = args.out or ROOT / "benchmarks" / "results" / (
        f"{'tmp/' if args.quick else ''}cpu-chunk-vs-reference-{date}.json"
    )
    dirty = " (uncommitted changes)" if machine["git_dirty"] else ""
    print(
        f"{machine['cpu']} | {machine['cpu_count']} CPUs | torch {machine['torch']}, "
        f"{machine['torch_threads']} threads | load average {machine['load_avg_1min']}"
    )
    print(f"commit {machine['git_commit']}{dirty} | {machine['date']}")
    shape_text = ", ".join(f"{d}={n}" for d, n in shape.items())
    print(f"{shape_text}, fp32 | chunk sizes {chunk_sizes} | medians of {repeats} (chunk) and")
    print(f"{ref_repeats} (reference) calls, in ms; speedup = reference / chunk")
    results = []
    for v in variants:
        t0 = time.perf_counter()
        results.append(
            bench_variant(
                v, shape, chunk_sizes, repeats, ref_repeats, args.seed, args.decay_normalizer
            )
        )
        print(f"  {v.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    print(format_table(results))
    if args.markdown:
        print("\n" + format_table(results, markdown=True))
    report = {
        "benchmark": "cpu_chunk_vs_reference",
        "machine": machine,
        "config": {
            **shape,
            "dtype": "float32",
            "chunk_sizes": chunk_sizes,
            "default_chunk_size": DEFAULT_CHUNK_SIZE,
            "repeats": repeats,
            "ref_repeats": ref_repeats,
            "ref_warmup_T": min(shape["T"], REF_WARMUP_T),
            "seed": args.seed,
            "decay_normalizer": args.decay_normalizer,
            "quick": args.quick,
        },
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
