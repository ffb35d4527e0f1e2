"""``linrnn bench`` (also ``python -m linrnn.bench``): time every family and mode, with peers.

    linrnn bench                              # GPU: the quick suite; CPU-only: quick, torch path
    linrnn bench --suite paper --plots        # TFLA's 65,536-token shapes, peers side by side
    linrnn bench --suite chunksize --save-cache   # fills the chunk_size="auto" cache
    linrnn bench --suite headdim --ops mlstm fla --modes chunk
    linrnn bench --suite decode                   # tokens/s of one-token steps, with peers
    linrnn bench --suite varlen                   # 8 packed documents vs padded, fwd+bwd
    linrnn bench --suite delta                    # the delta rule beside fla's delta-rule ops
    linrnn bench --suite mamba2                   # Mamba2 beside mamba_ssm and fla's simple GLA
    linrnn bench --suite train --seq-len 8192 2048   # whole-model training tokens/s vs SDPA
    linrnn bench --list                       # suites, ops, peers

    # a long suite in parts that add to one JSON (rerun a part that stopped at its budget)
    linrnn bench --suite paper --ops linrnn --modes chunk --out paper.json --resume \
        --time-budget 480
    linrnn bench --suite paper --ops fla --out paper.json --resume --triton-cache /tmp/tc
    linrnn bench --suite paper --ops peers --plan --out paper.json --resume  # what is left
    linrnn bench --report paper.json chunksize.json --out merged.json --plots  # no GPU

Each case (op × mode × chunk size, its shapes in order) runs in its own worker subprocess on
CUDA, with a fresh Triton cache (so the first call includes compilation; ``--triton-cache``
shares one folder instead) and ``--timeout`` seconds per shape; a crash or timeout becomes the
row's status (see :mod:`linrnn.bench.worker`). On CPU cases run in-process (``--isolate`` to
change). Times, memory and the FLOP/byte counts are described in :mod:`linrnn.bench.timing`
and :mod:`linrnn.bench.flops`. The JSON report is rewritten after every case, with a Markdown
table (``.md``) beside it at the end; ``--resume`` keeps its rows and runs only the missing
ones, and ``--report`` merges reports and redraws tables and plots without running anything.
SIGTERM or SIGINT (e.g. an outer ``timeout``) stops the run: the worker in progress is killed
(it has its own process group and would go on holding the GPU), the rows of the finished cases
stay in the JSON (``complete`` false) and ``--resume`` runs the rest. Progress goes to stderr,
one flushed line when a case starts and one when it ends, with the seconds since the start.
Exit status: 0 when every linrnn row is ok (or not implemented yet), 1 when one failed, 2 on a
bad command line, 3 when ``--time-budget`` left items unrun (run again with ``--resume``),
128 + the signal's number when a signal stopped the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from linrnn.bench import flops, peers, registry, report, training, worker


def tasks() -> dict:
    from linrnn.bench import decode, timing, training, varlen

    return {
        "bench": timing.bench_case,
        "decode": decode.decode_case,
        "varlen": varlen.varlen_case,
        "train": training.train_case,
        "info": report.info_case,
        "selftest": worker.selftest_case,
    }


def default_out_dir() -> Path:
    """``benchmarks/results/tmp`` of a checkout (git ignores it), else ``./linrnn-bench``."""
    results = worker.ROOT / "benchmarks" / "results"
    return results / "tmp" if results.is_dir() else Path("linrnn-bench")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=sorted(registry.SUITES), help="named sweep (default quick)")
    p.add_argument(
        "--ops",
        nargs="+",
        metavar="OP",
        help="subset by op name, family, library (linrnn, fla, mlstm_kernels, torch) or 'peers'",
    )
    p.add_argument("--modes", nargs="+", choices=registry.ALL_MODES, help="subset of modes")
    p.add_argument("--shapes", nargs="+", metavar="ID", help="override: B..-T..-H..-K..-V..")
    p.add_argument("--chunk-sizes", nargs="+", type=int, metavar="L", help="override")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--backend", choices=("triton", "torch"), help="force a linrnn backend")
    p.add_argument("--dtype", choices=sorted(registry.DTYPES), help="bf16 on CUDA, fp32 on CPU")
    p.add_argument("--no-peers", action="store_true", help="linrnn only")
    p.add_argument(
        "--isolate",
        choices=("process", "none"),
        help="process: a worker subprocess per case (default on CUDA); none: in-process "
        "(default on CPU)",
    )
    p.add_argument("--timeout", type=float, default=300, help="seconds per shape (300)")
    p.add_argument("--warmup-ms", type=float, default=25, help="do_bench warm-up (25)")
    p.add_argument("--rep-ms", type=float, default=100, help="do_bench repetition time (100)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per figure on CPU (3)")
    p.add_argument("--threads", type=int, help="torch threads (CPU)")
    p.add_argument("--steps", type=int, help="decode: one-token calls per timed loop (32)")
    p.add_argument("--docs", type=int, help="varlen: documents packed into T tokens (8)")
    p.add_argument("--seq-len", nargs="+", type=int, metavar="T", help="train: sequence "
                   "lengths (8192 on CUDA, 64 on CPU)")  # fmt: skip
    p.add_argument("--batch", type=int, help="train: sequences per step (65,536 tokens / T "
                   "on CUDA, 256 / T on CPU)")  # fmt: skip
    p.add_argument("--mixers", nargs="+", metavar="MIXER", help="train: a subset of "
                   "the mixers (softmax always runs first when chosen)")  # fmt: skip
    p.add_argument("--train-seconds", type=float, metavar="S", help="train: seconds of "
                   "training per mixer after its first step (20)")  # fmt: skip
    p.add_argument("--max-steps", type=int, metavar="N", help="train: also stop after N "
                   "steps (CPU: 6; 0: no limit)")  # fmt: skip
    p.add_argument("--cuda-graph", action="store_true", default=None, help="train: every "
                   "step after two eager ones replayed from a CUDA graph (CUDA)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, help=f"report folder (default {default_out_dir()})")
    p.add_argument("--out", type=Path, help="JSON path (default OUT_DIR/<date>-<gpu>-<suite>.json)")
    p.add_argument("--plots", action="store_true", help="PNG plots next to the JSON (matplotlib)")
    p.add_argument("--save-cache", action="store_true", help="store chunk-mode timings for "
                   "chunk_size='auto' (linrnn.bench.autotune)")  # fmt: skip
    p.add_argument("--cache-dir", type=Path, help="autotune cache folder (~/.cache/linrnn)")
    p.add_argument("--commit", help="git commit to record (a copy may lack .git)")
    p.add_argument("--resume", action="store_true", help="keep the rows of an existing --out "
                   "report (same suite) and run only the items it lacks")  # fmt: skip
    p.add_argument("--retry-failed", action="store_true",
                   help="with --resume: also rerun its rows that did not end ok")  # fmt: skip
    p.add_argument("--time-budget", type=float, metavar="S", help="start nothing after S "
                   "seconds and stop the case in progress there; its unfinished items stay "
                   "unrecorded (exit 3; run again with --resume)")  # fmt: skip
    p.add_argument("--triton-cache", type=Path, metavar="DIR", help="one Triton cache folder "
                   "for every worker (and later runs): kernels compiled once, fla's autotuning "
                   "kept; first calls may then exclude compilation (marked c)")  # fmt: skip
    p.add_argument("--plan", action="store_true", help="print the cases and shapes that would "
                   "run (peers as if installed), then exit; no GPU needed")  # fmt: skip
    p.add_argument("--report", nargs="+", type=Path, metavar="JSON", help="run nothing: merge "
                   "these reports (into --out when several), write the Markdown table (and "
                   "--plots) from them")  # fmt: skip
    p.add_argument("--list", action="store_true", help="list suites, ops and peers, then exit")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--verbose", action="store_true", help="echo the workers' output")
    p.set_defaults(bench_parser=p)


# --- planning -------------------------------------------------------------------------------


def op_tags(op: str) -> set[str]:
    lib = peers.library_of(op)
    tags = {op, lib, op.split("[")[0], op.split(":")[-1].split("[")[0]}
    if lib == "linrnn":
        tags.add(registry.OPS[op].family)
    else:
        tags.add("peers")
    return tags


def all_tags() -> set[str]:
    return set().union(*(op_tags(op) for op in [*registry.OPS, *peers.PEERS]))


def plan(args, suite: registry.Suite, device: str) -> tuple[list[tuple[dict, list]], list[str]]:
    """The cases (each with its shape items) and notes on what was left out and why (with
    ``--plan``, peers are planned as if their libraries were installed)."""
    wanted = set(args.ops or ())
    chosen = lambda op: not wanted or bool(op_tags(op) & wanted)  # noqa: E731
    modes = [m for m in suite.modes if not args.modes or m in args.modes]
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    common = dict(
        task="bench", device=device, dtype=dtype, seed=args.seed, warmup_ms=args.warmup_ms,
        rep_ms=args.rep_ms, cpu_repeats=args.repeats, threads=args.threads,
        fresh_triton_cache=not args.triton_cache, fwdbwd=suite.fwdbwd,
        initial_state=suite.initial_state, suite=suite.name, in_process=args.isolate == "none",
    )  # fmt: skip
    if suite.kind == "decode":
        from linrnn.bench import decode

        return decode.plan(args, suite, device, common, chosen)
    if suite.kind == "varlen":
        from linrnn.bench import varlen

        return varlen.plan(args, suite, device, common, chosen)
    if suite.kind == "train":
        from linrnn.bench import training

        return training.plan(args, suite, device, common)
    cases, notes, unsupported = [], [], set()
    for name, op in registry.OPS.items():
        if not chosen(name) or not suite.runs_family(op.family):
            continue
        shapes = args.shapes or suite.shapes_for(op.family, device)
        shapes = registry.takes_shapes(name, shapes, op.grouped, notes)
        if not shapes:
            continue
        for mode in modes:
            backend = registry.backend_for(op, mode, device, args.backend or suite.backend)
            if backend is None:
                unsupported.add(mode)
                continue
            sizes = args.chunk_sizes or suite.chunk_sizes
            if mode not in ("chunk", "fused_chunk"):
                sizes = (None,)
            for chunk in sizes:
                if mode == "fused_chunk" and chunk and chunk > registry.FUSED_MAX_CHUNK:
                    continue
                case = dict(common, op=name, mode=mode, backend=backend, chunk=chunk)
                cases.append((case, [{"shape": s} for s in shapes]))
    if unsupported:
        notes.append(
            f"modes {sorted(unsupported)} skipped where no backend runs them on {device} "
            "(fused_chunk: Triton on CUDA, the engine's families)"
        )
    if suite.peers and not args.no_peers:
        for name, peer in peers.PEERS.items():
            if not chosen(name) or peer.kind != "ops":
                continue
            family = registry.OPS[peer.like].family
            if not suite.runs_family(family):
                continue
            if peer.cuda_only and device != "cuda":
                continue
            if not peer_installed(args, peer.library):
                notes.append(f"peer {name} skipped: {peer.library} is not installed")
                continue
            shapes = args.shapes or suite.shapes_for(family, device)
            shapes = registry.takes_shapes(name, shapes, peer.grouped != "no", notes)
            if not shapes:
                continue
            case = dict(common, op=name, mode=None, backend=None, chunk=peer.chunk)
            if not peer.backward:
                case["fwdbwd"] = False
            cases.append((case, [{"shape": s} for s in shapes]))
        if device != "cuda":
            notes.append(
                "peers fla, mlstm_kernels and mamba_ssm need CUDA; torch SDPA runs on CPU too"
            )
    return cases, notes


def peer_installed(args, library: str) -> bool:
    """Whether a peer library counts as installed: always with ``--plan`` (it plans the GPU
    machine's run from any machine), else when it imports."""
    return bool(getattr(args, "plan", False)) or peers.available(library)


def full_row(case: dict, item: dict, row: dict, spec: dict | None) -> dict:
    """A report row: the case, its measurements and the counts of :mod:`linrnn.bench.flops`
    (the decode and varlen suites: their own rows)."""
    if case["task"] in ("decode", "varlen", "train"):
        from linrnn.bench import decode, training, varlen

        module = {"decode": decode, "varlen": varlen, "train": training}[case["task"]]
        return module.full_row(case, item, row, spec)
    op, library = case["op"], peers.library_of(case["op"])
    like = peers.like_of(op)
    shape = registry.parse_shape(item["shape"])
    spec_op = registry.OPS[like]
    chunk = case["chunk"] or registry.default_chunk(case["backend"], case["mode"], shape["K"],
                                                   shape["V"], spec_op)  # fmt: skip
    kind = "attention" if op == "torch:sdpa_causal" else (case["mode"] or "chunk")
    elt = flops.DTYPE_BYTES[case["dtype"]]
    full = {k: None for k in report.ROW_KEYS}
    full.update(
        op=op, library=library, family=spec_op.family, mode=case["mode"],
        backend=case["backend"], chunk=chunk, chunk_requested=case["chunk"],
        shape=item["shape"], dtype=case["dtype"], suite=case["suite"],
        note=peers.PEERS[op].note if library != "linrnn" else "",
    )  # fmt: skip
    if not case.get("fwdbwd", True):
        full["fwd_only"] = True
    full.update(row)
    full.update(
        flops.case_figures(
            kind, shape, chunk, elt, spec_op.gate_fp32_elems(shape["K"], shape["V"], elt),
            full.get("fwd_ms"), full.get("fwdbwd_ms"), spec,
            state_in=case["initial_state"], state_out=case["initial_state"], form=spec_op.form,
        )
    )  # fmt: skip
    return full


# --- running --------------------------------------------------------------------------------


def run_case(case: dict, items: list, args, stop_at: float | None = None) -> list:
    """The rows of one case's items (None for an item the time budget ``stop_at`` left unrun):
    in a worker subprocess with a fresh Triton cache, or the shared ``--triton-cache``."""
    if case["in_process"]:
        return worker.run_in_process(case, items, tasks(), stop_at)
    if args.triton_cache:
        args.triton_cache.mkdir(parents=True, exist_ok=True)
        env = worker.worker_env(str(args.triton_cache.resolve()))
        return worker.run_items(case, items, args.timeout, env, args.verbose, stop_at=stop_at)
    cache = tempfile.mkdtemp(prefix="linrnn_bench_triton_cache_")
    try:
        env = worker.worker_env(cache)
        return worker.run_items(case, items, args.timeout, env, args.verbose, stop_at=stop_at)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


class Stopped(BaseException):
    """A signal stopped the run (BaseException: no ``except Exception`` on the way, e.g. an
    in-process item's, takes it for the item's error)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals(signals=(signal.SIGTERM, signal.SIGINT)):
    """Within the block, these signals raise :class:`Stopped` (main thread only; elsewhere
    nothing changes); the previous handlers come back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Stopped(signum)

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def kill_workers() -> list[int]:
    """SIGKILL the process group of each worker this process started (a child that leads its
    own process group, :func:`worker.launch`'s ``start_new_session``, run with ``--worker``),
    found in ``/proc`` (Linux; elsewhere nothing); their pids."""
    me, killed = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid, pgrp = (int(x) for x in text[text.rindex(")") + 2 :].split()[1:3])
        pid = int(stat.parent.name)
        if ppid == me and pgrp == pid and b"--worker" in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def item_key(case: dict, item: dict) -> str:
    """:func:`report.key_of` the row this case and item will make."""
    return report.key_of(case["suite"], case["op"], case["mode"], case["backend"], case["chunk"],
                         case["dtype"], item["shape"], item.get("layout"))  # fmt: skip


def left_to_run(cases: list, done: set) -> tuple[list, int]:
    """The cases with only their items whose key is not in ``done``, and how many were left
    out."""
    left, skipped = [], 0
    for case, items in cases:
        todo = [it for it in items if item_key(case, it) not in done]
        skipped += len(items) - len(todo)
        if todo:
            left.append((case, todo))
    return left, skipped


def resume_from(path: Path, suite: str, retry_failed: bool) -> tuple[list, list, set]:
    """``(rows, runs, done keys)`` of the report at ``path`` (nothing when it does not exist);
    ``ValueError`` when it is no report or of another suite."""
    if not path.exists():
        return [], [], set()
    previous = report.load_json(path)
    if previous.get("suite") != suite:
        raise ValueError(f"--resume: {path} holds suite {previous.get('suite')!r}, not {suite!r}")
    rows = [dict(r, run=r.get("run") or 0) for r in previous.get("bench", [])]
    done = {report.row_key(r) for r in rows if not retry_failed or _ok_status(r["status"])}
    return rows, report.runs_of(previous), done


def list_everything() -> str:
    lines = ["suites:"]
    lines += [f"  {s.name:<10} {s.description}" for s in registry.SUITES.values()]
    lines.append("linrnn ops (family; modes with Triton kernels in the ops suites):")
    lines += [f"  {o.name:<26} {o.family}; {', '.join(o.kernel_modes()) or 'none'}"
              for o in registry.OPS.values()]  # fmt: skip
    lines.append("peers (like; installed):")
    lines += [
        f"  {n:<48} {p.like}; {'yes' if peers.available(p.library) else 'no'}"
        for n, p in peers.PEERS.items()
    ]
    return "\n".join(lines)


def print_plan(cases: list, notes: list, suite: registry.Suite, device: str, skipped: int) -> None:
    n_items = sum(len(items) for _, items in cases)
    print(f"plan: suite {suite.name} on {device}: {len(cases)} cases, {n_items} items"
          + (f" ({skipped} already in the report)" if skipped else ""))  # fmt: skip
    for case, items in cases:
        chunk = case["chunk"] or "default"
        shapes = " ".join(it["shape"] + (f":{it['layout']}" if "layout" in it else "")
                          for it in items)  # fmt: skip
        only = " (forward only)" if case["task"] == "bench" and not case["fwdbwd"] else ""
        print(f"  {case['op']} {case['mode'] or '-'} {case['backend'] or '-'} L={chunk}{only}: "
              f"{shapes}")  # fmt: skip
    for note in [*notes, *([suite.note] if suite.note else [])]:
        print(f"  note: {note}")


def report_main(args) -> int:
    """``--report``: merge the reports, write the merged JSON (``--out``; needed for several),
    the Markdown table beside it, the plots (``--plots``), and print the table."""
    parser = args.bench_parser
    if len(args.report) > 1 and not args.out:
        parser.error("--report with several files needs --out for the merged JSON")
    try:
        merged = report.merge_reports([report.load_json(p) for p in args.report])
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    out = args.out or args.report[0]
    if args.out:
        report.write_json(out, merged)
    md = Path(out).with_suffix(".md")
    md.write_text(report.markdown(merged))
    trained = [r for r in merged["bench"] if r.get("suite") == "train"]
    others = [r for r in merged["bench"] if r.get("suite") != "train"]
    if others or not trained:
        print(report.bench_table(others))
    if trained:
        print(training.table(trained))
    print(f"\n{len(merged['bench'])} rows from {len(merged['runs'])} run(s); wrote {md}"
          + (f" and {out}" if args.out else ""))  # fmt: skip
    if args.plots:
        _plots(merged, Path(out))
    return 0


def _plots(rep: dict, path: Path) -> None:
    try:
        from linrnn.bench import plots

        made = plots.make_plots(rep, path.parent / path.stem)
        print(f"plots: {', '.join(str(p) for p in made) or 'none (no rows to plot)'}")
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install 'linrnn[plot]')")


