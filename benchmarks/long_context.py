"""Cost per token of one long sequence as it grows: forward+backward (and forward alone) of
one sequence (B = 1) at each length, its peak memory, and its kernels' GPU time per token
(benchmarks/kernel_times.py), so that a chunkwise op's linearity in T is checked and, where
it breaks, the kernel that grows is named.

    python3 benchmarks/long_context.py                       # simple GLA, GLA, mLSTM sigmoid,
                                                             # 64K to 512K tokens, H16-K256-V256
    python3 benchmarks/long_context.py --ops gla --lengths 65536 524288 --out long.json

Inputs are ``linrnn bench``'s (:func:`linrnn.bench.registry.build_linrnn`, bf16, mode chunk).
Times are means over ``--iters`` calls after two warm-up calls, between CUDA events on a GPU
(``time.perf_counter`` without one: the PyTorch path, a check of the command, not a timing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_times  # benchmarks/ is not a package

OPS = ("simple_gla", "gla", "mlstm[sigmoid]")
LENGTHS = (65536, 131072, 262144, 524288)


def _timer(device: str):
    """A function that runs ``fn`` n times and returns the mean ms per call."""

    def timed(fn, n):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / n
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e3

    return timed


def _wall(op: str, shape_id: str, device: str, iters: int) -> tuple:
    """(ms of forward+backward, ms of the forward, GiB of peak memory or None) of one case; its
    tensors are freed on return."""
    from linrnn.bench import registry

    shape = registry.parse_shape(shape_id)
    leaves, fwd = registry.build_linrnn(kernel_times.bench_case(op, shape, "bf16", device), shape)

    def both():
        for x in leaves:
            x.grad = None
        o = fwd()
        o.backward(torch.ones_like(o))

    def forward():
        with torch.no_grad():
            fwd()

    timed = _timer(device)
    for _ in range(2):  # compile, autotune, allocator
        both()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    ms, fwd_ms = timed(both, iters), timed(forward, iters)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return ms, fwd_ms, peak


def measure(op: str, T: int, H: int, K: int, V: int, iters: int = 4) -> dict:
    """One row: ms and µs per token of forward+backward and of the forward, GiB of peak memory
    (CUDA), the kernels' ms per forward+backward and the five largest."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape_id = f"B1-T{T}-H{H}-K{K}-V{V}"
    ms, fwd_ms, peak = _wall(op, shape_id, device, iters)
    if device == "cuda":
        torch.cuda.empty_cache()
    kt = kernel_times.kernel_times(op, shape_id, "bf16", iters=1)
    if device == "cuda":
        torch.cuda.empty_cache()
    top = dict(list(kt["kernels"].items())[:5])
    return dict(op=op, T=T, shape=shape_id, device=device, ms=round(ms, 4),
                fwd_ms=round(fwd_ms, 4), us_per_token=ms * 1e3 / T,
                fwd_us_per_token=fwd_ms * 1e3 / T, kernels_ms=kt["total_ms"], peak_gib=peak,
                top=top)  # fmt: skip


def print_rows(rows: list) -> None:
    """Per op: a line per length, with the per-token cost over the shortest length's, then the
    largest kernels per token at the shortest and the longest."""
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = sorted((r for r in rows if r["op"] == op), key=lambda r: r["T"])
        first = mine[0]
        print(f"\n{op}, one sequence, {first['shape'].split('-', 2)[2]} bf16 ({first['device']}):")
        print(f"  {'T':>8} {'fwd+bwd ms':>11} {'µs/token':>9} {'× first':>8} {'fwd µs/tok':>11} "
              f"{'kernels µs/tok':>15} {'peak GiB':>9}")  # fmt: skip
        for r in mine:
            peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
            print(f"  {r['T']:>8} {r['ms']:11.2f} {r['us_per_token']:9.4f} "
                  f"{r['us_per_token'] / first['us_per_token']:8.3f} "
                  f"{r['fwd_us_per_token']:11.4f} {r['kernels_ms'] * 1e3 / r['T']:15.4f} "
                  f"{peak:>9}")  # fmt: skip
        for r in (first, mine[-1]) if len(mine) > 1 else (first,):
            per = ", ".join(f"{kernel_times.short_name(n, 28)} {ms * 1e3 / r['T']:.4f}"
                            for n, (ms, _) in r["top"].items())  # fmt: skip
            print(f"  T={r['T']} kernels, µs/token: {per}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", nargs="+", default=list(OPS))
    ap.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    ap.add_argument("--heads", default="H16-K256-V256", help="H..-K..-V..")
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    a = ap.parse_args(argv)
    dims = dict((part[0], int(part[1:])) for part in a.heads.split("-"))
    rows = []
    for op in a.ops:
        for T in a.lengths:
            try:
                rows.append(measure(op, T, dims["H"], dims["K"], dims["V"], a.iters))
            except Exception as e:  # one failing length does not lose the others' rows
                print(f"{op} T={T}: {type(e).__name__}: {e}", file=sys.stderr)
    print_rows(rows)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
