"""``linrnn bench`` (also ``python -m linrnn.bench``): time every family and mode, with peers.

    linrnn bench                              # GPU: the quick suite; CPU-only: quick, torch path
    linrnn bench --suite paper --plots        # TFLA's 65,536-token shapes, peers side by side
    linrnn bench --suite chunksize --save-cache   # fills the chunk_size="auto" cache
    linrnn bench --suite headdim --ops mlstm fla --modes chunk
    linrnn bench --suite decode                   # tokens/s of one-token steps, with peers
    linrnn bench --suite varlen                   # 8 packed documents vs padded, fwd+bwd
    linrnn bench --list                       # suites, ops, peers

Each case (op × mode × chunk size, its shapes in order) runs in its own worker subprocess on
CUDA, with a fresh Triton cache (so the first call includes compilation) and ``--timeout``
seconds per shape; a crash or timeout becomes the row's status (see
:mod:`linrnn.bench.worker`). On CPU cases run in-process (``--isolate`` to change). Times,
memory and the FLOP/byte counts are described in :mod:`linrnn.bench.timing` and
:mod:`linrnn.bench.flops`. The JSON report is rewritten after every case. Exit status: 0 when
every linrnn row is ok (or not implemented yet), 1 when one failed, 2 on a bad command line.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from linrnn.bench import flops, peers, registry, report, worker


def tasks() -> dict:
    from linrnn.bench import decode, timing, varlen

    return {
        "bench": timing.bench_case,
        "decode": decode.decode_case,
        "varlen": varlen.varlen_case,
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, help=f"report folder (default {default_out_dir()})")
    p.add_argument("--out", type=Path, help="JSON path (default OUT_DIR/<date>-<gpu>-<suite>.json)")
    p.add_argument("--plots", action="store_true", help="PNG plots next to the JSON (matplotlib)")
    p.add_argument("--save-cache", action="store_true", help="store chunk-mode timings for "
                   "chunk_size='auto' (linrnn.bench.autotune)")  # fmt: skip
    p.add_argument("--cache-dir", type=Path, help="autotune cache folder (~/.cache/linrnn)")
    p.add_argument("--commit", help="git commit to record (a copy may lack .git)")
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
    """The cases (each with its shape items) and notes on what was left out and why."""
    wanted = set(args.ops or ())
    chosen = lambda op: not wanted or bool(op_tags(op) & wanted)  # noqa: E731
    modes = [m for m in suite.modes if not args.modes or m in args.modes]
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    common = dict(
        task="bench", device=device, dtype=dtype, seed=args.seed, warmup_ms=args.warmup_ms,
        rep_ms=args.rep_ms, cpu_repeats=args.repeats, threads=args.threads,
        fresh_triton_cache=True, fwdbwd=suite.fwdbwd, initial_state=suite.initial_state,
        suite=suite.name, in_process=args.isolate == "none",
    )  # fmt: skip
    if suite.kind == "decode":
        from linrnn.bench import decode

        return decode.plan(args, suite, device, common, chosen)
    if suite.kind == "varlen":
        from linrnn.bench import varlen

        return varlen.plan(args, suite, device, common, chosen)
    cases, notes, unsupported = [], [], set()
    for name, op in registry.OPS.items():
        if not chosen(name):
            continue
        shapes = args.shapes or suite.shapes_for(op.family, device)
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
            "(fused_chunk: Triton on CUDA, scalar-gate families)"
        )
    if suite.peers and not args.no_peers:
        for name, peer in peers.PEERS.items():
            if not chosen(name) or peer.kind != "ops":
                continue
            if peer.cuda_only and device != "cuda":
                continue
            if not peers.available(peer.library):
                notes.append(f"peer {name} skipped: {peer.library} is not installed")
                continue
            family = registry.OPS[peer.like].family
            shapes = args.shapes or suite.shapes_for(family, device)
            case = dict(common, op=name, mode=None, backend=None, chunk=peer.chunk)
            cases.append((case, [{"shape": s} for s in shapes]))
        if device != "cuda":
            notes.append("peers fla and mlstm_kernels need CUDA; torch SDPA runs on CPU too")
    return cases, notes


def full_row(case: dict, item: dict, row: dict, spec: dict | None) -> dict:
    """A report row: the case, its measurements and the counts of :mod:`linrnn.bench.flops`
    (the decode and varlen suites: their own rows)."""
    if case["task"] in ("decode", "varlen"):
        from linrnn.bench import decode, varlen

        return {"decode": decode, "varlen": varlen}[case["task"]].full_row(case, item, row, spec)
    op, library = case["op"], peers.library_of(case["op"])
    like = peers.like_of(op)
    shape = registry.parse_shape(item["shape"])
    chunk = case["chunk"] or registry.default_chunk(case["backend"], case["mode"],
                                                   shape["K"], shape["V"])  # fmt: skip
    kind = "attention" if op == "torch:sdpa_causal" else (case["mode"] or "chunk")
    full = {k: None for k in report.ROW_KEYS}
    full.update(
        op=op, library=library, family=registry.OPS[like].family, mode=case["mode"],
        backend=case["backend"], chunk=chunk, chunk_requested=case["chunk"],
        shape=item["shape"], dtype=case["dtype"], suite=case["suite"],
        note=peers.PEERS[op].note if library != "linrnn" else "",
    )  # fmt: skip
    full.update(row)
    full.update(
        flops.case_figures(
            kind, shape, chunk, flops.DTYPE_BYTES[case["dtype"]],
            registry.OPS[like].gate_elems(shape["K"], shape["V"]),
            full.get("fwd_ms"), full.get("fwdbwd_ms"), spec,
            state_in=case["initial_state"], state_out=case["initial_state"],
        )
    )  # fmt: skip
    return full


# --- running --------------------------------------------------------------------------------


def run_case(case: dict, items: list, args) -> list[dict]:
    if case["in_process"]:
        return worker.run_in_process(case, items, tasks())
    cache = tempfile.mkdtemp(prefix="linrnn_bench_triton_cache_")
    try:
        env = worker.worker_env(cache)
        return worker.run_items(case, items, args.timeout, env, args.verbose)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def list_everything() -> str:
    lines = ["suites:"]
    lines += [f"  {s.name:<10} {s.description}" for s in registry.SUITES.values()]
    lines.append("linrnn ops (family; Triton kernels):")
    lines += [f"  {o.name:<26} {o.family}; {'yes' if o.triton else 'no'}"
              for o in registry.OPS.values()]  # fmt: skip
    lines.append("peers (like; installed):")
    lines += [
        f"  {n:<48} {p.like}; {'yes' if peers.available(p.library) else 'no'}"
        for n, p in peers.PEERS.items()
    ]
    return "\n".join(lines)


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

    import torch

    cuda = torch.cuda.is_available()
    device = args.device if args.device != "auto" else ("cuda" if cuda else "cpu")
    if device == "cuda" and not cuda:
        print("no CUDA device (torch.cuda.is_available() is False); use --device cpu",
              file=sys.stderr)  # fmt: skip
        return 2
    suite_name = args.suite or "quick"
    if device == "cpu" and args.device == "auto":
        print(
            f"no CUDA device: running the {suite_name} suite on the torch path on CPU "
            "(times from time.perf_counter; no memory figures, no floor)"
        )
    suite = registry.SUITES[suite_name]
    if args.isolate is None:
        args.isolate = "process" if device == "cuda" else "none"
    if device == "cpu" and suite.name == "quick" and args.threads is None:
        args.threads = 1  # tiny shapes: one thread avoids the thread pool's wake-up noise
    if args.threads and args.isolate == "none":
        torch.set_num_threads(args.threads)

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

    rows: list[dict] = []

    def write(complete: bool) -> Path:
        failed = [r for r in rows if r["library"] == "linrnn" and not _ok_status(r["status"])]
        return report.write_json(
            out,
            {
                "benchmark": "linrnn bench",
                "schema": report.SCHEMA_VERSION,
                "complete": complete,  # False while running (rewritten after every case)
                "suite": suite.name,
                "machine": machine,
                "command": command,
                "config": {k: v for k, v in vars(args).items() if k not in ("bench_parser",
                                                                            "run", "argv")},
                "gpu_spec": spec,
                "notes": notes,
                "bench": rows,
                "failures": {"linrnn_bench": len(failed)},
            },
        )  # fmt: skip

    progress = report.Progress(len(cases), f"bench {suite.name}", enabled=not args.quiet)
    t_start = time.perf_counter()
    for case, items in cases:
        results = run_case(case, items, args)
        rows.extend(full_row(case, item, row, spec) for item, row in zip(items, results))
        write(complete=False)
        label = f"{case['op']} {case['mode'] or ''} L={case['chunk'] or 'default'}"
        progress.step(f"{label}: {', '.join(r['status'][:40] for r in results)}")
    progress.close()
    path = write(complete=True)

    spec_text = (
        f"floor from the {spec['matched']} spec sheet: {spec['bandwidth_Bps'] / 1e12:g} TB/s, "
        f"{spec['bf16_dense_flops'] / 1e12:g} TFLOP/s"
        if spec
        else "no floor (no GPU spec)"
    )
    timing = "do_bench medians" if device == "cuda" else f"perf_counter medians of {args.repeats}"
    dtype = cases[0][0]["dtype"] if cases else "-"
    if suite.kind in ("decode", "varlen"):
        from linrnn.bench import decode, varlen

        module = decode if suite.kind == "decode" else varlen
        print("\n" + module.SUMMARY.format(dtype=dtype, timing=timing, steps=args.steps or 32)
              + f"; {spec_text}")  # fmt: skip
        print(module.table(rows))
    else:
        print(
            f"\n{suite.name}, {dtype}, {timing} in ms; peak = "
            f"fwd+bwd call; first s = first fwd+bwd incl. compile; TFLOP/s and GB/s of the "
            f"forward; × floor = fwd / floor; {spec_text}"
        )
        print(report.bench_table(rows))
    failed = [r for r in rows if r["library"] == "linrnn" and not _ok_status(r["status"])]
    if args.plots:
        try:
            from linrnn.bench import plots

            made = plots.make_plots({"bench": rows, "gpu_spec": spec}, path.parent / path.stem)
            print(f"plots: {', '.join(str(p) for p in made) or 'none (no rows to plot)'}")
        except ImportError:
            print("plots skipped: matplotlib is not installed (pip install 'linrnn[plot]')")
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
        f"failed; {time.perf_counter() - t_start:.1f} s; wrote {path}"
    )
    return 1 if failed else 0


def _ok_status(status: str) -> bool:
    return status == "ok" or status.startswith("not implemented")


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
