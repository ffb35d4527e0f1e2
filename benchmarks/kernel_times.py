"""Where a call's GPU time goes, kernel by kernel: one op's forward+backward (the inputs of
``linrnn bench``, :func:`linrnn.bench.registry.build_linrnn`) under ``torch.profiler``, each
kernel's device time summed over its launches and averaged over the iterations.

    python3 benchmarks/kernel_times.py --ops linear_attn gla --shapes B8-T8192-H16-K256-V256 \\
        --out now.json
    python3 benchmarks/kernel_times.py ... --out before.json      # from another checkout
    python3 benchmarks/kernel_times.py --compare now.json before.json

The op and the kernels come from whichever ``linrnn`` is imported (the checkout on
``PYTHONPATH``), so running this file from one checkout with another one's ``linrnn`` gives
that tree's times. A peer's name (``--ops mamba_ssm:mamba_chunk_scan_combined``, as ``linrnn
bench --ops`` takes it) gives that peer's kernels on the same inputs. ``--compare`` puts two
such JSON files side by side, kernel by kernel (the kernels of either, matched by name), with
each op's total. Kernel times from a profiler hold
per launch; the sum can exceed the op's wall time where launches overlap (rarely, on one
stream) and leaves out host gaps between launches (``linrnn bench`` times the call).
Without a GPU it runs on the CPU backend's operators (a check of the command, not a timing).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch


def bench_case(op: str, shape: dict, dtype: str, device: str, mode: str = "chunk") -> dict:
    """The case ``linrnn bench`` runs for ``op`` at ``shape`` in ``mode`` (chunk or
    fused_chunk) at its default chunk size, Triton on CUDA and the PyTorch path elsewhere."""
    from linrnn.bench import registry

    o = registry.resolve_op(op)
    backend = "triton" if device == "cuda" else "torch"
    chunk = registry.default_chunk(backend, mode, shape["K"], shape["V"], o)
    return dict(op=o.name, mode=mode, backend=backend, chunk=chunk, dtype=dtype, seed=0,
                device=device)  # fmt: skip


def build(op: str, shape: dict, dtype: str, device: str, mode: str = "chunk"):
    """``(leaves, fwd)`` of ``op`` as ``linrnn bench`` builds it: a linrnn op by
    :func:`bench_case`, a peer (``mamba_ssm:mamba_chunk_scan_combined``, ``fla:chunk_gla``) by
    its builder in :mod:`linrnn.bench.peers`, on the same inputs."""
    from linrnn.bench import peers, registry

    if peers.library_of(op) == "linrnn":
        return registry.build_linrnn(bench_case(op, shape, dtype, device, mode), shape)
    case = dict(op=op, dtype=dtype, seed=0, device=device)
    return peers.BUILDERS[peers.library_of(op)](case, shape)


def kernel_times(
    op: str, shape_id: str, dtype: str = "bf16", iters: int = 5, mode: str = "chunk"
) -> dict:
    """``{"op", "shape", "mode", "iters", "kernels": {name: (ms per iteration, launches per
    iteration)}, "total_ms"}`` for one forward+backward of ``op`` (a linrnn op in ``mode``, or
    a peer) at ``shape_id``."""
    from linrnn.bench import registry

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = registry.parse_shape(shape_id)
    leaves, fwd = build(op, shape, dtype, device, mode)

    def once():
        for x in leaves:
            x.grad = None
        o = fwd()
        o.backward(torch.ones_like(o))

    kernels, total = profile(once, iters, device)
    return dict(op=op, shape=shape_id, mode=mode, dtype=dtype, iters=iters, device=device,
                kernels=kernels, total_ms=total)  # fmt: skip


def profile(once, iters: int, device: str, warmup: int = 2) -> tuple[dict, float]:
    """``({name: (ms per call, launches per call)}, total ms per call)`` of ``once()`` under
    ``torch.profiler`` after ``warmup`` calls (compilation, autotuning, the allocator): on CUDA
    each kernel's device time, elsewhere each top-level CPU operator's (a check of the command,
    not a timing), largest first."""
    for _ in range(warmup):
        once()
    activity = torch.profiler.ProfilerActivity
    acts = [activity.CUDA] if device == "cuda" else [activity.CPU]
    if device == "cuda":
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iters):
            once()
        if device == "cuda":
            torch.cuda.synchronize()
    time_us, launches = collections.Counter(), collections.Counter()
    for e in prof.events():
        if device == "cuda" and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if device != "cuda" and (e.device_type != torch.autograd.DeviceType.CPU or e.cpu_parent):
            continue  # top-level CPU operators only: their time includes their children's
        us = e.time_range.elapsed_us()  # a kernel's span on the GPU, an operator's on the host
        time_us[e.name] += us
        launches[e.name] += 1
    kernels = {
        n: (round(t / iters / 1e3, 4), launches[n] / iters) for n, t in time_us.most_common()
    }
    return kernels, round(sum(t for t, _ in kernels.values()), 4)


def short_name(name: str, width: int = 58) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def print_rows(rows: list) -> None:
    for r in rows:
        print(f"\n{r['op']} {r.get('mode', 'chunk')} {r['shape']} {r['dtype']} ({r['device']}): "
              f"{r['total_ms']:.3f} ms in kernels per forward+backward")  # fmt: skip
        for name, (ms, n) in r["kernels"].items():
            print(f"  {short_name(name):<58} {ms:9.3f} ms  ×{n:g}")


def compare(this: list, other: list) -> None:
    """Each (op, shape) of ``this`` beside ``other``'s, kernel by kernel, largest change
    first."""
    key = lambda r: (r["op"], r.get("mode", "chunk"), r["shape"], r["dtype"])  # noqa: E731
    base = {key(r): r for r in other}
    for r in this:
        b = base.get(key(r))
        if b is None:
            print(f"\n{r['op']} {r['shape']}: not in the other file")
            continue
        print(f"\n{r['op']} {r['shape']} {r['dtype']}: {r['total_ms']:.3f} ms against "
              f"{b['total_ms']:.3f} ({r['total_ms'] / b['total_ms']:.3f}×)")  # fmt: skip
        names = set(r["kernels"]) | set(b["kernels"])
        ms = {n: (r["kernels"].get(n, (0.0, 0))[0], b["kernels"].get(n, (0.0, 0))[0])
              for n in names}  # fmt: skip
        print(f"  {'kernel':<58} {'this ms':>9} {'other ms':>9} {'change':>8}")
        for n in sorted(names, key=lambda n: -abs(ms[n][0] - ms[n][1])):
            a, o = ms[n]
            print(f"  {short_name(n):<58} {a:9.3f} {o:9.3f} {a - o:+8.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", nargs="+", default=["linear_attn"])
    ap.add_argument("--shapes", nargs="+", default=["B8-T8192-H16-K256-V256"])
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--modes", nargs="+", default=["chunk"], choices=("chunk", "fused_chunk"),
                    help="the linrnn ops' modes (peers run once, as they are)")  # fmt: skip
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    ap.add_argument("--compare", nargs=2, metavar=("THIS", "OTHER"), default=None,
                    help="print two JSON files of this script side by side, and stop")  # fmt: skip
    a = ap.parse_args(argv)
    if a.compare:
        this, other = (json.load(open(p))["rows"] for p in a.compare)
        compare(this, other)
        return 0
    from linrnn.bench import peers

    rows = []
    for op in a.ops:
        modes = a.modes if peers.library_of(op) == "linrnn" else ["chunk"]
        for shape, mode in ((s, m) for s in a.shapes for m in modes):
            try:
                rows.append(kernel_times(op, shape, a.dtype, a.iters, mode))
            except Exception as e:  # one failing op does not lose the others' rows
                print(f"{op} {mode} {shape}: {type(e).__name__}: {e}", file=sys.stderr)
    print_rows(rows)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
