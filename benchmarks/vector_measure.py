"""How one vector-gate configuration is run and timed, for benchmarks/vector_sweep.py: the
inputs and calls of each op, errors and timing, every kernel launch and host-side engine step
timed with CUDA events (by launch role, with the tiles it got), and the per-kernel profile of
one forward+backward (``--profile``). The sweep script chooses the configurations and reports;
this module only measures."""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from vector_tiles import (  # benchmarks/ is on sys.path (vector_sweep puts it there)
    DTYPES,
    HAS_DIAG_LOOP,
    current,
    scores_apply,
    using,
)

import linrnn
from linrnn.bench.registry import parse_shape
from linrnn.engine import triton_chunk_vec as tcv
from linrnn.engine import triton_fused, triton_kernels

try:  # SCORES' kernels (absent in an older checkout)
    from linrnn.engine import triton_scores
except ImportError:
    triton_scores = None
try:  # the one-pass log-decay gradient (absent in an older checkout)
    from linrnn.engine import triton_gate_grad
except ImportError:
    triton_gate_grad = None

# fast_scores_kernel: since session 9
_SCORE_KERNELS = tuple(
    n
    for n in ("scores_kernel", "apply_kernel", "fast_scores_kernel")
    if triton_scores is not None and hasattr(triton_scores, n)
)
# Kernels whose launches are timed / recorded, by module; rows and cols run twice per call.
KERNEL_MODULES = (
    (triton_kernels, ("states_fwd_kernel", "rows_kernel", "states_bwd_kernel", "cols_kernel")),
    (triton_fused, ("fused_fwd_kernel", "fused_dq_kernel", "fused_dk_kernel", "fused_dv_kernel")),
    *([(triton_scores, _SCORE_KERNELS)] if triton_scores else []),
    *([(triton_gate_grad, ("decay_grad_kernel",))] if triton_gate_grad else []),
)
# Host-side steps of the engine (triton_chunk_vec), timed as phases of a forward+backward.
PHASES = (
    "_cumsums",
    "_forward",
    "_forward_fused",
    "_backward",
    "_backward_fused",
    "_revsum",
    "_bonus",
    "_decay_grad",
)
TILE_KEYS = ("BQ", "BS", "BC", "BT", "BD", "BO", "BK", "BV", "num_warps", "num_stages")


class CudaBroken(RuntimeError):
    """The CUDA context is unusable (e.g. an illegal memory access): nothing more can run."""


# ---------------------------------------------------------------------------------------------
# Inputs, calls, errors, timing
# ---------------------------------------------------------------------------------------------


def make_inputs(op: str, shape: dict, dtype, device, seed: int) -> dict:
    """Leaves (all with gradients): q, k, v in ``dtype``; per-channel log decays
    logsigmoid(randn + 3) (≈ −0.05 per step) and RWKV6's u = 0.1·randn in fp32."""
    B, T, H, K, V = (shape[d] for d in "BTHKV")
    gen = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    x = {"q": r(B, T, H, K).to(dtype), "k": r(B, T, H, K).to(dtype), "v": r(B, T, H, V).to(dtype)}
    x["g"] = F.logsigmoid(r(B, T, H, K) + 3)
    if op == "gla_gv":
        x["gv"] = F.logsigmoid(r(B, T, H, V) + 3)
    if op == "rwkv6":
        x["u"] = 0.1 * r(H, K)
    return {n: t.requires_grad_() for n, t in x.items()}


def call(op: str, x: dict, mode: str, chunk: int):
    """The op's output through the public API (backend triton)."""
    kw = dict(mode=mode, chunk_size=chunk, backend="triton")
    if op == "rwkv6":
        o, _ = linrnn.rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], **kw)
    else:
        o, _ = linrnn.gla(x["q"], x["k"], x["v"], x["g"], gv=x.get("gv"), **kw)
    return o


