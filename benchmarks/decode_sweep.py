"""Tile sweep of the decode step (the Triton recurrent kernel at T = 1): which value tile and
warp count bring each family's step closest to the memory floor.

For every op × shape it makes the decode suite's inputs once (``linrnn.bench.decode``: an fp32
state from a 4-token prefill, ``--steps`` one-token inputs), then for each candidate of
``triton_recurrent.STEP_TILE`` runs the same loop of in-place steps from a fresh copy of the
state: the first step's output against the default tile's (RMS-relative; a tile must not
change the result beyond rounding), then the loop's time — captured in one CUDA graph on CUDA
(the step time a decoder gets), ``perf_counter`` medians elsewhere. Candidates that give the
same (BV, warps) at a shape as an earlier one are skipped.

    python3 benchmarks/decode_sweep.py --commit <hash> --out decode_sweep.json
    TRITON_INTERPRET=1 python3 benchmarks/decode_sweep.py --device cpu --quick   # smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from linrnn.bench import decode, registry, report, timing
from linrnn.engine import triton_recurrent as tr

OPS = ("linear_attn", "retention", "simple_gla", "gla", "rwkv6", "mlstm[sigmoid]", "mlstm[exp]")
SHAPES = ("B64-T1-H16-K256-V256", "B64-T1-H64-K64-V64")
# (BV_MAX, NUM_WARPS); STATE_ELEMS is lifted so that BV_MAX alone sets the tile.
CANDIDATES = [(bv, w) for bv in (16, 32, 64, 128) for w in (1, 2, 4, 8)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(registry.OPS))
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--dtype", choices=tuple(registry.DTYPES), default="bf16")
    p.add_argument("--deadline", type=float, default=None, help="stop starting cases after s")
    p.add_argument("--commit", default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="a tiny shape, 3 candidates (and 2 ops)")
    p.add_argument(
        "--candidates",
        nargs="+",
        metavar="BV,W",
        default=None,
        help="(BV_MAX, NUM_WARPS) pairs to time (default: BV 16..128 × 1..8 warps)",
    )
    args = p.parse_args(argv)
    try:
        args.candidates = [tuple(int(x) for x in c.split(",")) for c in args.candidates or ()]
    except ValueError:
        p.error(f"--candidates {args.candidates}: BV,W pairs of integers")
    for c in args.candidates:
        if len(c) != 2 or c[0] < 16 or c[0] & (c[0] - 1) or c[1] not in (1, 2, 4, 8, 16):
            p.error(f"--candidates {c}: BV a power of two ≥ 16, W in 1, 2, 4, 8, 16")
    if args.quick:
        args.shapes, args.steps = ["B2-T1-H2-K32-V48"], 2
        if args.ops == list(OPS):
            args.ops = ["gla", "mlstm[exp]"]
    return args


def tile_of(cand: tuple) -> dict:
    """STEP_TILE of a (BV_MAX, NUM_WARPS) candidate."""
    return dict(BV_MAX=cand[0], STATE_ELEMS=1 << 30, NUM_WARPS=cand[1], FULL_WARPS=cand[1])


def effective(shape: dict, tile: dict) -> tuple:
    """The (BV, warps) ``tile`` gives at ``shape``."""
    return tr._value_tile(shape["K"], shape["V"], tile)[1:]


def time_loop(loop, device, case) -> float:
    """ms of one loop call: a CUDA-graph replay on CUDA, else a perf_counter median."""
    if device.type == "cuda":
        row = decode.graph_timing(loop, case, device, 1)
        if row["graph_status"] != "ok":
            raise RuntimeError(row["graph_status"])
        return row["graph_loop_ms"]
    return timing.median_ms(loop, case, device)


def run_tile(op, per_step, state0, tile, device, case):
    """(first output, loop ms) with ``tile`` in STEP_TILE, from a fresh copy of the state."""
    saved = dict(tr.STEP_TILE)
    tr.STEP_TILE.update(tile)
    try:
        state = decode.clone_state(state0)
        step_fn = decode.build_linrnn(dict(case, op=op), per_step, state)
        steps = len(per_step)
        with torch.no_grad():
            o = step_fn(0).clone()
            timing.sync(device)

            def loop():
                for t in range(steps):
                    step_fn(t)

            return o, time_loop(loop, device, case)
    finally:
        tr.STEP_TILE.update(saved)


def sweep(args) -> dict:
    device = torch.device(args.device)
    case = dict(device=args.device, dtype=args.dtype, warmup_ms=25, rep_ms=100, cpu_repeats=3,
                backend_forced="triton")  # fmt: skip
    t_start, rows = time.perf_counter(), []
    default = dict(tr.STEP_TILE)
    for op in args.ops:
        for shape_id in args.shapes:
            if args.deadline and time.perf_counter() - t_start > args.deadline:
                rows.append(dict(op=op, shape=shape_id, status="not run: deadline"))
                continue
            shape = registry.parse_shape(shape_id)
            per_step, state0 = decode.step_inputs(op, shape, args.steps, args.dtype, 0, device)
            o_ref, base_ms = run_tile(op, per_step, state0, default, device, case)
            bv, warps = effective(shape, default)
            base = dict(op=op, shape=shape_id, tile="default", ms=base_ms, ratio=1.0, BV=bv,
                        warps=warps, err=0.0, status="ok")  # fmt: skip
            rows.append(base)
            print(f"{op} {shape_id} default (BV {base['BV']}, {base['warps']} warps): "
                  f"{base_ms / args.steps * 1e3:.1f} µs/step", flush=True)  # fmt: skip
            seen = {(base["BV"], base["warps"])}
            cands = args.candidates or (CANDIDATES[:3] if args.quick else CANDIDATES)
            for cand in cands:
                tile = tile_of(cand)
                eff = effective(shape, tile)
                if eff in seen:
                    continue
                seen.add(eff)
                row = dict(op=op, shape=shape_id, tile=f"BV{eff[0]}-w{eff[1]}", BV=eff[0],
                           warps=eff[1])  # fmt: skip
                try:
                    o, ms = run_tile(op, per_step, state0, tile, device, case)
                    err = decode.rel_err(o, o_ref)
                    row.update(ms=ms, ratio=ms / base_ms, err=err,
                               status="ok" if err < 1e-2 else "wrong result")  # fmt: skip
                except Exception as exc:  # e.g. out of registers / resources at 1 warp
                    row.update(status=f"error: {type(exc).__name__}: {str(exc)[:200]}")
                rows.append(row)
                if row["status"] == "ok":
                    print(f"  {row['tile']}: {ms / args.steps * 1e3:.1f} µs/step "
                          f"({row['ratio']:.3f}x), err {err:.1e}", flush=True)  # fmt: skip
                else:
                    print(f"  {row['tile']}: {row['status']}", flush=True)
    return dict(rows=rows, steps=args.steps, dtype=args.dtype, default=default)


def best_table(result: dict) -> str:
    """Per op × shape: the default's µs/step and the best candidate with its ratio."""
    lines, steps = [], result["steps"]
    keys = dict.fromkeys((r["op"], r["shape"]) for r in result["rows"])
    for op, shape in keys:
        rows = [r for r in result["rows"] if (r["op"], r["shape"]) == (op, shape)]
        ok = [r for r in rows if r["status"] == "ok"]
        if not ok:
            lines.append(f"{op:16s} {shape:22s} {rows[0]['status']}")
            continue
        base, best = ok[0], min(ok, key=lambda r: r["ms"])
        us = lambda r: r["ms"] / steps * 1e3  # noqa: E731
        lines.append(
            f"{op:16s} {shape:22s} default {us(base):7.1f} µs  best {best['tile']:9s}"
            f" {us(best):7.1f} µs ({best['ratio']:.3f}x)"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("decode_sweep: no CUDA device (use --device cpu with TRITON_INTERPRET=1)")
        return 2
    result = sweep(args)
    print("\nbest per op and shape (µs per step; ratio to the default tile):")
    print(best_table(result))
    info = {"torch": torch.__version__}
    if args.device == "cuda":
        import triton

        info.update(gpu=torch.cuda.get_device_name(), triton=triton.__version__)
    result["machine"] = report.machine_info(info, args.device, args.commit)
    result["command"] = " ".join(sys.argv)
    if args.out:
        args.out.write_text(json.dumps(report.clean_json(result), indent=1))
        print(f"wrote {args.out}")
    bad = [r for r in result["rows"] if r["status"] == "wrong result"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
