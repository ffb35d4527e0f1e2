"""Host time of one eager decode step (``linrnn.step`` on the Triton recurrent path, T = 1, an
fp32 state updated in place), per family, and where it goes. Each family is called as its
layer calls it (the delta rules normalizing q and k in the op, Mamba2 with softplus step sizes,
a bias and D).

    python3 benchmarks/step_host.py                       # every family, B64-H8-K64-V64
    python3 benchmarks/step_host.py --ops gla --profile   # and the top functions (cProfile)

On a GPU a step's kernel takes a few microseconds, so back-to-back eager steps run at the host's
pace: the time per step, without a synchronize between steps, is the host work (linrnn's Python,
Triton's launcher and the small torch ops around the kernel). Without a GPU the kernel launches
are replaced by no-ops (Triton's interpreter would run them) and the value checks are off, as
they are for CUDA tensors: what is left is linrnn's own share of that host work, with the
torch ops around the kernel run on the CPU.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import os
import pstats
import sys
import time

import torch

if not torch.cuda.is_available():  # the Triton backend on CPU tensors needs the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import linrnn

BATCHES = 10  # the steps are timed in this many batches; the fastest batch's mean is reported
OPS = ("linear_attn", "retention", "simple_gla", "gla", "rwkv6", "mlstm", "delta_rule",
       "gated_delta_rule", "mamba2")  # fmt: skip


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](**kwargs)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def stub_kernels() -> None:
    """Replace the kernels a decode step launches by :class:`_NoLaunch` (the host of a
    CPU-only run): the recurrent ones, the delta rule's (and its key normalization) and
    Mamba2's gates."""
    from linrnn.engine import delta_recurrent_kernels, l2norm, mamba2_gates, recurrent_kernels

    for module in (recurrent_kernels, delta_recurrent_kernels, l2norm, mamba2_gates):
        for name in dir(module):
            if name.endswith("_kernel"):
                setattr(module, name, _NoLaunch())


def step_case(op: str, B: int, H: int, K: int, V: int, device: str):
    """``(fn, inputs, state)`` of one decode step of ``op`` (gates in their usual ranges)."""
    x = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    q, k, v = x(B, 1, H, K), x(B, 1, H, K), x(B, 1, H, V)
    S = torch.zeros(B, H, K, V, device=device)
    if op == "linear_attn":
        return linrnn.linear_attn, (q, k, v), S
    if op == "retention":
        return linrnn.retention, (q, k, v, -torch.rand(H, device=device)), S
    if op == "simple_gla":
        return linrnn.simple_gla, (q, k, v, -torch.rand(B, 1, H, device=device)), S
    if op == "gla":
        return linrnn.gla, (q, k, v, -torch.rand(B, 1, H, K, device=device)), S
    if op == "rwkv6":
        return linrnn.rwkv6, (q, k, v, -torch.rand(B, 1, H, K, device=device), x(H, K)), S
    if op == "mlstm":
        n, m = torch.zeros(B, H, K, device=device), torch.zeros(B, H, device=device)
        return linrnn.mlstm, (q, k, v, x(B, 1, H), x(B, 1, H)), (S, n, m)
    if op in ("delta_rule", "gated_delta_rule"):  # q, k normalized in the op, as the layers do
        beta = torch.rand(B, 1, H, device=device)
        if op == "delta_rule":
            return functools.partial(linrnn.delta_rule, use_qk_l2norm=True), (q, k, v, beta), S
        fn = functools.partial(linrnn.gated_delta_rule, use_qk_l2norm=True)
        return fn, (q, k, v, -torch.rand(B, 1, H, device=device), beta), S
    if op == "mamba2":  # x [B, 1, H, P], dt, A, B and C of one group (K = N, V = P), as
        # the Mamba2 layer calls it: softplus step sizes with a bias, and D
        dt, A = x(B, 1, H), -torch.rand(H, device=device) - 0.5
        fn = functools.partial(linrnn.mamba2, D=x(H), dt_bias=x(H), dt_softplus=True)
        return fn, (v, dt, A, x(B, 1, 1, K), x(B, 1, 1, K)), S
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def host_us(op: str, B=64, H=8, K=64, V=64, steps=2000, profile=False,
            batches=BATCHES) -> tuple[float, str]:  # fmt: skip
    """(µs per eager step of ``op``, the cProfile table or ""). On a GPU wall time (the host's
    pace of back-to-back steps); without one the thread's CPU time (the stubbed launches leave
    only host work, and a shared machine's stolen time does not count)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    clock = time.perf_counter if device == "cuda" else time.thread_time
    fn, inputs, state = step_case(op, B, H, K, V, device)

    def run(n):
        for _ in range(n):
            linrnn.step(fn, *inputs, state=state, inplace=True, backend="triton")

    def timed(n):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = clock()
        run(n)
        if device == "cuda":
            torch.cuda.synchronize()
        return (clock() - t0) / n * 1e6

    with torch.no_grad(), linrnn.checks(False):
        run(100)  # compile, caches
        # the fastest of the batches, as timeit reports: a shared machine's noise only adds
        us = min(timed(max(1, steps // batches)) for _ in range(batches))
        table = ""
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            run(min(steps, 500))
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
            table = out.getvalue()
    return us, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--shape", default="B64-H8-K64-V64", help="B..-H..-K..-V..")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=BATCHES, help="time the steps in this many")
    ap.add_argument("--profile", action="store_true", help="also the top functions (cProfile)")
    args = ap.parse_args(argv)
    dims = dict((part[0], int(part[1:])) for part in args.shape.split("-"))
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
        stub_kernels()
    where = "GPU" if torch.cuda.is_available() else "CPU, kernel launches stubbed"
    print(f"eager decode step, {args.shape}, {where}:")
    for op in args.ops:
        us, table = host_us(op, dims["B"], dims["H"], dims["K"], dims["V"], args.steps,
                            args.profile, args.batches)  # fmt: skip
        print(f"  {op:<16} {us:8.1f} µs per step")
        if table:
            print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