def outputs(op: str, x: dict, do, mode: str, chunk: int) -> dict:
    """o and the gradient of every leaf for the cotangent ``do``."""
    o = call(op, x, mode, chunk)
    grads = torch.autograd.grad(o, list(x.values()), do)
    return {"o": o.detach(), **{f"d{n}": g for n, g in zip(x, grads)}}


def rel_err(a, b, block: int = 2**26) -> float:
    """RMS-relative difference ‖a − b‖ / ‖b‖, in blocks (the tensors hold ~10⁸ elements)."""
    a, b = a.reshape(-1), b.reshape(-1)
    num = den = 0.0
    for i in range(0, a.numel(), block):
        x, y = a[i : i + block].double(), b[i : i + block].double()
        num += float(((x - y) ** 2).sum())
        den += float((y**2).sum())
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def short_error(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    if len(text) > limit:  # the head (what) and the tail (often the resource numbers)
        text = text[: limit // 2] + " … " + text[-limit // 2 :]
    return f"{type(exc).__name__}: {text}"


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def check_cuda(device) -> None:
    """Raise :class:`CudaBroken` when the context no longer works after an exception."""
    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device=device).add_(1).item()
    except Exception as exc:
        raise CudaBroken(short_error(exc)) from exc


def bench_ms(fn, args, device) -> float:
    """``triton.testing.do_bench`` median on CUDA; on CPU the median of ``--cpu-repeats``
    perf_counter calls (the config's correctness call was the warm-up)."""
    if device.type == "cuda":
        import triton.testing

        return float(
            triton.testing.do_bench(
                fn, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="median"
            )
        )
    times = []
    for _ in range(args.cpu_repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


# ---------------------------------------------------------------------------------------------
# Instrumentation: kernel launches by role, engine steps as phases
# ---------------------------------------------------------------------------------------------


class Stopwatch:
    """Timed spans: CUDA events on the GPU's timeline, perf_counter on CPU (where the
    interpreter runs each kernel synchronously)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.spans = []  # (kind, label, start, end)

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def add(self, kind, label, start, end) -> None:
        self.spans.append((kind, label, start, end))

    def totals(self, device) -> dict:
        """{(kind, label): [ms total, count]}"""
        sync(device)
        out: dict = {}
        for kind, label, s, e in self.spans:
            ms = s.elapsed_time(e) if self.cuda else 1e3 * (e - s)
            acc = out.setdefault((kind, label), [0.0, 0])
            acc[0] += ms
            acc[1] += 1
        return out


def role(name: str, kw: dict) -> str:
    if name == "rows_kernel":
        return "rows_kernel[dq]" if kw.get("IS_DQ") else "rows_kernel[fwd]"
    if name == "cols_kernel":
        return "cols_kernel[dk]" if kw.get("IS_DK") else "cols_kernel[dv]"
    if name == "apply_kernel" and kw.get("INTER"):  # SPLIT_INTER: dq's / dk's inter part
        return "apply_kernel[inter dk]" if kw.get("REV") else "apply_kernel[inter dq]"
    if name == "apply_kernel":
        return "apply_kernel[dv]" if kw.get("REV") else "apply_kernel[fwd]"
    if name == "scores_kernel" and kw.get("GATED") is False:
        return "scores_kernel[dP]"  # the backward's do vᵀ
    return name


class _Launcher:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` runs it, noting the tiles it got
    (and, with a stopwatch, its time)."""

    def __init__(self, kernel, name, seen: dict, watch: Stopwatch | None):
        self.kernel, self.name, self.seen, self.watch = kernel, name, seen, watch

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*a, **kw):
            label = role(self.name, kw)
            tiles = {k: kw[k] for k in TILE_KEYS if k in kw}
            g = list(grid) if isinstance(grid, (tuple, list)) else str(grid)
            self.seen.setdefault(label, {"grid": g, **tiles})
            if self.watch is None:
                return launch(*a, **kw)
            s = self.watch.mark()
            try:
                return launch(*a, **kw)
            finally:
                self.watch.add("launch", label, s, self.watch.mark())

        return run

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)