TRAIN_FLAGS = ("seq_len", "batch", "mixers", "train_seconds", "max_steps", "cuda_graph")


def check_train_arguments(args, parser) -> None:
    """The train suite's options only with it, in range; its suite takes no --ops, --shapes
    or --modes (its mixers, lengths and batch are its own options)."""
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    if args.suite != "train":
        given = [flag(n) for n in TRAIN_FLAGS if getattr(args, n) is not None]
        if given:
            parser.error(f"{', '.join(given)}: options of --suite train only")
        return
    for name in ("ops", "shapes", "modes"):
        if getattr(args, name):
            parser.error(f"{flag(name)} does not apply to --suite train (--mixers, --seq-len "
                         "and --batch choose what it runs)")  # fmt: skip
    if args.chunk_sizes and len(args.chunk_sizes) > 1:
        parser.error("--suite train takes one --chunk-sizes value (the linear mixers' chunk)")
    unknown = sorted(set(args.mixers or ()) - set(training.VARIANTS))
    if unknown:
        parser.error(f"unknown --mixers {unknown}; choose from {list(training.VARIANTS)}")
    for name in ("seq_len", "batch"):
        values = getattr(args, name)
        values = values if isinstance(values, list) else [values]
        if any(v is not None and v < 1 for v in values):
            parser.error(f"{flag(name)} must be ≥ 1, got {getattr(args, name)}")
    if args.max_steps is not None and args.max_steps < 0:
        parser.error(f"--max-steps must be ≥ 0, got {args.max_steps}")
    seconds = training.DEFAULT_SECONDS if args.train_seconds is None else args.train_seconds
    if seconds <= 0:
        parser.error(f"--train-seconds must be > 0, got {seconds:g}")
    if args.timeout < seconds + 60:
        parser.error(f"--timeout {args.timeout:g} s leaves a worker no time to compile and "
                     f"evaluate beyond --train-seconds {seconds:g} s: give at least "
                     f"{seconds + 60:g}")  # fmt: skip


