"""What a decode step's memory traffic can reach on this GPU: the fp32 state read and written
once, by kernels that do nothing else, timed as the decode suite times a step (16 launches
captured in one CUDA graph, ``do_bench`` median of the replay, per launch).

* ``copy``: ``torch.Tensor.copy_`` of the state into a second buffer;
* ``scale BV×W``: a Triton kernel that reads a program's ``[K, BV]`` tile of the state and
  writes it back scaled, in place, on the decode step's grid ``(V / BV, N·H)`` with W warps:
  the recurrent kernel's access pattern without its step.

Each is given against the floor the decode suite uses (the state bytes read and written at the
spec sheet's 4.8 TB/s, H200). ``--profile OPS`` instead runs three eager steps of each op at
K = V = 64 (``linrnn.step`` on the Triton path, the shipped tile) for a profiler to attach::

    python3 benchmarks/decode_bound.py                                  # the bound kernels
    ncu --clock-control none -k regex:recurrent_fwd_kernel --section Occupancy \\
        --section LaunchStats --section SpeedOfLight \\
        python3 benchmarks/decode_bound.py --profile linear_attn gla mlstm[exp]
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import triton
import triton.language as tl
import triton.testing

SPEC_BYTES_PER_S = 4.8e12  # H200 spec sheet
LAUNCHES = 16  # per CUDA graph, as the decode suite's loop
SHAPES = {"B64-H64-K64-V64": (64 * 64, 64), "B64-H16-K256-V256": (64 * 16, 256)}


@triton.jit
def scale_kernel(x, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """x[i, :, tile] *= 0.999 for program (tile, i) of grid (V / BV, N·H)."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_k, o_v = tl.arange(0, K), i_v * BV + tl.arange(0, BV)
    p = x + i_nh * K * V + o_k[:, None] * V + o_v[None, :]
    tl.store(p, tl.load(p) * 0.999)


def graph_us(fn) -> float:
    """Per-launch µs of ``fn`` replayed LAUNCHES times in one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES):
            fn()
    ms = triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
    return ms * 1e3 / LAUNCHES


def kernels(NH: int, K: int) -> list:
    """(name, fn) of the bound kernels over a state [NH, K, K] fp32."""
    x = torch.randn(NH, K, K, device="cuda")
    y = torch.empty_like(x)
    cases = [("copy", lambda: y.copy_(x))]
    for BV in (32, 64):
        for w in (1, 2, 4, 8):
            launch = scale_kernel[(K // BV, NH)]
            cases.append((f"scale {BV}x{w}", functools.partial(
                launch, x, K=K, V=K, BV=BV, num_warps=w)))  # fmt: skip
    return cases


def bounds() -> list[dict]:
    rows = []
    for shape, (NH, K) in SHAPES.items():
        floor_us = 2 * NH * K * K * 4 / SPEC_BYTES_PER_S * 1e6
        for name, fn in kernels(NH, K):
            us = graph_us(fn)
            rows.append(dict(shape=shape, kernel=name, us=round(us, 2),
                             x_floor=round(us / floor_us, 3)))  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    return rows


def profile(ops: list[str]) -> None:
    from linrnn.bench import decode, registry

    for op in ops:
        per_step, state = decode.step_inputs(
            op, registry.parse_shape("B64-T1-H64-K64-V64"), 3, "bf16", 0, torch.device("cuda")
        )
        step = decode.build_linrnn({"op": op, "device": "cuda"}, per_step, state)
        with torch.no_grad():
            for t in range(3):
                step(t)
        torch.cuda.synchronize()
        print(op, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", nargs="+", metavar="OP", help="eager steps of these ops")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_bound.py times GPU kernels: it needs CUDA")
    if args.profile:
        profile(args.profile)
    else:
        bounds()


if __name__ == "__main__":
    main()
