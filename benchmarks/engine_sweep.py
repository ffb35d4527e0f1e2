"""Tuning sweep for the Triton chunk engine on the GPU machine: a quick correctness pass against
the float64 torch engine, then forward and forward+backward times over chunk sizes and tile
configurations. The full side-by-side comparison with the peers is benchmarks/gpu_engine.py;
this script is for choosing the engine's defaults.

    python benchmarks/engine_sweep.py --chunks 64 128 --tiles 64,64,64,4,2 64,64,128,8,2
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import linrnn
from linrnn.engine import triton_chunk

VARIANTS = {
    "linear_attn": lambda q, k, v, x, **kw: linrnn.linear_attn(q, k, v, **kw),
    "linear_attn_norm": lambda q, k, v, x, **kw: linrnn.linear_attn(q, k, v, normalize=True, **kw),
    "simple_gla": lambda q, k, v, x, **kw: linrnn.simple_gla(q, k, v, x["g"], **kw),
    "retention": lambda q, k, v, x, **kw: linrnn.retention(q, k, v, x["lg"], **kw),
    "mlstm_sig": lambda q, k, v, x, **kw: linrnn.mlstm(
        q, k, v, x["i"], x["f"], input_gate="sigmoid", **kw
    ),
    "mlstm_sig_norm": lambda q, k, v, x, **kw: linrnn.mlstm(
        q, k, v, x["i"], x["f"], input_gate="sigmoid", normalize=True, **kw
    ),
    "mlstm_exp": lambda q, k, v, x, **kw: linrnn.mlstm(q, k, v, x["i"], x["f"], **kw),
}


def inputs(B, T, H, K, V, dtype, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    q, k, v = r(B, T, H, K).to(dtype), r(B, T, H, K).to(dtype), r(B, T, H, V).to(dtype)
    gates = dict(
        g=F.logsigmoid(r(B, T, H) + 3), lg=F.logsigmoid(r(H) + 3), i=r(B, T, H), f=r(B, T, H) + 3
    )
    return q, k, v, gates


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def correctness(names, dtypes, shape, chunk):
    rows = []
    for name in names:
        fn = VARIANTS[name]
        for dtype in dtypes:
            q, k, v, x = inputs(*shape, dtype, "cuda")
            leaves = [q, k, v, x["g"], x["lg"], x["i"], x["f"]]
            res = {}
            for be, dt in (("triton", dtype), ("torch", torch.float64)):
                ls = [t.detach().to(dt if t.dtype == dtype else torch.float32).requires_grad_()
                      for t in leaves]  # fmt: skip
                if be == "torch":
                    ls = [t.detach().double().requires_grad_() for t in leaves]
                xx = dict(g=ls[3], lg=ls[4], i=ls[5], f=ls[6])
                o, S = fn(*ls[:3], xx, backend=be, chunk_size=chunk if be == "triton" else 64,
                          output_final_state=True)  # fmt: skip
                Ss = S if isinstance(S, tuple) else (S,)
                gen = torch.Generator(device="cuda").manual_seed(1)
                do = torch.randn(o.shape, generator=gen, device="cuda")
                loss = (o.double() * do.double()).sum() + sum(
                    (s.double() * s.double().detach().flip(-1)).sum() for s in Ss[:2]
                )
                grads = torch.autograd.grad(loss, ls, allow_unused=True)
                res[be] = (o, Ss, grads)
            (o1, S1, g1), (o2, S2, g2) = res["triton"], res["torch"]
            errs = {"o": rel(o1, o2)}
            errs.update({f"S{i}": rel(a, b) for i, (a, b) in enumerate(zip(S1[:2], S2[:2]))})
            for n, a, b in zip(["q", "k", "v", "g", "lg", "i", "f"], g1, g2):
                if b is not None and a is not None:
                    errs["d" + n] = rel(a, b)
                elif (a is None) != (b is None):
                    errs["d" + n] = float("nan")
            worst = max(errs.values())
            rows.append(dict(op=name, dtype=str(dtype), worst=worst, errs=errs))
            print(f"{name:16s} {dtype!s:15s} worst {worst:.2e}  "
                  + " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)  # fmt: skip
    return rows


def timing(names, shape, chunks, tiles_list, modes=("fwd", "fwdbwd")):
    from triton.testing import do_bench

    rows = []
    q, k, v, x = inputs(*shape, torch.bfloat16, "cuda")
    for tiles in tiles_list:
        for kernel in triton_chunk.TILES:
            if kernel != "fused" and tiles:
                triton_chunk.TILES[kernel] = tiles
        for name in names:
            fn = VARIANTS[name]
            for L in chunks:
                row = dict(op=name, L=L, tiles=tiles)
                try:
                    t0 = time.perf_counter()
                    fn(q, k, v, x, backend="triton", chunk_size=L)
                    torch.cuda.synchronize()
                    row["first_s"] = time.perf_counter() - t0
                    row["fwd_ms"] = do_bench(
                        lambda: fn(q, k, v, x, backend="triton", chunk_size=L)  # noqa: B023
                    )
                    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                    xx = {n: t.detach().requires_grad_() for n, t in x.items()}
                    o, _ = fn(qq, kk, vv, xx, backend="triton", chunk_size=L)
                    do = torch.randn_like(o)

                    def step():
                        o, _ = fn(qq, kk, vv, xx, backend="triton", chunk_size=L)  # noqa: B023
                        o.backward(do)  # noqa: B023

                    step()
                    row["fwdbwd_ms"] = do_bench(step, grad_to_none=[qq, kk, vv, *xx.values()])
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    step()
                    row["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                except Exception as e:  # record and go on: one bad config must not stop a sweep
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def profile(names, shape, chunks, tiles_list):
    """Per-kernel CUDA time of one forward+backward (torch.profiler), to see where time goes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    q, k, v, x = inputs(*shape, torch.bfloat16, "cuda")
    for tiles in tiles_list:
        for kernel in triton_chunk.TILES:
            if kernel != "fused" and tiles:
                triton_chunk.TILES[kernel] = tiles
        for name in names:
            for L in chunks:
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                xx = {n: t.detach().requires_grad_() for n, t in x.items()}
                fn = VARIANTS[name]
                for _ in range(2):
                    o, _ = fn(qq, kk, vv, xx, backend="triton", chunk_size=L)
                    o.backward(torch.ones_like(o))
                torch.cuda.synchronize()
                with prof(activities=[ProfilerActivity.CUDA]) as pr:
                    for _ in range(3):
                        o, _ = fn(qq, kk, vv, xx, backend="triton", chunk_size=L)
                        o.backward(torch.ones_like(o))
                    torch.cuda.synchronize()
                print(f"== {name} L={L} tiles={tiles}")
                for ev in sorted(pr.key_averages(), key=lambda e: -e.device_time_total)[:12]:
                    ms = ev.device_time_total / 3e3
                    print(f"  {ms:8.3f} ms  {ev.count // 3:3d}x  {ev.key[:60]}")