def matplotlib_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def main(args) -> int:
    parser = args.bench_parser
    if args.list:
        print(list_everything())
        return 0
    unknown = set(args.ops or ()) - all_tags()
    if unknown:
        parser.error(f"unknown --ops {sorted(unknown)}; choose from {sorted(all_tags())}")
    for shape in args.shapes or ():
        try:
            registry.parse_shape(shape)
        except ValueError as exc:
            parser.error(str(exc))
    if args.chunk_sizes and min(args.chunk_sizes) < 1:
        parser.error("--chunk-sizes must be ≥ 1")
    if args.repeats < 1:
        parser.error("--repeats must be ≥ 1")
    for flag in ("steps", "docs"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag} must be ≥ 1")
    if args.time_budget is not None and args.time_budget <= 0:
        parser.error("--time-budget must be > 0")
    if args.retry_failed and not args.resume:
        parser.error("--retry-failed goes with --resume")
    check_train_arguments(args, parser)
    if args.report:
        return report_main(args)

    import torch

    suite_name = args.suite or "quick"
    suite = registry.SUITES[suite_name]
    if args.plan:  # the GPU machine's plan unless --device cpu; nothing runs
        device = "cpu" if args.device == "cpu" else "cuda"
        args.isolate = args.isolate or ("process" if device == "cuda" else "none")
        try:
            cases, notes = plan(args, suite, device)
        except ValueError as exc:
            parser.error(str(exc))
        skipped = 0
        if args.resume and args.out:
            try:
                _, _, done = resume_from(args.out, suite.name, args.retry_failed)
            except ValueError as exc:
                parser.error(str(exc))
            cases, skipped = left_to_run(cases, done)
        print_plan(cases, notes, suite, device, skipped)
        return 0

    cuda = torch.cuda.is_available()
    device = args.device if args.device != "auto" else ("cuda" if cuda else "cpu")
    if device == "cuda" and not cuda:
        print("no CUDA device (torch.cuda.is_available() is False); use --device cpu",
              file=sys.stderr)  # fmt: skip
        return 2
    if device == "cpu" and args.device == "auto":
        print(
            f"no CUDA device: running the {suite_name} suite on the torch path on CPU "
            "(times from time.perf_counter; no memory figures, no floor)"
        )
    if args.isolate is None:
        args.isolate = "process" if device == "cuda" else "none"
    if device == "cpu" and suite.name in ("quick", "train") and args.threads is None:
        args.threads = 1  # tiny shapes: one thread avoids the thread pool's wake-up noise
    if args.threads and args.isolate == "none":
        torch.set_num_threads(args.threads)

    t_start = time.perf_counter()
    stop_at = None if args.time_budget is None else time.monotonic() + args.time_budget
    info_case = dict(task="info", device=device, in_process=args.isolate == "none")
    if args.isolate == "none":
        info = report.info_case(info_case, {})
    else:
        env = worker.worker_env()
        (info,) = worker.run_items(info_case, [{"what": "info"}], args.timeout, env, args.verbose)
    machine = report.machine_info(info, device, args.commit)
    spec = flops.gpu_spec(machine.get("gpu")) if device == "cuda" else None
    try:
        cases, notes = plan(args, suite, device)
    except ValueError as exc:  # e.g. a varlen shape with B > 1
        parser.error(str(exc))
    out_dir = args.out_dir or default_out_dir()
    out = args.out or out_dir / (
        f"{machine['date'][:10]}-{report.slug(machine.get('gpu'))}-{suite.name}.json"
    )
    rows: list[dict] = []
    runs: list[dict] = []
    if args.resume:
        try:
            rows, runs, done = resume_from(out, suite.name, args.retry_failed)
        except ValueError as exc:
            parser.error(str(exc))
        cases, skipped = left_to_run(cases, done)
        if skipped:
            notes.append(f"resume: {skipped} items already in {out} skipped")
    argv = getattr(args, "argv", None)
    command = shlex.join(["linrnn", "bench", *argv] if argv is not None else sys.argv)
    print(
        f"{machine.get('gpu') or 'CPU'} | driver {machine.get('driver')} | torch "
        f"{machine.get('torch')} | Triton {machine.get('triton')} | linrnn {machine['linrnn']} "
        f"| commit {(machine.get('git_commit') or '?')[:12]}"
    )
    print(f"suite {suite.name}: {suite.description}")
    for note in [*notes, *([suite.note] if suite.note else [])]:
        print(f"  note: {note}")
    if args.time_budget is not None and args.time_budget <= args.timeout:
        print(f"  note: --time-budget {args.time_budget:g} s ≤ --timeout {args.timeout:g} s: a "
              "slow item may be cut at the budget on every run")  # fmt: skip
    n_items = sum(len(items) for _, items in cases)
    print(f"  running {len(cases)} cases, {n_items} items; report {out} (rewritten after every "
          "case)", flush=True)  # fmt: skip

    this_run = len(runs)
    config = {k: v for k, v in vars(args).items() if k not in ("bench_parser", "run", "argv")}
    runs.append(dict(command=command, machine=machine, config=config, complete=False))
    pending = sum(len(items) for _, items in cases)

    def write(complete: bool) -> Path:
        failed = [r for r in rows if r["library"] == "linrnn" and not _ok_status(r["status"])]
        runs[this_run].update(complete=complete, pending=pending,
                              rows=sum(r.get("run") == this_run for r in rows))  # fmt: skip
        return report.write_json(
            out,
            {
                "benchmark": "linrnn bench",
                "schema": report.SCHEMA_VERSION,
                "complete": complete,  # False while running (rewritten after every case)
                "suite": suite.name,
                "machine": machine,
                "command": command,
                "config": config,
                "runs": runs,  # every run that added rows (--resume); a row's "run" indexes it
                "gpu_spec": spec,
                "notes": notes,
                "bench": rows,
                "failures": {"linrnn_bench": len(failed)},
            },
        )  # fmt: skip

    def record(new: dict) -> None:
        key = report.row_key(new)
        rows[:] = [r for r in rows if report.row_key(r) != key]  # a retried row replaces its own
        rows.append(new)
        if suite.kind == "train":
            training.add_ratios(rows)

    cache_mode = None if args.isolate == "none" else "shared" if args.triton_cache else "fresh"
    progress = report.Progress(len(cases), f"bench {suite.name}", enabled=not args.quiet)
    stopped = None
    try:
        with stop_on_signals():
            for index, (case, items) in enumerate(cases):
                # a case that needs more than the time left (a training run) waits for --resume
                if stop_at is not None and time.monotonic() + case.get("needs_s", 0) >= stop_at:
                    break
                label = f"{case['op']} {case['mode'] or ''} L={case['chunk'] or 'default'}"
                if progress.bar is None and progress.enabled:  # a log shows what was running
                    shapes = " ".join(it["shape"] + (f":{it['layout']}" if "layout" in it else "")
                                      for it in items)  # fmt: skip
                    print(f"  [{index + 1}/{len(cases)}] start {label}: {shapes} "
                          f"(t={time.perf_counter() - t_start:.0f} s)", file=sys.stderr,
                          flush=True)  # fmt: skip
                results = run_case(case, items, args, stop_at)
                for item, row in zip(items, results):
                    if row is not None:
                        record(dict(full_row(case, item, row, spec), run=this_run,
                                    triton_cache=cache_mode))  # fmt: skip
                        pending -= 1
                write(complete=False)
                statuses = [r["status"][:40] if r else "not run (time budget)" for r in results]
                progress.step(f"{label}: {', '.join(statuses)} "
                              f"(t={time.perf_counter() - t_start:.0f} s)")  # fmt: skip
    except Stopped as exc:
        stopped = exc
        killed = kill_workers()
        print(f"\nstopped by {exc} after {time.perf_counter() - t_start:.0f} s"
              + (f" (killed worker {', '.join(map(str, killed))})" if killed else "")
              + f": the finished cases' rows are in {out}; run again with --resume",
              file=sys.stderr, flush=True)  # fmt: skip
    progress.close()
    path = write(complete=pending == 0 and stopped is None)

    spec_text = (
        f"floor from the {spec['matched']} spec sheet: {spec['bandwidth_Bps'] / 1e12:g} TB/s, "
        f"{spec['bf16_dense_flops'] / 1e12:g} TFLOP/s"
        if spec
        else "no floor (no GPU spec)"
    )
    timing = "do_bench medians" if device == "cuda" else f"perf_counter medians of {args.repeats}"
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    if suite.kind == "train":
        print("\n" + training.SUMMARY.format(dtype=dtype))
        print(training.table(rows))
    elif suite.kind in ("decode", "varlen"):
        from linrnn.bench import decode, varlen

        module = decode if suite.kind == "decode" else varlen
        print("\n" + module.SUMMARY.format(dtype=dtype, timing=timing, steps=args.steps or 32)
              + f"; {spec_text}")  # fmt: skip
        print(module.table(rows))
    else:
        print(
            f"\n{suite.name}, {dtype}, {timing} in ms; peak = fwd+bwd call; first s = first "
            "fwd+bwd incl. compile (* not the first item in its process, c shared Triton "
            f"cache); TFLOP/s and GB/s of the forward; × floor = fwd / floor; {spec_text}"
        )
        print(report.bench_table(rows))
    from linrnn.bench import compare

    ratios = compare.text(rows) if suite.kind != "train" else ""
    if ratios:
        print("\n" + ratios)
    failed = [r for r in rows if r["library"] == "linrnn" and not _ok_status(r["status"])]
    final = json.loads(path.read_text())
    md = path.with_suffix(".md")
    md.write_text(report.markdown(final))
    if args.plots or (suite.kind == "train" and matplotlib_installed()):
        _plots(final, path)  # the train suite's loss curves whenever matplotlib is there
    if args.save_cache:
        from linrnn.bench import autotune

        keys = autotune.save_measurements(
            rows, machine.get("gpu") or device, args.cache_dir, machine.get("git_commit")
        )
        where = autotune.cache_dir(args.cache_dir) / autotune.CACHE_NAME
        print(f"chunk-size cache: {len(keys)} entries written to {where}")
    n_ok = sum(_ok_status(r["status"]) for r in rows)
    print(
        f"\n{n_ok}/{len(rows)} rows ok (or not implemented yet); {len(failed)} linrnn rows "
        f"failed; {time.perf_counter() - t_start:.1f} s; wrote {path} and {md.name}"
    )
    if stopped is not None:
        print(f"{pending} items not run ({stopped} stopped the run): run the same command "
              "again with --resume", flush=True)  # fmt: skip
        return 128 + stopped.signum
    if pending:
        print(f"{pending} items not run within --time-budget: run the same command again "
              "with --resume", flush=True)  # fmt: skip
        return 3
    return 1 if failed else 0


_ok_status = report.ok_status


def cli(argv: list[str] | None = None) -> int:
    """``python -m linrnn.bench [options]`` (and the worker entry ``--worker CASE_JSON``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:
        return worker.serve(argv[1], tasks())
    parser = argparse.ArgumentParser(
        prog="python -m linrnn.bench",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = argv
    return main(args)