@contextlib.contextmanager
def instrumented(watch: Stopwatch | None = None):
    """Within the block the engine's kernels note their launches (dict role -> tiles, the
    value of the ``with``); with ``watch``, launches and engine steps are also timed."""
    seen: dict = {}
    saved = []
    for module, names in KERNEL_MODULES:
        for name in names:
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, _Launcher(getattr(module, name), name, seen, watch))
    if watch is not None:
        for name in PHASES:
            fn = getattr(tcv, name)
            saved.append((tcv, name, fn))
            setattr(tcv, name, _timed_phase(fn, name, watch))
    try:
        yield seen
    finally:
        for module, name, obj in reversed(saved):
            setattr(module, name, obj)


def _timed_phase(fn, name, watch):
    def timed(*a, **kw):
        s = watch.mark()
        try:
            return fn(*a, **kw)
        finally:
            watch.add("phase", name, s, watch.mark())

    return timed


# ---------------------------------------------------------------------------------------------
# Profile
# ---------------------------------------------------------------------------------------------


def kernel_table(op, x, do, mode, chunk, device, iters) -> list[dict]:
    """torch.profiler: per kernel name, time and launches per iteration (CUDA time on the GPU;
    on CPU the ops' self CPU time, which only checks this code)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for _ in range(iters):
            outputs(op, x, do, mode, chunk)
        sync(device)

    def us(ev):
        if device.type != "cuda":
            return ev.self_cpu_time_total
        t = getattr(ev, "device_time_total", None)
        return t if t is not None else getattr(ev, "cuda_time_total", 0.0)

    rows = [(ev.key, us(ev) / 1e3 / iters, ev.count / iters) for ev in prof.key_averages()]
    rows = [r for r in rows if r[1] > 0]
    total = sum(r[1] for r in rows) or 1.0
    triton_names = {n for _, names in KERNEL_MODULES for n in names}
    return [
        {
            "kernel": name,
            "ms": ms,
            "count": n,
            "share": ms / total,
            "triton": name.split("(")[0].strip() in triton_names,
        }
        for name, ms, n in sorted(rows, key=lambda r: -r[1])
    ]


def profile_unit(args, unit: dict, device) -> dict:
    op, shape_id, mode, chunk = unit["op"], unit["shape"], unit["mode"], unit["chunk"]
    cfg = current()
    scores = None if scores_apply(op, mode) else cfg["SCORES"]  # None: no effect here
    res = dict(unit, iters=args.profile_iters, diag_loop=cfg["DIAG_LOOP"], scores=scores)
    x = make_inputs(op, parse_shape(shape_id), DTYPES[args.dtype], device, args.seed)
    do = torch.randn_like(x["v"])
    t0 = time.perf_counter()
    for _ in range(2):  # compile and warm up
        outputs(op, x, do, mode, chunk)
    sync(device)
    res["warmup_s"] = time.perf_counter() - t0
    iters = args.profile_iters

    watch = Stopwatch(device)
    with instrumented(watch) as seen:
        for _ in range(iters):
            s = watch.mark()
            outputs(op, x, do, mode, chunk)
            watch.add("total", "fwd+bwd", s, watch.mark())
    totals = watch.totals(device)
    total = totals[("total", "fwd+bwd")][0] / iters
    res["fwdbwd_ms"] = total
    res["launches"] = [
        {
            "role": label,
            "ms": ms / iters,
            "count": n / iters,
            "share": ms / iters / total,
            "tiles": seen.get(label),
        }
        for (kind, label), (ms, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])
        if kind == "launch"
    ]
    phases = [
        {"phase": label, "ms": ms / iters, "count": n / iters, "share": ms / iters / total}
        for (kind, label), (ms, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])
        if kind == "phase"
    ]
    rest = total - sum(p["ms"] for p in phases)
    phases.append({"phase": "other", "ms": rest, "count": None, "share": rest / total})
    res["phases"] = phases
    res["triton_share"] = sum(r["ms"] for r in res["launches"]) / total
    try:
        res["kernels"] = kernel_table(op, x, do, mode, chunk, device, iters)
        res["kernels_total_ms"] = sum(r["ms"] for r in res["kernels"])  # the shares' base
    except Exception as exc:  # the event timings above stand on their own
        res["kernels_error"] = short_error(exc)
    print_profile(res)
    return res


def print_profile(res: dict) -> None:
    print(
        f"\n== profile {res['op']} {res['shape']} {res['mode']} L={res['chunk']} "
        f"DIAG_LOOP={res['diag_loop']} SCORES={res['scores']}: fwd+bwd "
        f"{res['fwdbwd_ms']:.3f} ms (events, mean of {res['iters']}), Triton kernels "
        f"{100 * res['triton_share']:.1f}%",
        flush=True,
    )
    print("  launches (per iteration):")
    for r in res["launches"]:
        t = r["tiles"] or {}
        tiles = " ".join(f"{k}={v}" for k, v in t.items() if k != "grid")
        print(
            f"  {r['ms']:9.3f} ms {100 * r['share']:5.1f}% {r['count']:4.0f}x  "
            f"{r['role']:20s} grid {tuple(t.get('grid', ()))} {tiles}"
        )
    print("  engine steps (host functions of triton_chunk_vec; other = the rest):")
    for r in res["phases"]:
        n = "" if r["count"] is None else f"{r['count']:4.0f}x"
        print(f"  {r['ms']:9.3f} ms {100 * r['share']:5.1f}% {n:5s} {r['phase']}")
    if "kernels" in res:
        print("  torch.profiler, per kernel name (per iteration):")
        for r in res["kernels"][:16]:
            print(
                f"  {r['ms']:9.3f} ms {100 * r['share']:5.1f}% {r['count']:4.0f}x  "
                f"{r['kernel'][:90]}"
            )
    else:
        print(f"  torch.profiler failed: {res['kernels_error']}")
    sys.stdout.flush()


def profile_forms(args, unit: dict) -> list[dict]:
    """The configs to profile ``unit`` with: the base first, then the other DIAG_LOOP form
    (``--profile-diag-loop both``) × the other SCORES form (``--profile-scores both``, where it
    applies): at most 4."""
    base = current()
    loops, scores = [base["DIAG_LOOP"]], [base["SCORES"]]
    if args.profile_diag_loop == "both" and HAS_DIAG_LOOP:
        loops.append(not base["DIAG_LOOP"])
    no_scores = scores_apply(unit["op"], unit["mode"])
    if args.profile_scores == "both" and no_scores is None:
        scores.append(not base["SCORES"])
    elif args.profile_scores == "both":
        print(f"profile {unit['op']} {unit['shape']} {unit['mode']}: SCORES not switched "
              f"({no_scores})", flush=True)  # fmt: skip
    return [dict(base, DIAG_LOOP=lo, SCORES=sc) for lo in loops for sc in scores]


def profile_all(args, units, device, rep, hard_end) -> None:
    """Every unit's profiles (``profile_forms``) at the first chunk size, until the deadline."""
    todo = [(unit, cfg) for unit in units for cfg in profile_forms(args, unit)]
    for i, (unit, cfg) in enumerate(todo):
        if time.monotonic() >= hard_end:
            rep.data["notes"].append(f"profile cut at the deadline: {len(todo) - i} not run")
            print(f"profile cut at the deadline: {len(todo) - i} not run", flush=True)
            break
        u = dict(unit, chunk=args.chunks[0])
        try:
            with using(cfg):
                rep.data["profile"].append(profile_unit(args, u, device))
        except CudaBroken:
            raise
        except Exception as exc:
            forms = dict(diag_loop=cfg["DIAG_LOOP"], scores=cfg["SCORES"])
            rep.data["profile"].append(dict(u, **forms, error=short_error(exc)))
            print(f"profile {u} {forms}: {short_error(exc)}", flush=True)
            check_cuda(device)
        rep.write()
