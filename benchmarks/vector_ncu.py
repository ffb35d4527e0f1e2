"""One forward+backward of a vector-gate op for Nsight Compute: warm-up calls first, then the
measured call between cudaProfilerStart/Stop, so that ``ncu --profile-from-start off`` sees
each of the engine's kernels once, at full shape, with compiled kernels. GPU only.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats -k regex:'apply_kernel|states_' \\
        python3 benchmarks/vector_ncu.py --op gla --shape B8-T8192-H16-K256-V256

Inputs as vector_sweep.py's: bf16 q, k, v, log decays logsigmoid(randn + 3) per channel
(fp32), u = 0.1·randn for rwkv6; chunk mode at --chunk.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import linrnn


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=("gla", "gla_gv", "rwkv6"), default="gla")
    p.add_argument("--shape", default="B8-T8192-H16-K256-V256")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    dims = {part[0]: int(part[1:]) for part in args.shape.split("-")}
    B, T, H, K, V = (dims[c] for c in "BTHKV")
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    q, k = (torch.randn(B, T, H, K, device=dev, dtype=bf16).requires_grad_() for _ in "qk")
    v = torch.randn(B, T, H, V, device=dev, dtype=bf16).requires_grad_()
    g = F.logsigmoid(torch.randn(B, T, H, K, device=dev) + 3).requires_grad_()
    kw = dict(backend="triton", mode="chunk", chunk_size=args.chunk)
    if args.op == "rwkv6":
        u = (0.1 * torch.randn(H, K, device=dev)).requires_grad_()
        run = lambda: linrnn.rwkv6(q, k, v, g, u, **kw)[0]  # noqa: E731
    else:
        gv = None
        if args.op == "gla_gv":
            gv = F.logsigmoid(torch.randn(B, T, H, V, device=dev) + 3).requires_grad_()
        run = lambda: linrnn.gla(q, k, v, g, gv=gv, **kw)[0]  # noqa: E731
    do = torch.randn(B, T, H, V, device=dev, dtype=bf16)
    for _ in range(args.warmup):
        run().backward(do)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run().backward(do)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{args.op} {args.shape} L={args.chunk}: one fwd+bwd profiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
