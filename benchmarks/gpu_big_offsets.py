"""GPU check that the Triton kernels address tensors beyond 2^31 elements correctly (int64
offsets), issue 3 point 4.

Batch element 1 of a [2, T, H, K] tensor starts at element T·H·K; with T·H·K ≥ 2^31 every one of
its offsets overflows int32. The check runs forward and backward on the 2-element batch and
compares batch element 1 (output, final state, every gradient) with the same inputs run alone
as a batch of one, whose offsets stay below 2^31. Same kernels, same tiles, same chunking: the
two must agree to rounding (they are usually bitwise equal). An int32 overflow anywhere would
read or write the wrong memory and show up as a large error, NaN, or a crash.

    python3 benchmarks/gpu_big_offsets.py --out $OUT/big_offsets.json          # H200: ~40 GB
    python3 benchmarks/gpu_big_offsets.py --tokens 96 --heads 2 --dim 16       # CPU smoke test

On CPU (TRITON_INTERPRET=1) the sizes must be tiny; the smoke test only checks the script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch


def rel(a: torch.Tensor, b: torch.Tensor, block: int = 2**26) -> float:
    """RMS-relative difference, in blocks (the tensors hold billions of elements)."""
    a, b = a.reshape(-1), b.reshape(-1).to(a.device)
    num = den = 0.0
    for i in range(0, a.numel(), block):
        x, y = a[i : i + block].double(), b[i : i + block].double()
        num += float(((x - y) ** 2).sum())
        den += float((y**2).sum())
    return (num / max(den, 1e-300)) ** 0.5


def run(family: str, mode: str, q, k, v, gates):
    import linrnn

    leaves = [q, k, v, *gates]
    for t in leaves:
        t.grad = None
    if family == "mlstm_exp":
        o, st = linrnn.mlstm(q, k, v, *gates, input_gate="exp", mode=mode, backend="triton",
                             output_final_state=True)  # fmt: skip
    else:
        o, st = linrnn.simple_gla(q, k, v, *gates, mode=mode, backend="triton",
                                  output_final_state=True)  # fmt: skip
    S = st[0] if isinstance(st, tuple) else st
    # Cotangents from the last batch element's own seed, so both runs see the same ones.
    cot = []
    for x in (o, S):
        gen = torch.Generator(device=x.device).manual_seed(7)
        c = torch.randn(x[-1:].shape, generator=gen, device=x.device, dtype=x.dtype)
        cot.append(torch.cat([torch.zeros_like(x[:-1]), c]) if x.shape[0] > 1 else c)
    torch.autograd.backward([o, S], cot)
    del cot
    return [o.detach(), S.detach()] + [t.grad.detach() for t in leaves]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, help="T per batch element (default: T·H·K ≥ 2^31)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128, help="K = V")
    p.add_argument("--families", nargs="+", default=["simple_gla", "mlstm_exp"])
    p.add_argument("--modes", nargs="+", default=["chunk", "fused_chunk"])
    p.add_argument("--out")
    args = p.parse_args()

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    H, D = args.heads, args.dim
    T = args.tokens or -(-(2**31) // (H * D))
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    big = T * H * D >= 2**31
    print(f"T={T} H={H} K=V={D}: batch element 1 starts at element {T * H * D:,}"
          f" ({'beyond' if big else 'below'} 2^31)")  # fmt: skip
    rows = []
    for family in args.families:
        for mode in args.modes:
            torch.manual_seed(0)
            x = [torch.randn(2, T, H, D, device=dev, dtype=dt) * 0.5 for _ in range(3)]
            if family == "mlstm_exp":
                g = [torch.randn(2, T, H, device=dev), torch.randn(2, T, H, device=dev) + 3]
            else:
                g = [torch.nn.functional.logsigmoid(torch.randn(2, T, H, device=dev) + 3)]
            t0 = time.perf_counter()
            # Batch element 1 alone first (offsets < 2^31); its results wait on the host.
            one = run(family, mode, *(t[1:].clone().requires_grad_() for t in x),
                      [t[1:].clone().requires_grad_() for t in g])  # fmt: skip
            one = [t.cpu() for t in one]
            both = run(family, mode, *(t.requires_grad_() for t in x),
                       [t.requires_grad_() for t in g])  # fmt: skip
            names = ["o", "S_T", "dq", "dk", "dv"] + [f"dgate{j}" for j in range(len(g))]
            errs = {n: rel(a[1:], b) for n, a, b in zip(names, both, one)}
            finite = all(bool(torch.isfinite(a[1:]).all()) for a in both)
            worst = max(errs.values())
            ok = finite and worst <= 1e-5
            rows.append(dict(family=family, mode=mode, errors=errs, finite=finite, ok=ok,
                             seconds=time.perf_counter() - t0))  # fmt: skip
            print(f"{family:10s} {mode:12s} worst rel. diff {worst:.2e} finite={finite} "
                  f"{'PASS' if ok else 'FAIL'}")  # fmt: skip
            del x, g, both, one
            if dev == "cuda":
                torch.cuda.empty_cache()
    if args.out:
        import triton

        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()  # fmt: skip
        except OSError:
            commit = None
        meta = dict(
            gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
            torch=torch.__version__, triton=triton.__version__,
            commit=os.environ.get("LINRNN_COMMIT", commit),
        )  # fmt: skip
        shape = dict(B=2, T=T, H=H, K=D, V=D, beyond_2_31=big)
        with open(args.out, "w") as f:
            json.dump(dict(machine=meta, shape=shape, rows=rows), f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
