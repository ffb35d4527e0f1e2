"""Per-channel log-decay gradients over long sequences: GLA with gk and gv, fp16 (or fp32), the
Triton chunk and fused_chunk modes against the float64 PyTorch engine; RMS-relative errors of
o, dq, dk, dv, dgk, dgv. Runs under TRITON_INTERPRET=1 on CPU (the figures in README and in
benchmarks/results/2026-11-21-h200-s4-notes.md §5 came from it) or on a GPU.

    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/gate_grad_precision.py --tokens 1024
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import linrnn


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=32, help="K = V")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--dtype", choices=("float16", "float32", "bfloat16"), default="float16")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    B, T, H, D = 1, args.tokens, args.heads, args.dim
    q, k, v, do = (torch.randn(B, T, H, D, dtype=torch.float64, device=dev) for _ in range(4))
    gk, gv = (F.logsigmoid(torch.randn(B, T, H, D, dtype=torch.float64, device=dev) + 4)
              for _ in range(2))  # fmt: skip

    def run(mode, backend, dtype):
        xs = [t.to(dtype).clone().requires_grad_() for t in (q, k, v)]
        gdt = torch.float64 if dtype == torch.float64 else torch.float32
        gs = [t.to(gdt).clone().requires_grad_() for t in (gk, gv)]
        o, _ = linrnn.gla(*xs, gs[0], gv=gs[1], mode=mode, backend=backend,
                          chunk_size=args.chunk)  # fmt: skip
        o.backward(do.to(o.dtype))
        return [o.detach().double()] + [t.grad.double() for t in xs + gs]

    ref = run("chunk", "torch", torch.float64)
    dtype = getattr(torch, args.dtype)
    print(f"GLA with gk and gv, B={B} T={T} H={H} K=V={D} L={args.chunk}, {args.dtype}, "
          f"seed {args.seed}: RMS-relative error vs float64")  # fmt: skip
    for mode in ("chunk", "fused_chunk"):
        got = run(mode, "triton", dtype)
        errs = [float((a - b).norm() / b.norm()) for a, b in zip(got, ref)]
        names = ("o", "dq", "dk", "dv", "dgk", "dgv")
        print(f"  {mode:12s} " + " ".join(f"{n}={e:.2e}" for n, e in zip(names, errs)))


if __name__ == "__main__":
    main()
