"""Quick GPU timing of mLSTM-exp forward+backward under several states_bwd tiles (the serial
state-gradient walk; its tile also holds the boundary ⟨dC, C⟩ of the gate gradients).

    python3 benchmarks/states_bwd_tiles.py [--shape B8-T8192-H16-K256-V256]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

import linrnn
from linrnn.engine import triton_chunk as tc

p = argparse.ArgumentParser()
p.add_argument("--shape", default="B8-T8192-H16-K256-V256")
p.add_argument("--out")
args = p.parse_args()
B, T, H, K, V = (int(x[1:]) for x in args.shape.split("-"))
dev, dt = "cuda", torch.bfloat16
q, k = (torch.randn(B, T, H, K, device=dev, dtype=dt, requires_grad=True) for _ in range(2))
v = torch.randn(B, T, H, V, device=dev, dtype=dt, requires_grad=True)
i = torch.randn(B, T, H, device=dev, requires_grad=True)
f = (torch.randn(B, T, H, device=dev) + 3).requires_grad_()
do = torch.randn(B, T, H, V, device=dev, dtype=dt)


def step():
    o, _ = linrnn.mlstm(q, k, v, i, f, input_gate="exp", chunk_size=128)
    o.backward(do)


rows = []
for tile in [(64, 64, 256, 4, 2), (64, 64, 128, 4, 2), (64, 32, 256, 4, 2), (64, 64, 128, 8, 2),
             (64, 32, 128, 4, 2)]:  # fmt: skip
    tc.TILES["states_bwd"] = tile
    ms = triton.testing.do_bench(step, warmup=25, rep=200)
    rows.append({"tile": tile, "fwd_bwd_ms": ms})
    print(tile, f"{ms:.3f} ms")
meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
if args.out:
    json.dump({"shape": args.shape, "machine": meta, "rows": rows}, open(args.out, "w"), indent=1)