def tune(name, shape, L, rounds=1, wide=False):
    """Coordinate descent over each kernel's tiles (others fixed), timing the whole forward
    (forward kernels) or forward+backward (backward kernels) of one op."""
    import itertools

    from triton.testing import do_bench

    q, k, v, x = inputs(*shape, torch.bfloat16, "cuda")
    fn = VARIANTS[name]
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    xx = {n: t.detach().requires_grad_() for n, t in x.items()}
    do = torch.randn_like(v)

    def fwd():
        with torch.no_grad():
            fn(q, k, v, x, backend="triton", chunk_size=L)

    def fwdbwd():
        o, _ = fn(qq, kk, vv, xx, backend="triton", chunk_size=L)
        o.backward(do)

    space = list(itertools.product(
        (64,) if wide else (64, 128),
        ((64, 128), (32, 256), (64, 256), (128, 128)) if wide
        else ((64, 64), (64, 128), (128, 64), (128, 128)),
        (4, 8), (2, 3),
    ))  # fmt: skip
    for _ in range(rounds):
        for kernel in ("states_fwd", "rows_fwd", "states_bwd", "rows_dq", "cols_dk", "cols_dv"):
            step = fwd if kernel in ("states_fwd", "rows_fwd") else fwdbwd
            best = None
            for t, (d, o), nw, ns in space:
                triton_chunk.TILES[kernel] = (t, d, o, nw, ns)
                try:
                    step()
                    ms = do_bench(step, warmup=10, rep=60, grad_to_none=[qq, kk, vv])
                except Exception as e:  # out of resources etc.: skip the config
                    print(f"  {kernel} {(t, d, o, nw, ns)} failed: {type(e).__name__}")
                    continue
                if best is None or ms < best[0]:
                    best = (ms, (t, d, o, nw, ns))
            triton_chunk.TILES[kernel] = best[1]
            print(f"{name} L={L} {kernel}: best {best[1]} -> {best[0]:.3f} ms", flush=True)
    print("TILES =", json.dumps(triton_chunk.TILES), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ops", nargs="*", default=list(VARIANTS))
    p.add_argument("--chunks", nargs="*", type=int, default=[64, 128])
    p.add_argument("--tiles", nargs="*", default=[""], help="t,d,o,warps,stages for all kernels")
    p.add_argument("--shape", default="8,8192,16,256,256")
    p.add_argument("--skip-correctness", action="store_true")
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--tune", default=None, help="op to tune the tiles on (coordinate descent)")
    p.add_argument("--wide", action="store_true", help="tune over wide output tiles (256)")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    out = {}
    if not a.skip_correctness:
        out["correctness"] = correctness(
            a.ops, [torch.bfloat16, torch.float32], (2, 300, 3, 96, 80), 64
        ) + correctness(a.ops, [torch.bfloat16], (1, 1000, 2, 256, 256), 128)
    if a.tune:
        shape = tuple(int(x) for x in a.shape.split(","))
        tune(a.tune, shape, a.chunks[0], wide=a.wide)
    if a.profile:
        tiles = [tuple(int(x) for x in t.split(",")) if t else None for t in a.tiles]
        profile(a.ops, tuple(int(x) for x in a.shape.split(",")), a.chunks, tiles)
    if not a.skip_timing:
        tiles = [tuple(int(x) for x in t.split(",")) if t else None for t in a.tiles]
        shape = tuple(int(x) for x in a.shape.split(","))
        out["timing"] = timing(a.ops, shape, a.chunks, tiles)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
