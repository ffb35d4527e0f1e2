"""Context-parallel benchmark (linrnn.distributed): one sequence split in time across GPUs.

Launch once per GPU count with torchrun (NCCL on CUDA, gloo on CPU)::

    torchrun --nproc_per_node 1 benchmarks/context_parallel.py --out cp-1gpu.json
    torchrun --nproc_per_node 2 benchmarks/context_parallel.py --out cp-2gpu.json
    torchrun --nproc_per_node 4 benchmarks/context_parallel.py --out cp-4gpu.json
    torchrun --nproc_per_node 2 benchmarks/context_parallel.py --device cpu --quick  # smoke

Each run does two things:

1. Equality check (``--check-T`` tokens, bf16 by default): every rank compares its output
   slice, the final state and the gradients of its slice of q, k, v and the gates against
   one device computing the whole sequence (each rank recomputes that reference itself),
   RMS-relative error ``‖a−b‖/‖b‖`` ≤ ``--tol`` (2e-2 for bf16, the test suite's bf16 rule).
2. Throughput: forward + backward of ``((o·do).sum())`` for one sequence (B = 1) of each of
   ``--lengths`` tokens (default 256K and 1M), H = 16, K = V = 256, split evenly over the
   ranks; the median over ``--repeats`` timed iterations after one warm-up, synchronized with
   a barrier (and ``cuda.synchronize``) around each. Reports tokens/s for the whole sequence
   and the peak GPU memory per rank. An out-of-memory error is recorded, not fatal.

Rank 0 prints a summary and writes JSON tagged with the GPU name, software versions and the
git commit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import linrnn
from linrnn.distributed import context_parallel

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FAMILIES = ("linear_attn", "retention", "simple_gla", "gla", "rwkv6", "mlstm")
TIME_SPLIT = {"q", "r", "k", "v", "g", "gk", "w", "i", "f"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--family", choices=FAMILIES, default="simple_gla", help="throughput family")
    p.add_argument("--check-families", nargs="+", choices=FAMILIES, default=list(FAMILIES),
                   help="families of the equality check (all six)")  # fmt: skip
    p.add_argument("--commit", help="git commit to record (the GPU copy's .git may be stale)")
    p.add_argument("--lengths", type=int, nargs="+", default=[256 * 1024, 1024 * 1024])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=256, help="K = V")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--check-T", type=int, default=8192, help="tokens of the equality check")
    p.add_argument("--tol", type=float, default=2e-2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=None)
    p.add_argument("--backend", choices=("torch", "triton"), default=None)
    p.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (rank 0 writes it)")
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.heads, args.dim, args.check_T, args.repeats = [512], 2, 16, 64, 1
    return args


def make_inputs(family, T, H, D, dtype, device, seed=0):
    """B = 1 inputs of one family (GLA-style mild decays ``logsigmoid(randn) / 16``)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    q, k, v = rnd(1, T, H, D), rnd(1, T, H, D), rnd(1, T, H, D)
    d = {"q": q, "k": k, "v": v}
    if family == "linear_attn":
        d["q"], d["k"] = F.elu(q) + 1, F.elu(k) + 1
    elif family == "retention":
        d["log_decay"] = torch.log(1 - 2.0 ** (-5.0 - torch.arange(H, device=device)))
    elif family == "simple_gla":
        d["g"] = F.logsigmoid(rnd(1, T, H)) / 16
    elif family in ("gla", "rwkv6"):
        d["gk" if family == "gla" else "w"] = F.logsigmoid(rnd(1, T, H, D)) / 16
        if family == "rwkv6":
            d = {"r": d.pop("q"), **d, "u": rnd(H, D)}
    else:
        d["i"], d["f"] = rnd(1, T, H), rnd(1, T, H) + 3
    cast = lambda n, x: x.to(dtype) if n in ("q", "r", "k", "v") else x.float()  # noqa: E731
    return {n: cast(n, x) for n, x in d.items()}


def call(fn_or_cp, family, inputs, **kw):
    names = list(inputs)
    fn = getattr(linrnn, family)
    return fn_or_cp(fn, *[inputs[n] for n in names], **kw)


def local_slice(inputs, rank, world):
    T = inputs["v"].shape[1]
    lo, hi = rank * T // world, (rank + 1) * T // world
    return {n: (x[:, lo:hi] if n in TIME_SPLIT else x) for n, x in inputs.items()}


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def flat(state):
    return [] if state is None else (list(state) if isinstance(state, tuple) else [state])


def family_opts(family, opts):
    return dict(opts, normalize=True) if family == "linear_attn" else opts


