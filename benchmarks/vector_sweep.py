"""Profile and tile sweep of the vector-gate chunk engine (GLA with gk, GLA with gk and gv,
RWKV6) on the GPU machine: where the time of one forward+backward goes, and which tiles of
``triton_chunk_vec.VEC_TILES`` / ``GATED_BO`` are faster. In one process, under a time budget;
the JSON is rewritten after every measured row, so a run cut short keeps what it measured.

    python3 benchmarks/vector_sweep.py --profile --skip-sweep --commit <sha> --out prof.json
    python3 benchmarks/vector_sweep.py --deadline 400 --commit <sha> --out sweep.json
    python3 benchmarks/vector_sweep.py --ops gla --kernels rows gated_bo \\
        --rows 16,64,32,256,8,2 16,64,64,256,8,3 --gated-bo 64,8       # own candidates
    python3 benchmarks/vector_sweep.py --quick --profile     # CPU, TRITON_INTERPRET=1, tiny

The configurations and their legality are in vector_tiles.py; how one configuration is run,
timed and profiled is in vector_measure.py; this script chooses, sweeps and reports.

Ops, through the public API with backend="triton": ``gla`` (gk), ``gla_gv`` (gk and gv),
``rwkv6`` (w and u); q, k, v in ``--dtype`` (bf16), log decays logsigmoid(randn + 3) per
channel (fp32, ≈ −0.05 per step), u = 0.1·randn. Shapes: ``--shapes`` for every op, else GLA at
B8-T8192-H16-K256-V256 and RWKV6 at B8-T8192-H64-K64-V64.

``--profile`` (first): per op, one forward+backward at the first chunk size after two warm-up
calls (``--profile-diag-loop both``: with either form of the diagonal block; ``--profile-scores
both``, the default: with SCORES off and on where it applies, gla and rwkv6 in chunk mode; at
most 4 profiles per op), measured twice:
(1) every kernel launch and every host-side step of the engine timed with CUDA events (Triton
launches by role: rows_kernel[fwd] / [dq], cols_kernel[dk] / [dv], states_fwd/bwd_kernel,
scores_kernel, apply_kernel[fwd] / [dv], fused_*; with the tiles each launch got after
clipping; and the torch glue by engine function:
_cumsums, _revsum, _bonus, plus "other" = the rest of the forward+backward), and (2)
torch.profiler's CUDA time per kernel name (the glue kernels under their ATen names). Per
iteration, mean of ``--profile-iters``.

Sweep: per op × shape × mode, the default config first (its output and gradients are the
reference), then ``DIAG_LOOP`` switched (the diagonal block as one [BC, BC, tile] fp32 product
or as a walk over its BC key rows, triton_vector._vec_diag): when that is ≥ 1% faster in
fwd+bwd it becomes the base of the rest (``--adopt-below``), and candidates that only
make sense with the walk (sub-chunks BC of 32 and 64) join. Then, on that base, ``SCORES``
switched (gk-only calls in chunk mode, i.e. gla and rwkv6: the intra-chunk scores stored once
by triton_scores.scores_kernel and applied by apply_kernel for the forward and dv; no effect
with gv or in fused_chunk, where its row says so), adopted by the same rule; with SCORES in the
base the SCORE_TILES candidates (score_tiles, apply_tiles) join. Then the tile candidates one
kernel at a time, the other kernels at the base, round robin over the kernels (so a run cut
short has some of each), then the combination of the kernels' bests that beat the base by ≥ 1%
(``--combine-below``). Ratios: ``*_vs_default`` to the default config, ``*_vs_base`` to the
adopted base.

Each config: one forward+backward compared with the default's (RMS-relative error of o and
every gradient ≤ ``--tol``, 1e-2 in bf16; a config over it is "wrong" and not timed), then
``triton.testing.do_bench`` medians of the forward (under no_grad; not for kernels only the
backward uses) and of forward+backward (``torch.autograd.grad``). Errors (Triton compile
errors, out of resources, out of memory) become the row's status. Candidates are swept at the
first of ``--chunks``; the other chunk sizes get the default and the combined best
(``--full-chunks``: the whole sweep at every chunk size). Each op × shape × mode gets an equal
share of the time left before ``--deadline`` (seconds from the start); after the deadline no
new config starts.

Which kernel takes which tiles (linrnn/engine/triton_chunk_vec.py; power-of-two tiles, each
clipped by ``_fit`` to [16, next_pow2(extent)], except the sub-chunk BC):

  states (BS, BK, BV, warps, stages)      states_fwd_kernel and states_bwd_kernel; BS the time
                                          step of the chunk walk, grid K/BK × V/BV × B·H walks
  rows (BC, BS, BD, BO, warps, stages)    rows_kernel: forward (BD over K, BO over V, or
                                          GATED_BO with gv) and dq (BD over V, GATED_BO over K)
  cols (BC, BQ, BD, BO, warps, stages)    cols_kernel: dk (BD over V, GATED_BO over K) and dv
                                          (BD over K, BO over V, or GATED_BO with gv)
  fused (BC, 0, BD, 0, warps, stages)     fused_chunk's fused_{fwd,dq,dk,dv}_kernel (their K/V
                                          tiles come from triton_chunk.Config)
  GATED_BO                                the output tile over a gated dimension; a candidate
                                          "BO,W" also sets rows' and cols' warps to W
  diag_loop (0 or 1)                      DIAG_LOOP: the diagonal block's form (all modes)
  scores (0 or 1)                         SCORES: stored scores (gk only, chunk mode)
  score_tiles (BC, BS, BD, warps, stages) SCORE_TILES["scores"]: scores_kernel; BC its
                                          sub-chunk of rows, BS the earlier keys, BD over K
  apply_tiles (BQ, BS, BD, BO, warps,     SCORE_TILES["apply"]: apply_kernel, forward and dv;
               stages)                    BQ rows, BS the other time side, BD over K (the
                                          state part), BO over V
  inter_tiles (BQ, BD, BO, warps, stages) SCORE_TILES["inter"]: apply_kernel's INTER (dq's and
                                          dk's inter-chunk parts; in fast chunks the whole
                                          dq / dk), BD over V, BO over K
  fast_tiles (BQ, BS, BD, warps, stages)  SCORE_TILES["fast"]: fast_scores_kernel (the fast
                                          chunks' scores), BS the keys, BD over K

BC is the sub-chunk whose diagonal block is computed in fp32 log space, as [BC, BC, BD] (and,
gated output, [BC, BC, BO]) products or, with DIAG_LOOP, as BC steps of [BC, tile]: not
clipped, a power of two ≥ 16 (tl.arange, tl.dot); above 16 mostly with the walk (the block's
registers grow with BC²); larger than the chunk is legal (masked) but wasted. BS/BQ (the other
time side) tile the earlier keys / later queries. rows' and cols' BO are unused with gv (the
gated output takes GATED_BO). Candidates equal to the default (or to an earlier candidate)
after clipping are skipped.

``--quick``: a CPU check of this script (TRITON_INTERPRET=1, fp32, B1-T32-H1-K32-V32, chunk
16, one candidate per kernel, perf_counter times; the profile uses torch.profiler's CPU times;
``--adopt-below`` and ``--combine-below`` default to always, to run every code path).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):  # linrnn uninstalled; vector_tiles, vector_measure
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
if __name__ == "__main__" and "--quick" in sys.argv[1:]:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (linrnn imports it)

import torch  # noqa: E402
from vector_measure import (  # noqa: E402  (inputs, timing, launches, the profile)
    CudaBroken,
    bench_ms,
    call,
    check_cuda,
    instrumented,
    make_inputs,
    outputs,
    profile_all,
    rel_err,
    short_error,
    sync,
)
from vector_tiles import (  # noqa: E402  (benchmarks/ is the script's own folder)
    ARITY,
    CANDIDATES,
    DTYPES,
    HAS_DIAG_LOOP,
    HAS_DIAG_SPAN,
    HAS_FAST_CHUNKS,
    HAS_PRE_GATE,
    HAS_SCORES,
    HAS_SKIP_SUB_CHUNKS,
    HAS_SPLIT_INTER,
    HAS_WALK_UNROLL,
    KERNELS,
    LOOP_ONLY,
    MODE_KERNELS,
    QUICK_CANDIDATES,
    QUICK_LOOP_ONLY,
    SCORE_KEYS,
    SPAN_ON,
    SWITCHES,
    TOLERANCE,
    apply,
    candidate_problem,
    current,
    effective,
    fmt,
    scores_apply,
    using,
)

from linrnn.bench import report  # noqa: E402
from linrnn.bench.registry import parse_shape  # noqa: E402
from linrnn.engine import triton_chunk_vec as tcv  # noqa: E402

OPS = ("gla", "rwkv6", "gla_gv")  # in this order: a run cut short has the headline op first
GLA_SHAPES = ("B8-T8192-H16-K256-V256",)  # B8-T8192-H32-K128-V128 with --shapes
RWKV6_SHAPES = ("B8-T8192-H64-K64-V64",)
QUICK_SHAPE = "B1-T32-H1-K32-V32"
MODES = ("chunk", "fused_chunk")
# ---------------------------------------------------------------------------------------------
# Sweep
# ---------------------------------------------------------------------------------------------


def measure(args, unit, x, do, ref, cfg, fwd: bool, device) -> tuple[dict, dict | None]:
    """One config: a checked forward+backward, then its times. Returns (row, outputs when
    ``ref`` is None: the default's, which become the reference)."""
    op, mode, chunk = unit["op"], unit["mode"], unit["chunk"]
    row: dict = {"status": "ok"}
    out = None
    t_start = time.perf_counter()
    with using(cfg):
        try:
            with instrumented() as seen:
                t0 = time.perf_counter()
                out = outputs(op, x, do, mode, chunk)
                sync(device)
            row["first_call_s"] = time.perf_counter() - t0  # with any compilation
            row["launches"] = seen
            if ref is not None:
                errs = {n: rel_err(out[n], ref[n]) for n in ref}
                worst = max(errs, key=lambda n: errs[n] if math.isfinite(errs[n]) else math.inf)
                row.update(errors=errs, max_rel_err=errs[worst], worst=worst)
                out = None
                if not errs[worst] <= args.tol:
                    row["status"] = f"wrong: {worst} rel err {errs[worst]:.2e} > {args.tol:g}"
                    return row, None
            if fwd:

                def fwd_only():
                    with torch.no_grad():
                        call(op, x, mode, chunk)

                row["fwd_ms"] = bench_ms(fwd_only, args, device)
            row["fwdbwd_ms"] = bench_ms(lambda: outputs(op, x, do, mode, chunk), args, device)
        except Exception as exc:  # compile error, out of resources, OOM: record, go on
            row["status"] = f"error: {short_error(exc)}"
            out = None
            check_cuda(device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        finally:
            row["config_s"] = time.perf_counter() - t_start
    return row, out


def fwd_affected(kernel: str | None, gv: bool, stored: bool = False) -> bool:
    """Whether the forward uses the kernel's tiles (cols: backward only; GATED_BO: the
    forward's output tile only with gv; rows: not with SCORES, ``stored``)."""
    if kernel == "rows":
        return not stored
    return kernel not in ("cols", "gated_bo") or (kernel == "gated_bo" and gv)


class Unit:
    """One op × shape × mode × chunk size of the sweep: its inputs, reference, default and
    base rows, and the rows it emits."""

    def __init__(self, args, u, x, do, ref, default_row, cfg, device, emit):
        self.args, self.u, self.x, self.do, self.ref = args, u, x, do, ref
        self.default = self.base = default_row
        self.cfg, self.device, self._emit = cfg, device, emit
        self.shape, self.gv = parse_shape(u["shape"]), u["op"] == "gla_gv"
        self.no_scores = scores_apply(u["op"], u["mode"])  # why SCORES has no effect, or None

    def stored(self) -> bool:
        """Whether the base stores the scores (SCORES on, and it applies)."""
        return self.no_scores is None and bool(self.cfg["SCORES"])

    def key(self, cfg) -> tuple:
        return effective(cfg, self.u["mode"], self.shape, self.u["chunk"], self.gv)

    def emit(self, r: dict) -> dict:
        base = self.base if self.base is not self.default else None
        return self._emit(dict(self.u, **r), self.default, base)

    def run(self, kernel, tiles, cfg, fwd=True) -> dict:
        row, _ = measure(self.args, self.u, self.x, self.do, self.ref, cfg, fwd, self.device)
        return self.emit(dict(kernel=kernel, tiles=tiles, config=cfg, **row))


def sweep_unit(args, unit: dict, device, unit_end: float, hard_end: float, emit) -> dict:
    """Default, candidates (DIAG_LOOP first, then round robin over the kernels), combined
    best, at the first chunk size (every chunk size with --full-chunks); default and combined
    best at the others."""
    op = unit["op"]
    x = make_inputs(op, parse_shape(unit["shape"]), DTYPES[args.dtype], device, args.seed)
    do = torch.randn_like(x["v"])
    start = current()
    summary = dict(unit, chunks={})
    best_cfg = None  # the combined best found at a fully swept chunk size
    costs: list[float] = []
    for i, chunk in enumerate(args.chunks):
        full = args.full_chunks or i == 0
        u = dict(unit, chunk=chunk)
        now = time.monotonic()
        if now >= hard_end:
            emit(dict(u, kernel="default", tiles=None, status="not run: deadline"))
            continue
        if args.full_chunks:  # an equal share of the unit's time per chunk size
            sub_end, later = now + (unit_end - now) / (len(args.chunks) - i), 1
            best_cfg = None
        else:  # left for the combined best and two rows at each later chunk size
            sub_end, later = unit_end, 1 + 2 * (len(args.chunks) - 1 - i)
        row, ref = measure(args, u, x, do, None, start, True, device)
        default = emit(dict(u, kernel="default", tiles=None, config=start, **row))
        costs.append(row["config_s"])
        info = summary["chunks"][str(chunk)] = {"default": _figures(default), "kernels": {}}
        if ref is None:
            continue  # no reference: the candidates cannot be checked
        un = Unit(args, u, x, do, ref, default, start, device, emit)
        if full:
            best_cfg = sweep_candidates(un, info, costs, sub_end, hard_end, later)
        if best_cfg is None or (full and un.key(best_cfg) == un.key(un.cfg)):
            pass  # nothing better, or the base itself (already measured)
        elif time.monotonic() >= hard_end:
            un.emit(dict(kernel="combined", tiles=None, status="not run: deadline"))
        else:
            info["combined"] = _figures(un.run("combined", None, best_cfg))
        del ref, un
    if device.type == "cuda":
        del x, do
        torch.cuda.empty_cache()
    return summary


def sweep_candidates(un: Unit, info, costs, sub_end, hard_end, later):
    """The candidates at one chunk size: the switches first, DIAG_LOOP then SCORES (each
    adopted as the base when faster), then the others round robin (SCORE_TILES' only with
    SCORES in the base). Fills ``info["kernels"]`` with each kernel's best; returns the
    combination of the bests that beat the base (``--combine-below``) on top of it, the base
    alone when only switches changed, or None."""
    args = un.args
    kernels = [k for k in args.kernels if k in MODE_KERNELS[un.u["mode"]]]
    if not HAS_DIAG_LOOP and "diag_loop" in kernels:
        kernels.remove("diag_loop")
    if not HAS_SCORES:
        kernels = [k for k in kernels if k != "scores" and k not in SCORE_KEYS]
    if not HAS_SPLIT_INTER and "split_inter" in kernels:
        kernels.remove("split_inter")
    keys = {un.key(un.cfg): "default"}
    best: dict = {}
    best_fwd: dict = {}

    def time_left() -> bool:
        now = time.monotonic()
        return now + later * statistics.median(costs) < sub_end and now < hard_end

    def try_candidate(kernel, t) -> dict | None:
        cfg = apply(kernel, t, un.cfg)
        key = un.key(cfg)
        if key in keys:
            un.emit(dict(kernel=kernel, tiles=list(t), status=f"skipped: same as {keys[key]}"))
            return None
        keys[key] = f"{kernel} {fmt(t)}"
        r = un.run(kernel, list(t), cfg, fwd_affected(kernel, un.gv, un.stored()))
        costs.append(r["config_s"])
        if r["status"] != "ok":
            return None
        if kernel not in best or r["fwdbwd_ms"] < best[kernel]["fwdbwd_ms"]:
            best[kernel] = r
        if r.get("fwd_ms") and (kernel not in best_fwd or r["fwd_ms"] < best_fwd[kernel]["fwd_ms"]):
            best_fwd[kernel] = r
        return r

    adopted = []
    for switch in (k for k in SWITCHES if k in kernels):
        if switch == "scores" and un.no_scores:
            for t in args.candidates["scores"]:
                un.emit(dict(kernel="scores", tiles=list(t), status=f"skipped: {un.no_scores}"))
            continue
        if switch == "walk_unroll" and not un.cfg["DIAG_LOOP"]:
            for t in args.candidates["walk_unroll"]:
                why = "skipped: WALK_UNROLL needs the walk (DIAG_LOOP) in the base"
                un.emit(dict(kernel="walk_unroll", tiles=list(t), status=why))
            continue
        if switch == "split_inter" and (un.no_scores or not un.cfg.get("SCORES")):
            for t in args.candidates["split_inter"]:
                why = "skipped: SPLIT_INTER needs the stored scores (SCORES, gk only, chunk)"
                un.emit(dict(kernel="split_inter", tiles=list(t), status=why))
            continue
        for t in args.candidates[switch]:
            if not time_left():
                break
            try_candidate(switch, tuple(t))
        r = best.get(switch)
        if r and r["fwdbwd_ms"] < args.adopt_below * un.base["fwdbwd_ms"]:
            un.cfg, un.base = r["config"], r
            adopted.append(switch)
            keys[un.key(un.cfg)] = f"the base ({switch})"
            switches = {k: un.cfg.get(k) for k in (s.upper() for s in SWITCHES)}
            info["base"] = {"adopted": "+".join(adopted), "tiles": r["tiles"], **switches}
            info["base"].update(_figures(r))
            print(f"  base: {switch.upper()}={un.cfg[switch.upper()]} from here on", flush=True)
    lists = []
    for k in kernels:
        if k in SWITCHES or (k in SCORE_KEYS and not un.stored()):
            continue  # SCORE_TILES: only when the base stores the scores
        extra = args.loop_candidates.get(k, []) if un.cfg["DIAG_LOOP"] else []
        lists.append([(k, tuple(t)) for t in [*extra, *args.candidates[k]]])
    queue = [c for group in itertools.zip_longest(*lists) for c in group if c]
    for j, (kernel, t) in enumerate(queue):
        if not time_left():
            info["not_run"] = len(queue) - j
            print(f"  {len(queue) - j} candidates not run (this unit's time is up)", flush=True)
            break
        try_candidate(kernel, t)
    for kernel, r in best.items():
        entry = info["kernels"][kernel] = {"tiles": r["tiles"], **_figures(r)}
        f = best_fwd.get(kernel)
        if f is not None and f is not r:
            entry["best_fwd"] = {"tiles": f["tiles"], **_figures(f)}
    limit = args.combine_below * un.base["fwdbwd_ms"]
    better = {  # the switches are in the base when adopted, and left out otherwise
        k: tuple(r["tiles"])
        for k, r in best.items()
        if k not in SWITCHES and r["fwdbwd_ms"] < limit
    }
    if better:
        return combine(better, un.cfg)
    return un.cfg if adopted else None


def combine(better: dict, cfg: dict) -> dict:
    """Each kernel's best on top of ``cfg``. A GATED_BO candidate's warps apply to rows / cols
    only where those kept their tuple."""
    cfg = dict(cfg, VEC_TILES=dict(cfg["VEC_TILES"]))
    tiles = cfg["VEC_TILES"]
    if "gated_bo" in better:
        t = better["gated_bo"]
        cfg["GATED_BO"] = t[0]
        if len(t) > 1:
            for k in ("rows", "cols"):
                if k not in better:
                    tiles[k] = (*tiles[k][:4], t[1], tiles[k][5])
    for k, t in better.items():
        if k in SCORE_KEYS:
            cfg["SCORE_TILES"] = dict(cfg["SCORE_TILES"], **{SCORE_KEYS[k]: t})
        elif k in ARITY:
            tiles[k] = t
    return cfg


def _figures(r: dict) -> dict:
    keys = ("status", "fwd_ms", "fwdbwd_ms", "fwd_vs_default", "fwdbwd_vs_default",
            "fwd_vs_base", "fwdbwd_vs_base", "config")  # fmt: skip
    return {k: r.get(k) for k in keys if k in r}


# ---------------------------------------------------------------------------------------------
# Command line, report
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument(
        "--shapes",
        nargs="+",
        metavar="ID",
        help=f"shapes for every op (default: GLA {list(GLA_SHAPES)}, RWKV6 {list(RWKV6_SHAPES)})",
    )
    p.add_argument("--modes", nargs="+", choices=MODES, default=["chunk"])
    p.add_argument(
        "--chunks",
        nargs="+",
        type=int,
        default=[64, 128],
        help="chunk sizes; candidates are swept at the first (64 128)",
    )
    p.add_argument("--full-chunks", action="store_true", help="sweep at every chunk size")
    for k in ("rows", "states", "cols", "fused", *SCORE_KEYS):
        n = ARITY[k]
        p.add_argument(
            f"--{k.replace('_', '-')}",
            nargs="*",
            metavar="T",
            help=f"{k} candidates, {n} comma-separated numbers each (none: skip)",
        )
    p.add_argument(
        "--gated-bo",
        nargs="*",
        metavar="BO[,W]",
        help="GATED_BO candidates; BO,W also sets rows' and cols' warps to W",
    )
    switch_help = {  # each switch's candidates: 0|1 (default: the form the base does not use)
        "scores": "gla, rwkv6 in chunk mode",
        "walk_unroll": "only with the walk, DIAG_LOOP, in the base",
        "split_inter": "only with the stored scores, SCORES, in the base",
        "diag_span": "1 the diagonal's fast form at the engine's span, or 60; 0 log space alone",
        "fast_chunks": "gla, rwkv6 in chunk mode",
        "skip_sub_chunks": "gla, rwkv6 in chunk mode: dq/dk's 16-row launches left out",
        "pre_gate": "gla, rwkv6 in chunk mode: gated q and k from the cumulative-sum pass",
        "diag_loop": "",
    }
    for name, extra in switch_help.items():
        p.add_argument(
            f"--{name.replace('_', '-')}",
            nargs="*",
            metavar="0|1",
            help=f"{name.upper()} candidates (default: the form the base does not use)"
            + (f"; {extra}" if extra else ""),
        )
    for name in ("diag_loop", "scores", "split_inter", "diag_span", "fast_chunks",
                 "skip_sub_chunks", "pre_gate"):  # fmt: skip
        p.add_argument(
            f"--base-{name.replace('_', '-')}",
            type=int,
            choices=(0, 1),
            help=f"{name.upper()} of the default config (profile and sweep; default: the "
            "engine's; DIAG_SPAN 1: the engine's span, or 60)",
        )
    p.add_argument(
        "--adopt-below",
        type=float,
        default=None,
        help="the other DIAG_LOOP (then SCORES) form becomes the base when its fwd+bwd is below "
        "this ratio to the base (0.99; 0: never; --quick: always, to check the code)",
    )
    p.add_argument(
        "--kernels",
        nargs="+",
        choices=KERNELS,
        default=list(KERNELS),
        help="which kernels' candidates to sweep",
    )
    p.add_argument(
        "--combine-below",
        type=float,
        default=None,
        help="combine the kernels whose best fwd+bwd is below this ratio to the default "
        "(0.99; --quick: always, to check the code)",
    )
    p.add_argument("--profile", action="store_true", help="profile first (per-kernel times)")
    p.add_argument("--profile-iters", type=int, default=3)
    p.add_argument(
        "--profile-diag-loop",
        choices=("base", "both"),
        default="base",
        help="profile the base's DIAG_LOOP form only, or both forms",
    )
    p.add_argument(
        "--profile-scores",
        choices=("base", "both"),
        default="both",
        help="profile the base's SCORES form only, or both where it applies (gla, rwkv6 in "
        "chunk mode; default both)",
    )
    p.add_argument("--skip-sweep", action="store_true", help="the profile only")
    p.add_argument(
        "--deadline",
        type=float,
        default=480,
        help="seconds from the start after which no new config starts (480)",
    )
    p.add_argument("--dtype", choices=DTYPES, default=None, help="q, k, v dtype (bf16)")
    p.add_argument("--tol", type=float, help="RMS-relative error vs the default (1e-2 bf16)")
    p.add_argument("--warmup-ms", type=float, default=25, help="do_bench warm-up (25)")
    p.add_argument("--rep-ms", type=float, default=100, help="do_bench repetition time (100)")
    p.add_argument("--cpu-repeats", type=int, default=None, help="timed calls on CPU (1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"CPU check of the script: interpreter, fp32, {QUICK_SHAPE}, chunk 16",
    )
    p.add_argument("--commit", help="git commit to record (the GPU copy's .git may be stale)")
    p.add_argument("--out", type=Path, help="JSON path")
    args = p.parse_args(argv)

    args.device = "cpu" if args.quick else "cuda"
    args.dtype = args.dtype or ("fp32" if args.quick else "bf16")
    args.tol = args.tol if args.tol is not None else TOLERANCE[args.dtype]
    args.cpu_repeats = args.cpu_repeats or 1
    if args.combine_below is None:
        args.combine_below = math.inf if args.quick else 0.99
    if args.adopt_below is None:
        args.adopt_below = math.inf if args.quick else 0.99
    if args.quick and "--chunks" not in (argv if argv is not None else sys.argv[1:]):
        args.chunks = [16]
    if min(args.chunks) < 1 or args.profile_iters < 1:
        p.error("--chunks and --profile-iters must be ≥ 1")
    for s in args.shapes or ():
        try:
            parse_shape(s)
        except ValueError as exc:
            p.error(str(exc))
    builtin = dict(QUICK_CANDIDATES if args.quick else CANDIDATES)

    def base_form(name: str, has: bool) -> int:
        """The base's form of switch ``name`` (0/1): --base-<name> if given, else the engine's."""
        given = getattr(args, f"base_{name}")
        if given is not None and not has:
            p.error(f"--base-{name.replace('_', '-')}: this engine has no {name.upper()}")
        return given if given is not None else int(has and bool(getattr(tcv, name.upper())))

    builtin["diag_loop"] = [(1 - base_form("diag_loop", HAS_DIAG_LOOP),)]
    builtin["scores"] = [(1 - base_form("scores", HAS_SCORES),)] if HAS_SCORES else []
    builtin["walk_unroll"] = [(1 - int(bool(tcv.WALK_UNROLL)),)] if HAS_WALK_UNROLL else []
    split = base_form("split_inter", HAS_SPLIT_INTER)
    builtin["split_inter"] = [(1 - split,)] if HAS_SPLIT_INTER else []
    span = base_form("diag_span", HAS_DIAG_SPAN)
    builtin["diag_span"] = [(1 - span,)] if HAS_DIAG_SPAN else []
    fast = base_form("fast_chunks", HAS_FAST_CHUNKS)
    builtin["fast_chunks"] = [(1 - fast,)] if HAS_FAST_CHUNKS else []
    skip_sub = base_form("skip_sub_chunks", HAS_SKIP_SUB_CHUNKS)
    builtin["skip_sub_chunks"] = [(1 - skip_sub,)] if HAS_SKIP_SUB_CHUNKS else []
    pre = base_form("pre_gate", HAS_PRE_GATE)
    builtin["pre_gate"] = [(1 - pre,)] if HAS_PRE_GATE else []
    loop_only = QUICK_LOOP_ONLY if args.quick else LOOP_ONLY
    args.candidates, args.loop_candidates = {}, {}
    for k in KERNELS:
        given = getattr(args, k)
        if given is None:
            args.candidates[k] = [tuple(t) for t in builtin[k]]
            args.loop_candidates[k] = [tuple(t) for t in loop_only.get(k, [])]
            continue
        args.loop_candidates[k] = []  # the list given is the list swept
        cands = []
        for text in given:
            try:
                t = tuple(int(v) for v in text.split(","))
            except ValueError:
                p.error(f"--{k.replace('_', '-')} {text!r}: comma-separated integers")
            why = candidate_problem(k, t)
            if why:
                p.error(f"--{k.replace('_', '-')} {text}: {why}")
            cands.append(t)
        args.candidates[k] = cands
    return args


def units_of(args) -> list[dict]:
    units = []
    for op in args.ops:
        shapes = args.shapes or (RWKV6_SHAPES if op == "rwkv6" else GLA_SHAPES)
        if args.quick and not args.shapes:
            shapes = (QUICK_SHAPE,)
        for shape in shapes:
            for mode in args.modes:
                units.append({"op": op, "shape": shape, "mode": mode})
    return units


class Report:
    def __init__(self, args, argv, machine):
        self.path = args.out or (
            ROOT / "benchmarks" / "results" / "tmp"
            / f"{machine['date'][:10]}-{report.slug(machine.get('gpu'))}-vector-sweep.json"
        )  # fmt: skip
        cmd = sys.argv if argv is None else ["benchmarks/vector_sweep.py", *argv]
        self.data = {
            "benchmark": "vector_sweep",
            "complete": False,  # rewritten after every row; True at the end
            "machine": machine,
            "command": shlex.join([sys.executable, *cmd] if argv is None else cmd),
            "config": {
                k: v
                for k, v in vars(args).items()
                if k not in ("out", "candidates", "loop_candidates")
            },
            "default_config": current(),
            "candidates": args.candidates,
            "loop_only_candidates": args.loop_candidates,
            "tolerance": args.tol,
            "timing": (
                f"triton.testing.do_bench medians (warmup {args.warmup_ms} ms, rep "
                f"{args.rep_ms} ms)"
                if args.device == "cuda"
                else f"CPU: median of {args.cpu_repeats} perf_counter calls (interpreter)"
            ),
            "profile": [],
            "sweep": [],
            "best": [],
            "notes": [],
        }
        self.write()

    def write(self, complete: bool = False) -> None:
        self.data["complete"] = complete
        report.write_json(self.path, self.data)

    def row(self, r: dict, default: dict | None = None, base: dict | None = None) -> dict:
        """Add a sweep row (with its time ratios to the ``default`` and the adopted ``base``
        rows), print it, write the JSON."""
        r = dict(r)
        if r.get("kernel") == "combined":
            r["note"] = "each kernel's best (fwd+bwd under --combine-below × base) together"
        for name, ref in (("default", default), ("base", base)):
            if ref is None or r.get("status") != "ok":
                continue
            for t in ("fwd_ms", "fwdbwd_ms"):
                if r.get(t) and ref.get(t):
                    r[t.replace("_ms", f"_vs_{name}")] = r[t] / ref[t]
        self.data["sweep"].append(r)
        self.write()
        print(row_line(r), flush=True)
        return r


def row_line(r: dict) -> str:
    what = r["kernel"] + ("" if r.get("tiles") is None else f" ({fmt(r['tiles'])})")
    head = f"  {r['op']} {r['shape']} {r['mode']} L={r['chunk']} {what}:"
    if r.get("status") != "ok":
        return f"{head} {r.get('status')}"
    parts = []
    for t, label in (("fwd_ms", "fwd"), ("fwdbwd_ms", "fwd+bwd")):
        if r.get(t) is not None:
            ratios = [r.get(t.replace("_ms", f"_vs_{n}")) for n in ("default", "base")]
            text = ", ".join(f"{x:.3f}×{' base' if n else ''}" for n, x in enumerate(ratios) if x)
            parts.append(f"{label} {r[t]:.3f} ms" + (f" ({text})" if text else ""))
    if "max_rel_err" in r:
        parts.append(f"err {r['max_rel_err']:.1e}")
    parts.append(f"first {r.get('first_call_s', 0):.1f} s, {r.get('config_s', 0):.1f} s")
    return f"{head} " + ", ".join(parts)


def print_best(best: list[dict]) -> None:
    print("\nbest per kernel (fwd+bwd; ratios to the default config, and to the base):")
    for s in best:
        for chunk, info in s["chunks"].items():
            d = info["default"]
            if d.get("status") != "ok":
                continue
            print(f"  {s['op']} {s['shape']} {s['mode']} L={chunk}: default fwd "
                  f"{d['fwd_ms']:.3f} ms, fwd+bwd {d['fwdbwd_ms']:.3f} ms")  # fmt: skip
            if "base" in info:
                b = info["base"]
                print(f"    base: {b['adopted']} (DIAG_LOOP {b.get('DIAG_LOOP')}, SCORES "
                      f"{b.get('SCORES')}), fwd+bwd {b['fwdbwd_ms']:.3f} ms "
                      f"({b['fwdbwd_vs_default']:.3f}×)")  # fmt: skip
            for k, r in info["kernels"].items():
                vs_base = f", {r['fwdbwd_vs_base']:.3f}× base" if "fwdbwd_vs_base" in r else ""
                print(f"    {k:11s} {fmt(r['tiles']):20s} fwd+bwd {r['fwdbwd_ms']:.3f} ms "
                      f"({r['fwdbwd_vs_default']:.3f}×{vs_base})")  # fmt: skip
            c = info.get("combined", {})
            if c.get("status") == "ok":
                cfg = c["config"]
                print(f"    combined  fwd {c['fwd_ms']:.3f} ms ({c['fwd_vs_default']:.3f}×), "
                      f"fwd+bwd {c['fwdbwd_ms']:.3f} ms ({c['fwdbwd_vs_default']:.3f}×): "
                      f"VEC_TILES {cfg['VEC_TILES']}, GATED_BO {cfg['GATED_BO']}, "
                      f"DIAG_LOOP {cfg['DIAG_LOOP']}, SCORES {cfg.get('SCORES')}, "
                      f"SCORE_TILES {cfg.get('SCORE_TILES')}")  # fmt: skip


def main(argv=None) -> int:
    t_start = time.monotonic()
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --quick for the CPU check of this script", file=sys.stderr)
        return 2
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("--quick needs TRITON_INTERPRET=1 before triton is imported", file=sys.stderr)
        return 2
    hard_end = t_start + args.deadline
    if args.base_diag_loop is not None:
        tcv.DIAG_LOOP = bool(args.base_diag_loop)
    if args.base_scores is not None:
        tcv.SCORES = bool(args.base_scores)
    if args.base_split_inter is not None:
        tcv.SPLIT_INTER = bool(args.base_split_inter)
    if args.base_diag_span is not None:
        tcv.DIAG_SPAN = SPAN_ON if args.base_diag_span else 0.0
    if args.base_fast_chunks is not None:
        tcv.FAST_CHUNKS = bool(args.base_fast_chunks)
    if args.base_skip_sub_chunks is not None:
        tcv.SKIP_SUB_CHUNKS = bool(args.base_skip_sub_chunks)
    if args.base_pre_gate is not None:
        tcv.PRE_GATE = bool(args.base_pre_gate)
    machine = report.machine_info(
        report.info_case({"device": args.device}, {}), args.device, args.commit
    )
    rep = Report(args, argv, machine)
    print(
        f"{machine.get('gpu') or 'CPU (interpreter)'} | torch {machine['torch']} | Triton "
        f"{machine['triton']} | commit {machine['git_commit']} | {args.dtype} | "
        f"tol {args.tol:g} | deadline {args.deadline:g} s",
        flush=True,
    )
    units = units_of(args)
    try:
        if args.profile:
            profile_all(args, units, device, rep, hard_end)
        if not args.skip_sweep:
            print(
                "\nsweep (ratios to the default config of the same op, shape, mode and chunk "
                "size, and to the base once the other DIAG_LOOP or SCORES form is adopted):"
            )
            for i, unit in enumerate(units):
                now = time.monotonic()
                if now >= hard_end:
                    rep.data["notes"].append(f"not started (deadline): {unit}")
                    continue
                unit_end = now + (hard_end - now) / (len(units) - i)
                summary = sweep_unit(args, unit, device, unit_end, hard_end, rep.row)
                rep.data["best"].append(summary)
                rep.write()
            print_best(rep.data["best"])
    except CudaBroken as exc:
        rep.data["notes"].append(f"stopped: CUDA context broken ({exc})")
        print(f"stopped: CUDA context broken ({exc})", flush=True)
        rep.write()
        return 1
    rep.write(complete=True)
    print(f"\nwrote {rep.path} ({time.monotonic() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
