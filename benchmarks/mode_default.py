"""What ``mode=None`` should pick between ``chunk`` and ``fused_chunk``: both modes' forward and
forward+backward times per op and shape (the inputs of ``linrnn bench``, each mode at its
default chunk size), beside the mode :func:`linrnn.ops._generic.route` picks for that call, so
a rule of :data:`linrnn.engine.config.FUSED_DEFAULT` that disagrees with the measurement shows
as a ``!`` in the last columns.

    python3 benchmarks/mode_default.py --warm            # compile in parallel workers first
    python3 benchmarks/mode_default.py --out mode.json   # then time, one call at a time
    python3 benchmarks/mode_default.py --reverse --out mode-2.json   # a second pass

``--shapes`` and ``--ops`` narrow the sweep (default: the ops of ``FUSED_DEFAULT`` over
sequence × head walks N·H from 16 to 1024 at head dims 32 to 128). CUDA only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # kernel_times, beside this file
import kernel_times

OPS = ("linear_attn", "linear_attn[normalize]", "retention", "mlstm[sigmoid]")
WALKS = ((1, 8192, 16), (4, 8192, 16), (8, 8192, 16), (8, 8192, 32), (8, 8192, 64), (64, 1024, 16))
SHAPES = tuple(
    f"B{b}-T{t}-H{h}-K{k}-V{v}"
    for k, v in ((64, 64), (128, 128), (32, 32), (64, 128))
    for b, t, h in WALKS
)
MODES = ("chunk", "fused_chunk")


def build(op: str, shape_id: str, mode: str | None, device: str = "cuda"):
    """``(leaves, fwd)`` of ``op`` at ``shape_id`` as ``linrnn bench`` builds it, ``mode`` None
    with mode=None and the default chunk size (the route under test)."""
    from linrnn.bench import registry

    shape = registry.parse_shape(shape_id)
    case = kernel_times.bench_case(op, shape, "bf16", device, mode or "chunk")
    if mode is None:
        case.update(mode=None, chunk=None, backend=None)
    return registry.build_linrnn(case, shape)


def picked(op: str, shape_id: str, grad: bool, device: str = "cuda") -> str:
    """The mode :func:`route` gives this op's call at ``shape_id`` (with or without a gradient)."""
    from linrnn.bench import registry
    from linrnn.ops import _generic

    s = registry.parse_shape(shape_id)
    q = torch.empty(s["B"], s["T"], s["H"], s["K"], device=device, dtype=torch.bfloat16)
    v = torch.empty(s["B"], s["T"], s["H"], s["V"], device=device, dtype=torch.bfloat16)
    family = op.split("[")[0]
    return _generic.route(family, q, v, grad=grad, stabilize="exp" in op).mode


def same_as_picked(op: str, shape_id: str, pick: list, device: str = "cuda") -> bool:
    """Whether mode=None's outputs, without and with a gradient, equal bit for bit those of the
    modes it picked, called explicitly (the route is the only difference)."""
    outs = {}
    for mode in (None, *set(pick)):
        _, fwd = build(op, shape_id, mode, device)
        with torch.no_grad():
            outs[mode, False] = fwd()
        outs[mode, True] = fwd().detach()
    return all(torch.equal(outs[None, g], outs[pick[g], g]) for g in (False, True))


def time_one(op: str, shape_id: str, mode: str | None) -> tuple[float, float]:
    """(forward ms, forward+backward ms), ``triton.testing.do_bench`` medians."""
    from triton.testing import do_bench

    leaves, fwd = build(op, shape_id, mode)

    def once():
        for x in leaves:
            x.grad = None
        o = fwd()
        o.backward(torch.ones_like(o))

    once()
    with torch.no_grad():
        f = do_bench(fwd, warmup=25, rep=100)
    fb = do_bench(once, warmup=25, rep=100)
    torch.cuda.empty_cache()
    return f, fb


def warm(ops, shapes) -> None:
    """Compile every (op, head dims, mode) once, in parallel worker processes."""
    dims = {}
    for s in shapes:
        dims.setdefault(s.split("-", 3)[3], s)  # one shape per head-dim pair
    jobs = [(op, s) for op in ops for s in dims.values()]
    here = os.path.abspath(__file__)

    def one(job):
        op, s = job
        cmd = [sys.executable, here, "--ops", op, "--shapes", s, "--compile-only"]
        return subprocess.run(cmd, capture_output=True, text=True).returncode

    with ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1)) as pool:
        codes = list(pool.map(one, jobs))
    print(f"compiled {len(jobs)} (op, head dims) pairs, {sum(c != 0 for c in codes)} failed")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", nargs="+", default=list(OPS))
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--reverse", action="store_true", help="the shapes in reverse order")
    ap.add_argument("--warm", action="store_true", help="compile in parallel, time nothing")
    ap.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    ap.add_argument("--commit", default=None, help="git commit to record with the rows")
    a = ap.parse_args(argv)
    if a.reverse:
        a.shapes = a.shapes[::-1]
    if not torch.cuda.is_available():
        print("mode_default.py times the Triton kernels: it needs a CUDA GPU", file=sys.stderr)
        return 2
    if a.warm:
        warm(a.ops, a.shapes)
        return 0
    rows = []
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__, commit=a.commit)  # fmt: skip
    print(f"{'op':24} {'shape':24} {'chunk fwd/fb':>15} {'fused fwd/fb':>15} "
          f"{'fastest':>15} {'None picks':>23}")  # fmt: skip
    for shape_id in a.shapes:
        for op in a.ops:
            row = dict(op=op, shape=shape_id)
            for mode in MODES:
                if a.compile_only:
                    _, fwd = build(op, shape_id, mode)
                    fwd().backward(torch.ones_like(fwd()))
                    continue
                row[mode] = time_one(op, shape_id, mode)
            if a.compile_only:
                continue
            best = [min(MODES, key=lambda m: row[m][i]) for i in (0, 1)]
            pick = [picked(op, shape_id, grad) for grad in (False, True)]
            row.update(fastest=best, picks=pick, same=same_as_picked(op, shape_id, pick))
            rows.append(row)
            c, f = row["chunk"], row["fused_chunk"]
            marks = ["" if p == b else "!" for p, b in zip(pick, best)]
            if not row["same"]:
                marks = [m + " (outputs differ)" for m in marks]
            short = lambda m: "fused" if m == "fused_chunk" else m  # noqa: E731
            print(f"{op:24} {shape_id:24} {c[0]:6.3f}/{c[1]:7.3f} {f[0]:6.3f}/{f[1]:7.3f} "
                  f"{short(best[0]):>7}/{short(best[1]):<7} "
                  f"{short(pick[0]) + marks[0]:>11}/{short(pick[1]) + marks[1]:<11}",
                  flush=True)  # fmt: skip
            if a.out:  # after every row: a run stopped early keeps what it measured
                with open(a.out, "w") as f:
                    json.dump(dict(meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
