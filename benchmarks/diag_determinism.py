"""Is the chunk engine's forward deterministic? The same inputs twice through the forward
kernels, bitwise comparison of every output (o, den, m_row, states), per family and per
rows_fwd launch setting; then one run against the fp32 torch engine.

gpu_big_offsets.py found batch element 1 of a B=2 mLSTM-exp call differing from the element
alone in den (and so in o) only, at rows 64..127 of 128-step chunks: a race or a compiler issue
in rows_kernel's normalizer sum would look like that.

    python3 benchmarks/diag_determinism.py                          # GPU
    python3 benchmarks/diag_determinism.py --tokens 256 --dim 32    # CPU smoke test
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from linrnn.engine import triton_chunk as tc

FAMILIES = {  # has_decay, has_igate, stabilize, track_n, normalizer
    "mlstm_exp": (True, True, True, True, "mlstm"),
    "mlstm_sig_norm": (True, True, False, True, "mlstm"),
    "linear_attn_norm": (False, False, False, True, "sum"),
    "simple_gla": (True, False, False, False, None),
}


def forward(fam, q, k, v, f, i, L):
    d, ig, stab, tn, norm = FAMILIES[fam]
    c = tc.Config(q, k, v, scale=q.shape[-1] ** -0.5, has_decay=d, has_igate=ig, stabilize=stab,
                  track_n=tn, normalizer=norm, eps=1e-6, chunk_size=L)  # fmt: skip
    dummy = torch.empty(1, device=q.device)
    b = tc._chunk_cumsum(F.logsigmoid(f), L, c) if d else dummy
    a = tc._rows(i if stab else F.logsigmoid(i)) if ig else dummy
    o, _, _, _, saved = tc._forward(q, k, v, b, a, None, None, None, c)
    states, den, m_row = saved[0], saved[3], saved[4]
    return dict(o=o, den=den, m_row=m_row, states=states)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, nargs="+", default=[128, 256])
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--stages", type=int, nargs="+", default=[3, 2, 1])
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    base = tc.TILES["rows_fwd"]
    for D in args.dim:
        T = args.tokens if D <= 128 else args.tokens // 2
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, T, args.heads, D, device=dev, dtype=dt) * 0.5 for _ in range(3))
        i = torch.randn(1, T, args.heads, device=dev)
        f = torch.randn(1, T, args.heads, device=dev) + 3
        for fam in FAMILIES:
            for ns in args.stages:
                tc.TILES["rows_fwd"] = (*base[:4], ns)
                runs = [forward(fam, q, k, v, f, i, args.chunk) for _ in range(args.repeats)]
                line = []
                for name, x0 in runs[0].items():
                    if x0.numel() <= 1:
                        continue
                    bad = max(int((r[name] != x0).sum()) for r in runs[1:])
                    line.append(f"{name} {bad}")
                print(f"D={D} T={T} {fam:17s} rows_fwd stages={ns}: differing elements "
                      + ", ".join(line), flush=True)  # fmt: skip
            tc.TILES["rows_fwd"] = base
            check_public(fam, q, k, v, f, i, args.chunk, min(T, 8192))


def call(fam, xs, fi, ff, backend, L, mode="chunk"):
    import linrnn

    if fam.startswith("mlstm"):
        gate = "exp" if fam == "mlstm_exp" else "sigmoid"
        return linrnn.mlstm(*xs, fi, ff, input_gate=gate, normalize=True, backend=backend,
                            mode=mode, chunk_size=L)[0]  # fmt: skip
    if fam == "linear_attn_norm":  # positive features, as the sum normalizer assumes
        xs = [F.elu(xs[0]) + 1, F.elu(xs[1]) + 1, xs[2]]
        return linrnn.linear_attn(*xs, normalize=True, backend=backend, mode=mode, chunk_size=L)[0]
    return linrnn.simple_gla(*xs, F.logsigmoid(ff), backend=backend, mode=mode, chunk_size=L)[0]


def check_public(fam, q, k, v, f, i, L, n):
    """Forward and backward through the public op, twice (bitwise) and against fp32 torch."""
    gen = torch.Generator(device=q.device).manual_seed(1)
    do = torch.randn(q.shape[0], n, q.shape[2], v.shape[3], generator=gen, device=q.device)
    res = {}
    for mode, backend, cast in (("chunk", "triton", None), ("chunk", "triton", None),
                                ("fused_chunk", "triton", None),
                                ("chunk", "torch", torch.float32)):  # fmt: skip
        leaves = [t[:, :n].detach().to(cast or t.dtype).requires_grad_() for t in (q, k, v)]
        gates = [t[:, :n].detach().clone().requires_grad_() for t in (i, f)]
        o = call(fam, leaves, *gates, backend, L, mode)
        grads = torch.autograd.grad(o, leaves + gates, do.to(o.dtype), allow_unused=True)
        out = [o.float()] + [g.float() if g is not None else None for g in grads]
        key = (mode, backend)
        if key in res:
            same = [int((a != b).sum()) if a is not None else 0 for a, b in zip(res[key], out)]
            print(f"   {fam} T={n}: {mode} differing elements between two runs (o, dq, dk, dv, "
                  f"di, df): {same}")  # fmt: skip
        else:
            res[key] = out
    ref = res[("chunk", "torch")]
    for key in (("chunk", "triton"), ("fused_chunk", "triton")):
        errs = [float((a - b).norm() / b.norm()) if a is not None and b is not None else 0.0
                for a, b in zip(res[key], ref)]  # fmt: skip
        print(f"   {fam} T={n} {key[0]}: rel. error vs fp32 torch (o, dq, dk, dv, di, df): "
              + " ".join(f"{e:.1e}" for e in errs), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