def check(args, family, rank, world, device, opts):
    """Per-rank errors of output, final state and gradients vs one device; max over ranks."""
    dtype = DTYPES[args.dtype]
    opts = family_opts(family, opts)
    full = make_inputs(family, args.check_T, args.heads, args.dim, dtype, device, seed=1)
    T = args.check_T
    lo, hi = rank * T // world, (rank + 1) * T // world
    gen = torch.Generator(device="cpu").manual_seed(2)

    def run(op, inputs):
        leaves = {n: x.detach().clone().requires_grad_() for n, x in inputs.items()}
        o, st = call(op, family, leaves, output_final_state=True, **opts)
        return leaves, o, flat(st)

    ref_in, o_ref, st_ref = run(lambda fn, *a, **k: fn(*a, **k), full)
    do = torch.randn(o_ref.shape, generator=gen).to(device, o_ref.dtype)
    dst = [torch.randn(s.shape, generator=gen).to(device, s.dtype) for s in st_ref]
    loss = (o_ref.float() * do.float()).sum() + sum((s * d).sum() for s, d in zip(st_ref, dst))
    loss.backward()
    cp_in, o, st = run(context_parallel, local_slice(full, rank, world))
    loss = (o.float() * do[:, lo:hi].float()).sum()
    loss = loss + sum((s * d).sum() for s, d in zip(st, dst)) / world
    loss.backward()
    errs = {"o": rel_err(o, o_ref[:, lo:hi])}
    for j, (a, b) in enumerate(zip(st, st_ref)):
        errs[f"final_state[{j}]"] = rel_err(a, b)
    for n, x in cp_in.items():
        if n in TIME_SPLIT:
            errs[f"d{n}"] = rel_err(x.grad, ref_in[n].grad[:, lo:hi])
        else:  # replicated: the ranks' shares sum to the gradient
            g = x.grad.clone()
            dist.all_reduce(g)
            errs[f"d{n}"] = rel_err(g, ref_in[n].grad)
    vals = torch.tensor(list(errs.values()), dtype=torch.float64, device=device)
    dist.all_reduce(vals, op=dist.ReduceOp.MAX)
    return dict(zip(errs, vals.tolist()))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()


def throughput(args, rank, world, device, opts, T):
    dtype = DTYPES[args.dtype]
    local = make_inputs(args.family, T // world, args.heads, args.dim, dtype, device, seed=rank)
    leaves = {n: x.requires_grad_() for n, x in local.items()}
    do = torch.randn_like(leaves["v"])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, churn0 = [], None
    try:
        for it in range(args.repeats + 1):
            for x in leaves.values():
                x.grad = None
            sync(device)
            if it == 1:
                churn0 = _alloc_counts(device)
            t0 = time.perf_counter()
            o, _ = call(context_parallel, args.family, leaves, **opts)
            (o * do).sum().backward()
            sync(device)
            if it:  # the first iteration is the warm-up
                times.append(time.perf_counter() - t0)
    except torch.OutOfMemoryError as e:
        return {"T": T, "oom": True, "error": str(e).splitlines()[0]}
    med = statistics.median(times)
    out = {"T": T, "T_per_rank": T // world, "median_s": med, "min_s": min(times)}
    out["tokens_per_s"] = T / med
    if device.type == "cuda":
        out["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        # The allocator's device-level work during the timed iterations (session 7: the time
        # per token grew with the tokens per GPU; cudaMalloc/free churn near the memory limit
        # would explain that): counts per timed iteration.
        after = _alloc_counts(device)
        out["alloc_per_iter"] = {k: (after[k] - churn0[k]) / args.repeats for k in after}
    return out


def _alloc_counts(device) -> dict:
    """The caching allocator's cudaMalloc / cudaFree calls and out-of-memory retries so far."""
    if device.type != "cuda":
        return {}
    st = torch.cuda.memory_stats(device)
    keys = ("num_device_alloc", "num_device_free", "num_alloc_retries")
    return {k: st.get(k, 0) for k in keys}


def versions(device, commit=None) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version()}
    info["linrnn"] = linrnn.__version__
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["git_commit"] = None
    if commit:
        info["git_commit"] = commit
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        info["cpu"] = platform.processor() or platform.machine()
    return info


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    opts = {"mode": "chunk", "backend": args.backend, "chunk_size": args.chunk_size}
    try:
        errs = {f: check(args, f, rank, world, device, opts) for f in args.check_families}
        ok = all(e <= args.tol for fam in errs.values() for e in fam.values())
        if rank == 0:
            for f, fam in errs.items():
                worst = max(fam, key=fam.get)
                print(f"check {f}: worst {worst} {fam[worst]:.2e} (tol {args.tol})", flush=True)
        fopts = family_opts(args.family, opts)
        results = [throughput(args, rank, world, device, fopts, T) for T in args.lengths]
        if rank == 0:
            report = {
                "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "world_size": world,
                "versions": versions(device, args.commit),
                "config": {
                    k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                },
                "check": {"max_rel_err_over_ranks": errs, "tol": args.tol, "ok": ok},
                "throughput": results,
            }
            text = json.dumps(report, indent=2)
            print(text)
            if args.out is not None:
                args.out.write_text(text + "\n")
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
