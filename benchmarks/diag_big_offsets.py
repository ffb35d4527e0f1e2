"""Diagnosis of a gpu_big_offsets.py failure: the chunk engine's forward intermediates (chunk
states, normalizer states, max states, denominators, row maxima, output) of batch element 1 of
a B=2 call against the same element alone, to find the first one that differs.

    python3 benchmarks/diag_big_offsets.py --tokens 1048576        # element 1 beyond 2^31
    python3 benchmarks/diag_big_offsets.py --tokens 96 --heads 2 --dim 16   # CPU smoke test
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from linrnn.engine import triton_chunk as tc


def forward(q, k, v, f, i, L):
    c = tc.Config(q, k, v, scale=q.shape[-1] ** -0.5, has_decay=True, has_igate=True,
                  stabilize=True, track_n=True, normalizer="mlstm", eps=1e-6,
                  chunk_size=L)  # fmt: skip
    b = tc._chunk_cumsum(F.logsigmoid(f), L, c)
    a = tc._rows(i)
    o, S_T, n_T, m_T, (states, ns, mc, den, m_row) = tc._forward(q, k, v, b, a, None, None, None, c)
    H = q.shape[2]
    B = q.shape[0]
    last = lambda x: x.reshape(B, H, *x.shape[1:])[-1]  # noqa: E731
    return dict(
        b=last(b), a=last(a), states=last(states), ns=last(ns), mc=last(mc), den=last(den),
        m_row=last(m_row), o=o[-1], S_T=S_T[-1], n_T=n_T[-1], m_T=m_T[-1],
    )  # fmt: skip


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2**20)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--chunk", type=int, default=128)
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    T, H, D = args.tokens, args.heads, args.dim
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    print(f"T={T} H={H} D={D}: element 1 starts at {T * H * D:,} (2^31 = {2**31:,})")
    torch.manual_seed(0)
    x = [torch.randn(2, T, H, D, device=dev, dtype=dt) * 0.5 for _ in range(3)]
    i = torch.randn(2, T, H, device=dev)
    f = torch.randn(2, T, H, device=dev) + 3
    with torch.no_grad():
        one = forward(*(t[1:].clone() for t in x), f[1:].clone(), i[1:].clone(), args.chunk)
        one = {n: t.cpu() for n, t in one.items()}
        both = forward(*x, f, i, args.chunk)
    for name in one:
        a, b = both[name].cpu().float(), one[name].float()
        d = (a - b).abs()
        d = torch.where(torch.isnan(a) != torch.isnan(b), torch.inf, d.nan_to_num(0.0))
        bad = (d > 1e-6 * (1 + b.abs().nan_to_num(0))).nonzero()
        print(f"{name:7s} shape {tuple(a.shape)} max|diff| {float(d.max()):.3e} "
              f"differing {bad.shape[0]}", end="")  # fmt: skip
        if bad.shape[0]:
            print(f" first {bad[0].tolist()} last {bad[-1].tolist()}", end="")
            for dim in range(bad.shape[1]):
                u = bad[:, dim].unique()
                lo, hi = int(u.min()), int(u.max())
                print(f" | dim{dim}: {u.numel()} values in [{lo}, {hi}]", end="")
        print()


if __name__ == "__main__":
    main()
