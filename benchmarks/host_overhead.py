"""Host (Python) time of one decode step on the Triton path, with the kernel launch stubbed
out: what linrnn's own code costs per token before the GPU does anything. Runs on a CPU
machine (TRITON_INTERPRET=1 only lets the Triton path be chosen; no kernel runs).

    python3 benchmarks/host_overhead.py                 # linear_attn, gla, mlstm at B64-H64-K64
    python3 benchmarks/host_overhead.py --families gla --profile   # + cProfile of the step
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (linrnn imports it)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import linrnn
from linrnn.engine import triton_recurrent


class _NoLaunch:
    """Stands in for the recurrent kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def step_fn(family: str, B: int, H: int, K: int, V: int):
    q, k = torch.randn(B, 1, H, K), torch.randn(B, 1, H, K)
    v = torch.randn(B, 1, H, V)
    if family == "linear_attn":
        S = torch.zeros(B, H, K, V)
        return lambda: linrnn.linear_attn_step(q, k, v, state=S, inplace=True, backend="triton")
    if family == "gla":
        S, g = torch.zeros(B, H, K, V), torch.nn.functional.logsigmoid(torch.randn(B, 1, H, K))
        return lambda: linrnn.gla_step(q, k, v, g, state=S, inplace=True, backend="triton")
    if family == "mlstm":
        st = (torch.zeros(B, H, K, V), torch.zeros(B, H, K), torch.zeros(B, H))
        i, f = torch.randn(B, 1, H), torch.randn(B, 1, H)
        return lambda: linrnn.mlstm_step(q, k, v, i, f, state=st, inplace=True, backend="triton")
    raise ValueError(f"unknown family {family!r}: linear_attn, gla or mlstm")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=["linear_attn", "gla", "mlstm"])
    p.add_argument("--shape", default="64,64,64,64", help="B,H,K,V")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--profile", action="store_true", help="cProfile 500 steps per family")
    args = p.parse_args(argv)
    B, H, K, V = (int(x) for x in args.shape.split(","))
    triton_recurrent.recurrent_fwd_kernel = _NoLaunch()
    linrnn.set_checks(False)  # as on a GPU: no value checks (they are on by default on CPU)
    for family in args.families:
        fn = step_fn(family, B, H, K, V)
        for _ in range(50):
            fn()
        t = time.perf_counter()
        for _ in range(args.steps):
            fn()
        us = (time.perf_counter() - t) / args.steps * 1e6
        print(f"{family} B{B}-H{H}-K{K}-V{V}: host {us:.1f} us per step (kernel launch stubbed)")
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
