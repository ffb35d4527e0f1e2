"""Host (Python) time of one decode step on the Triton path, with the kernel launch stubbed
out: what linrnn's own code costs per token before the GPU does anything. Runs on a CPU
machine (TRITON_INTERPRET=1 only lets the Triton path be chosen; no kernel runs).

    python3 benchmarks/host_overhead.py                 # every decode-suite op at B64-H64-K64
    python3 benchmarks/host_overhead.py --ops retention --profile   # + cProfile of the step
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (linrnn imports it)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


import linrnn
from linrnn.bench import decode, registry
from linrnn.engine import triton_recurrent

DECODE_OPS = (
    "linear_attn",
    "linear_attn[normalize]",
    "retention",
    "simple_gla",
    "gla",
    "gla[gv]",
    "rwkv6",
    "mlstm[sigmoid]",
    "mlstm[sigmoid,normalize]",
    "mlstm[exp]",
)


class _NoLaunch:
    """Stands in for the recurrent kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def step_fn(op: str, B: int, H: int, K: int, V: int):
    """One decode step of ``op`` (a registry op, e.g. ``retention`` or ``mlstm[sigmoid]``)
    exactly as ``linrnn bench --suite decode`` calls it: ``linrnn.step(..., inplace=True)``
    on the suite's own inputs and state, the Triton backend forced."""
    shape = dict(B=B, T=1, H=H, K=K, V=V)
    per_step, state = decode.step_inputs(op, shape, 1, "fp32", 0, "cpu")
    fn = decode.build_linrnn(dict(op=op, backend_forced="triton"), per_step, state)
    return lambda: fn(0)


def aten_ops(fn) -> collections.Counter:
    """The ATen ops one call of ``fn`` runs: on a GPU each is a launch or an allocation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    with Count() as c:
        fn()
    return c.ops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", nargs="+", default=list(DECODE_OPS), choices=list(registry.OPS))
    p.add_argument("--shape", default="64,64,64,64", help="B,H,K,V")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--profile", action="store_true", help="cProfile 500 steps per op")
    p.add_argument("--count-ops", action="store_true", help="the ATen ops of one step per op")
    args = p.parse_args(argv)
    B, H, K, V = (int(x) for x in args.shape.split(","))
    triton_recurrent.recurrent_fwd_kernel = _NoLaunch()
    linrnn.set_checks(False)  # as on a GPU: no value checks (they are on by default on CPU)
    for op in args.ops:
        fn = step_fn(op, B, H, K, V)
        for _ in range(50):
            fn()
        t = time.perf_counter()
        for _ in range(args.steps):
            fn()
        us = (time.perf_counter() - t) / args.steps * 1e6
        print(f"{op:26s} B{B}-H{H}-K{K}-V{V}: host {us:.1f} us per step (kernel launch stubbed)")
        if args.count_ops:
            ops = aten_ops(fn)
            listed = ", ".join(f"{k} ×{n}" for k, n in ops.items())
            print(f"  {sum(ops.values())} ATen ops: {listed}")
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(500):
                fn()
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
