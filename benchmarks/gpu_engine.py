"""GPU check and benchmark of the Triton chunkwise engine (issue 3), with its peers side by side.

A thin user of :mod:`linrnn.bench` (the ops and inputs, peers, worker isolation, timing, FLOP and
byte counts, reports); what stays here is the correctness check and this script's tables and
targets. ``linrnn bench`` is the general command; this script keeps issue 3's run as it was.

    # on the GPU machine (peers from the wheels in .whl/, see GPU.md):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu_engine.py --commit <sha>
    python3 benchmarks/gpu_engine.py --skip-bench                     # correctness only
    python3 benchmarks/gpu_engine.py --skip-correctness --ops mlstm mlstm_kernels \\
        --shapes B8-T8192-H16-K256-V256                               # one target, one shape
    python3 benchmarks/gpu_engine.py --quick                          # smoke test, small shape
    python3 benchmarks/gpu_engine.py --device cpu --quick             # CPU smoke (torch backend)

(a) Correctness. Every scalar-gate variant (linear_attn with and without the sum normalizer,
retention, simple_gla, mLSTM sigmoid with and without the normalizer, mLSTM exp) × mode
(chunk, fused_chunk) × dtype (bf16, fp16, fp32) runs with backend="triton" on seeded random
inputs (shapes in CHECK_SHAPES: T=300 is not a multiple of any chunk size; K=96, V=80, and
K=V=256), with an initial state and output_final_state. The initial state is the final state of
the same op over a 32-step random prefix (realistic magnitudes, also for the normalizer n and
the mLSTM max state m). The output, every final-state tensor and the gradients of q, k, v, the
gates and every initial-state tensor of the loss ``(o·do).sum() + Σ (h_T·dh_T).sum()`` (fixed
random cotangents) are compared with the same inputs (rounded to the dtype) in float64 through
the torch chunk engine (``backend="torch", mode="chunk"``, exact up to fp64 rounding). Error:
RMS-relative ``‖a − b‖₂ / ‖b‖₂``; a case passes when every error is at most TOLERANCE[dtype].
Every floating-point ``torch.empty``/``empty_like``/``new_empty`` of the checked call returns
NaN-filled memory, so an element a kernel forgets to write shows up. Each (variant, mode) runs
in its own subprocess (``--jobs`` at a time), so a compiler abort fails its rows, not the run.

(b) Benchmark, bf16, one GPU, all rows measured in this one run:
  * linrnn, every variant above, modes chunk and fused_chunk, backend triton, at each of
    ``--chunk-sizes``;
  * mlstm_kernels 2.0.6: triton_xl_chunk_siging (sigmoid input gate; with and without its
    normalizer), triton_xl_chunk and triton_limit_chunk (exp input gate), each at its own
    default chunk size (128, 128, 64). Layout [B, H, T, D]: inputs are transposed to it
    (``.transpose(1, 2).contiguous()``) before timing, and the output stays in that layout;
  * fla (fla-core 0.6.0): chunk_simple_gla, chunk_retention, chunk_linear_attn (with and
    without its normalizer), chunk size 64 (its default), layout [B, T, H, K] like linrnn;
  * torch SDPA causal (``F.scaled_dot_product_attention(is_causal=True)``, [B, H, T, D]): the
    softmax-attention baseline.
  Gates (log decays, mLSTM pre-activations) are fp32 for every op; they get gradients
  (retention's fixed per-head decay does not, as in fla). No initial state, no final state.
  Times are ``triton.testing.do_bench`` medians (its warm-up excluded). "fwd" is the forward
  under ``torch.no_grad()``; "fwd+bwd" is the forward with autograd plus
  ``torch.autograd.grad(o, inputs, do)``. Peak memory comes from a separate call:
  ``max_memory_allocated`` after ``reset_peak_memory_stats``; the table shows the peak and the
  peak minus what was allocated before the call (the inputs and ``do``). First call: the first
  forward plus the first backward in a fresh process with an empty Triton cache
  (``TRITON_CACHE_DIR`` set to a new folder per op × mode × chunk size), so compilation and
  autotuning are included; for the second and later shapes of a worker it is that shape's first
  call (a new specialization may compile). Every op × mode × chunk size runs in its own
  subprocess, shape by shape, with ``--timeout`` seconds per shape; a crash (Triton compiler
  abort), timeout or exception becomes the row's status, and the remaining shapes run in a new
  subprocess.

Floor (DESIGN.md §4), per row: bytes = q, k, v read and o written in bf16 plus fp32 gates;
chunkwise forward FLOPs = B·T·H·[2L(K + V)·½ + 4·K·V] at the row's chunk size L (causal
attention for SDPA: B·H·T²·(K + V)); floor = max(bytes / BW, FLOPs / PEAK) with the
spec-sheet numbers in GPU_SPECS; "× floor" = forward time / floor.

(c) Output: the correctness table, then the benchmark table, then the issue's target ratios at
B=8, T=8192, H=16, K=V=256 (fwd+bwd, linrnn at its best chunk size and mode), and JSON at
benchmarks/results/<date>-<gpu>-engine.json (benchmarks/results/tmp/ with --quick). The exit
status is 1 when a correctness case or a linrnn benchmark row fails; peers never fail the run.

``--device cpu`` is a smoke test for machines without a GPU: backend torch (mode chunk only;
``--backend triton`` runs the Triton kernels under ``TRITON_INTERPRET=1``, where bf16 ``tl.dot``
is wrong on Triton 3.9), a tiny benchmark shape timed with ``time.perf_counter``, no peers.

Run time: the full benchmark is 51 worker processes (7 variants × 2 modes × 3 chunk sizes,
and 9 peers), each compiling from an empty cache; split it with ``--ops`` / ``--shapes`` /
``--skip-*`` (and ``--out``) to fit a time limit per command. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout without installing linrnn
    sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:  # its report module, also when imported by path
    sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from gpu_engine_report import (  # noqa: E402
    TARGETS,  # noqa: F401  (part of the script's interface: the targets it reports)
    bench_table,
    correctness_table,
    ratio_lines,
    target_ratios,
)

from linrnn.bench import flops, registry, report, timing, worker  # noqa: E402
from linrnn.bench import peers as bench_peers  # noqa: E402
from linrnn.bench.flops import gpu_spec  # noqa: E402
from linrnn.bench.peers import Peer, library_of  # noqa: E402, F401
from linrnn.bench.registry import parse_shape  # noqa: E402
from linrnn.bench.report import clean_json, slug  # noqa: E402
from linrnn.bench.worker import emit, worker_env  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------

TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}  # RMS-relative, vs fp64
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MODES = ("chunk", "fused_chunk")
REFERENCE_CALL = dict(mode="chunk", backend="torch")  # in float64
PREFIX_T = 32  # steps of the prefix whose final state is the checked initial state

# The long one: 32 chunks of 128 with two query tiles each, where a race in rows_kernel's
# normalizer (num_stages ≥ 2, fixed) showed up and the T=300 shapes passed.
CHECK_SHAPES = ("B2-T300-H3-K96-V80", "B2-T300-H2-K256-V256", "B1-T4096-H4-K128-V128")
QUICK_CHECK_SHAPES = ("B2-T100-H2-K32-V24",)
BENCH_SHAPES = (
    "B32-T2048-H16-K256-V256",
    "B8-T8192-H16-K256-V256",
    "B4-T16384-H16-K256-V256",
    "B8-T8192-H32-K128-V128",
)  # 65,536 tokens, H·K = 4096
QUICK_BENCH_SHAPE = "B2-T1024-H4-K128-V128"
CPU_BENCH_SHAPE = "B1-T128-H2-K32-V32"
TARGET_SHAPE = "B8-T8192-H16-K256-V256"  # the targets are quoted here
BENCH_DTYPE = "bf16"
# Spec-sheet numbers: linrnn.bench.flops.GPU_SPECS (NVIDIA datasheets).
GPU_SPECS = flops.GPU_SPECS
WORKER_COMMAND = (sys.executable, str(Path(__file__).resolve()), "--worker")

# linrnn variants with Triton kernels: name -> (selfcheck variant, extra options, gradient
# names of the gates), from linrnn.bench.registry.
LINRNN_OPS = {
    name: (op.variant, dict(op.options), op.grad_names)
    for name, op in registry.OPS.items()
    if op.triton
}
# Peers whose linrnn counterpart is one of LINRNN_OPS (linrnn.bench.peers.PEERS).
PEERS = {name: peer for name, peer in bench_peers.PEERS.items() if peer.like in LINRNN_OPS}
# Per-channel-decay ops (and their peers) run only with --vector or when --ops names them:
# fla's chunk_gla / chunk_rwkv6 take minutes to compile on their first call.
VECTOR_OPS = {"gla", "gla[gv]", "rwkv6"}
N_GATES = {  # fp32 [B, T, H] gate tensors read by the op (for the floor's bytes)
    name: registry.OPS[name].gate_elems(1, 1) for name in LINRNN_OPS
}


# ---------------------------------------------------------------------------------------------
# Small helpers shared by the parent and the workers
# ---------------------------------------------------------------------------------------------


def rel_err(a, b) -> float:
    """RMS-relative error ``‖a − b‖ / ‖b‖`` in fp64 (absolute when ``b`` is all zeros).

    The fp64 reference is first rounded to fp32, the engine's state dtype: a value below fp32's
    range (e.g. the initial normalizer state's gradient of an unnormalized mLSTM, which reaches
    it only through the whole sequence's decay, ~1e-87 at T=4096) is zero for any fp32 engine,
    and the torch engine in fp32 shows the same "error 1.0" there as the kernels did."""
    a, b = a.detach().double(), b.detach().float().double()
    diff = torch.linalg.vector_norm(a - b).item()
    ref = torch.linalg.vector_norm(b).item()
    return diff / ref if ref > 0 else diff


def state_parts(state) -> list:
    """The tensors of a state: a tensor, or a tuple such as (S, n) or (C, n, m)."""
    if state is None:
        return []
    return list(state) if isinstance(state, (tuple, list)) else [state]


# ---------------------------------------------------------------------------------------------
# Worker side: correctness (the benchmark itself is linrnn.bench.timing.bench_case)
# ---------------------------------------------------------------------------------------------


def linrnn_variant(name: str):
    """The :class:`linrnn.selfcheck.Variant` behind a linrnn op name, with its options."""
    return registry.selfcheck_variant(name)


def variant_inputs(name: str, shape: dict, seed: int, device):
    """Seeded fp32 inputs of a linrnn op (:func:`linrnn.bench.registry.make_inputs`)."""
    return registry.make_inputs(name, shape, seed, device)


@contextlib.contextmanager
def nan_poisoned_empty(enabled: bool = True):
    """Within the block, floating-point ``torch.empty``, ``torch.empty_like`` and
    ``Tensor.new_empty`` return NaN-filled memory (fla's test trick): an output element that
    a kernel never writes shows up as NaN instead of stale memory that may look right."""
    if not enabled:
        yield
        return
    originals = (torch.empty, torch.empty_like, torch.Tensor.new_empty)
    real_empty, real_empty_like, real_new_empty = originals

    def poison(t):
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        return t

    torch.empty = lambda *a, **kw: poison(real_empty(*a, **kw))
    torch.empty_like = lambda *a, **kw: poison(real_empty_like(*a, **kw))
    torch.Tensor.new_empty = lambda self, *a, **kw: poison(real_new_empty(self, *a, **kw))
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = originals


# --- correctness ---------------------------------------------------------------------------


def prefix_state(name: str, shape: dict, seed: int, device):
    """Final state (fp64 parts) of the op over a random ``PREFIX_T``-step prefix."""
    from linrnn.selfcheck import map_tensors, run

    args, kwargs = variant_inputs(name, dict(shape, T=PREFIX_T), seed + 1000, device)
    args, kwargs = map_tensors(args, kwargs, lambda x: x.double())
    _, state = run(linrnn_variant(name), args, kwargs, output_final_state=True, **REFERENCE_CALL)
    return state


def leaf_names(name: str, args, kwargs, state) -> list[str]:
    gate_names = list(LINRNN_OPS[name][2])
    gate_names += [f"arg{j}" for j in range(len(gate_names), len(args) - 3)]
    names = ["q", "k", "v", *gate_names[: len(args) - 3], *kwargs]
    return names + [f"h0[{j}]" for j in range(len(state_parts(state)))]


def loss_and_grads(call, leaves, cotangent_seed: int):
    """Run ``call()`` -> (o, state); returns (o, state parts, gradients of the loss
    ``(o·do).sum() + Σ (h_T·dh_T).sum()`` with fixed fp64 cotangents, None where unused)."""
    o, state = call()
    parts = state_parts(state)
    gen = torch.Generator(device=o.device).manual_seed(cotangent_seed)
    cot = lambda x: torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float64)  # noqa: E731
    loss = (o.double() * cot(o)).sum()
    for p in parts:
        loss = loss + (p.double() * cot(p)).sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return o.detach(), [p.detach() for p in parts], list(grads)


def with_leaves(args, kwargs, state, cast_input, cast_state):
    """Leaf copies (cast, requires_grad) of the inputs and the state; returns
    ``(args, kwargs, state, leaves)`` with the state rebuilt in its original structure."""
    leaf = lambda x, cast: cast(x).detach().clone().requires_grad_()  # noqa: E731
    args = tuple(leaf(x, cast_input) for x in args)
    kwargs = {n: leaf(x, cast_input) for n, x in kwargs.items()}
    parts = [leaf(x, cast_state) for x in state_parts(state)]
    new_state = tuple(parts) if isinstance(state, (tuple, list)) else (parts[0] if parts else None)
    return args, kwargs, new_state, [*args, *kwargs.values(), *parts]


def check_case(case: dict, item: dict) -> dict:
    """One correctness case: the tested call vs the fp64 torch chunk engine on the same inputs
    (rounded to the tested dtype; the initial state is fp32, the engine's state dtype)."""
    from linrnn.selfcheck import run

    name, device = case["op"], torch.device(case["device"])
    shape, dtype = parse_shape(item["shape"]), DTYPES[item["dtype"]]
    variant = linrnn_variant(name)
    args, kwargs = variant_inputs(name, shape, case["seed"], device)
    state0 = prefix_state(name, shape, case["seed"], device)
    names = leaf_names(name, args, kwargs, state0)
    # q, k, v in the tested dtype; gates stay fp32 (the engine's gate math is fp32 anyway, and a
    # 16-bit per-head parameter such as retention's log γ [H] overflows on its gradient: a sum
    # over B·T that easily exceeds fp16's 65504).
    to_dtype = lambda x: x.to(dtype) if x.dim() == 4 else x.float()  # noqa: E731
    t_args, t_kwargs, t_state, t_leaves = with_leaves(
        args, kwargs, state0, to_dtype, torch.Tensor.float
    )
    r_args, r_kwargs, r_state, r_leaves = with_leaves(
        t_args, t_kwargs, t_state, torch.Tensor.double, torch.Tensor.double
    )
    call_opts = dict(mode=case["mode"], backend=case["backend"], chunk_size=case["chunk"])

    def tested():
        return run(
            variant, t_args, t_kwargs, initial_state=t_state, output_final_state=True, **call_opts
        )

    def reference():
        return run(
            variant,
            r_args,
            r_kwargs,
            initial_state=r_state,
            output_final_state=True,
            **REFERENCE_CALL,
        )

    seed = case["seed"] + 7
    o_ref, s_ref, g_ref = loss_and_grads(reference, r_leaves, seed)
    emit({"event": "stage", "stage": "tested call"})
    with nan_poisoned_empty(case["poison"]):
        o, s, g = loss_and_grads(tested, t_leaves, seed)
    if o.dtype != dtype or o.shape != o_ref.shape:
        raise RuntimeError(f"output is {o.dtype} {tuple(o.shape)}, expected {dtype}")
    errors = {"o": rel_err(o, o_ref)}
    if len(s) != len(s_ref):
        raise RuntimeError(f"final state has {len(s)} tensors, expected {len(s_ref)}")
    errors.update({f"h_T[{j}]": rel_err(a, b) for j, (a, b) in enumerate(zip(s, s_ref))})
    for n, a, b in zip(names, g, g_ref):
        if a is None and b is None:
            continue
        if a is None or b is None:
            raise RuntimeError(f"gradient of {n} is {'missing' if a is None else 'unexpected'}")
        errors[f"d{n}"] = rel_err(a, b)
    return {"errors": errors}


def summarize_errors(errors: dict, tol: float) -> dict:
    """Row figures from the per-tensor errors: out, worst state, worst gradient, result."""
    worst = lambda keys: max((errors[k] for k in keys), default=0.0)  # noqa: E731
    state_keys = [k for k in errors if k.startswith("h_T")]
    grad_keys = [k for k in errors if k.startswith("d")]
    bad = [k for k, e in errors.items() if not (math.isfinite(e) and e <= tol)]
    worst_grad = max(
        grad_keys, key=lambda k: errors[k] if math.isfinite(errors[k]) else math.inf, default=None
    )
    return {
        "out_err": errors["o"],
        "state_err": worst(state_keys),
        "grad_err": worst(grad_keys),
        "worst_grad": worst_grad,
        "errors": errors,
        "status": "PASS" if not bad else "FAIL: " + ", ".join(bad),
    }


def bench_case(case: dict, item: dict) -> dict:
    """One benchmark row (:func:`linrnn.bench.timing.bench_case`, bf16 inputs)."""
    return timing.bench_case(dict(case, dtype=BENCH_DTYPE), item)


TASKS = {
    "check": check_case,
    "bench": bench_case,
    "info": report.info_case,
    "selftest": worker.selftest_case,
}


def _worker(case_json: str) -> int:
    return worker.serve(case_json, TASKS)


def run_items(case: dict, items: list, timeout: float, env: dict, verbose: bool) -> list:
    """:func:`linrnn.bench.worker.run_items` with this script as the worker."""
    return worker.run_items(case, items, timeout, env, verbose, command=WORKER_COMMAND)


# ---------------------------------------------------------------------------------------------
# Parent side: the two parts of the run
# ---------------------------------------------------------------------------------------------


def selected(op: str, wanted: list[str] | None, vector: bool = False) -> bool:
    """``--ops`` matches an op by name, library (linrnn, mlstm_kernels, fla, torch, peers),
    family prefix (``mlstm`` matches ``mlstm[exp]``) or peer kernel name. Vector-gate ops
    (:data:`VECTOR_OPS`) and their peers only with ``vector`` or when named or family-named;
    peers of the decode and varlen suites only when named (a library name would otherwise pull
    step kernels into a chunkwise comparison). A name that is itself an op (``gla``,
    ``linear_attn``) selects that op alone, not its bracketed variants (``gla[gv]``): a
    family prefix selects variants only when no op bears it (``mlstm``)."""
    lib = library_of(op)

    def family(name):
        base = name.split("[")[0]
        return base if base != name and base not in LINRNN_OPS else name

    tags = {op, lib, family(op), family(op.split(":")[-1])}
    like = PEERS[op].like if op in PEERS else op
    if op in PEERS and PEERS[op].kind != "ops":  # decode/varlen peers: only when named
        return bool(wanted) and op in wanted
    if like in VECTOR_OPS and not vector:
        return bool(wanted) and bool({op, like, family(like)} & set(wanted))
    if not wanted:
        return True
    if lib != "linrnn":
        tags.add("peers")
    return bool(tags & set(wanted))


def modes_for(args) -> list[str]:
    chosen = args.modes or MODES
    return [m for m in chosen if args.backend == "triton" or m == "chunk"]


def run_correctness(args, flush=lambda rows: None) -> list[dict]:
    """Correctness rows: one subprocess per op × mode × check chunk size, ``--jobs`` at once.
    ``flush(rows so far)`` runs after each case, so a run cut short keeps what it measured."""
    ops = [op for op in LINRNN_OPS if selected(op, args.ops, args.vector)]
    items = [{"shape": s, "dtype": d} for s in args.check_shapes for d in DTYPES]
    cases = [
        dict(
            task="check",
            op=op,
            mode=mode,
            backend=args.backend,
            chunk=chunk,
            device=args.device,
            seed=args.seed,
            poison=not args.no_poison,
            threads=args.threads,
        )
        for op in ops
        for mode in modes_for(args)
        for chunk in args.check_chunk_sizes
    ]

    def one(case):
        t0 = time.perf_counter()
        rows = run_items(case, items, args.timeout, worker_env(), args.verbose)
        out = []
        for item, row in zip(items, rows):
            full = {k: case[k] for k in ("op", "mode", "backend", "chunk")}
            full.update(item, tol=TOLERANCE[item["dtype"]])
            if "errors" in row:
                full.update(summarize_errors(row["errors"], full["tol"]))
            else:
                full.update(row)
            out.append(full)
        bad = sum(not r["status"].startswith("PASS") for r in out)
        print(
            f"  check {case['op']} {case['mode']} L={case['chunk'] or 'default'}: "
            f"{len(out) - bad}/{len(out)} pass, {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        return out

    done = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for rows in pool.map(one, cases):
            done.extend(rows)
            flush(done)
    return done


def bench_cases(args) -> list[dict]:
    common = dict(
        task="bench",
        device=args.device,
        backend=args.backend,
        seed=args.seed,
        warmup_ms=args.warmup_ms,
        rep_ms=args.rep_ms,
        cpu_repeats=args.cpu_repeats,
        threads=args.threads,
        fresh_triton_cache=True,
    )
    cases = [
        dict(common, op=op, mode=mode, chunk=chunk)
        for op in LINRNN_OPS
        if selected(op, args.ops, args.vector)
        for mode in modes_for(args)
        for chunk in args.chunk_sizes
    ]
    if args.device == "cuda":
        cases += [
            dict(common, op=op, mode=None, chunk=peer.chunk)
            for op, peer in PEERS.items()
            if selected(op, args.ops, args.vector)
        ]
    return cases


def run_benchmarks(args, specs, flush=lambda rows: None) -> list[dict]:
    """Benchmark rows, one subprocess per op × mode × chunk size (and one more after each
    crash), one after another, each with a fresh Triton cache; shapes in order within it.
    ``flush(rows so far)`` runs after each case."""
    items = [{"shape": s} for s in args.shapes]
    rows = []
    for case in bench_cases(args):
        t0 = time.perf_counter()
        cache = tempfile.mkdtemp(prefix="gpu_engine_triton_cache_")
        try:
            results = run_items(case, items, args.timeout, worker_env(cache), args.verbose)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        library = library_of(case["op"])
        for item, row in zip(items, results):
            full = {k: case[k] for k in ("op", "mode", "chunk")}
            full.update(library=library, shape=item["shape"], dtype=BENCH_DTYPE)
            full["backend"] = case["backend"] if library == "linrnn" else None
            full["note"] = PEERS[case["op"]].note if library != "linrnn" else ""
            full.update(row)
            full.update(floor(full, specs))
            rows.append(full)
        flush(rows)
        print(
            f"  bench {case['op']} {case['mode'] or ''} L={case['chunk']}: "
            f"{[r['status'] for r in rows[-len(items) :]]}, {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Floor, machine, tables, ratios
# ---------------------------------------------------------------------------------------------


def floor_counts(op: str, shape: dict, chunk: int | None) -> tuple[float, float]:
    """(bytes, FLOPs) of one forward: q, k, v read and o written in bf16 plus fp32 gates
    (:func:`linrnn.bench.flops.min_bytes`); chunkwise FLOPs B·T·H·[2L(K+V)·½ + 4·K·V]
    (:func:`~linrnn.bench.flops.chunkwise_flops_leading`), causal attention B·H·T²·(K+V)
    for SDPA (:func:`~linrnn.bench.flops.attention_flops`)."""
    B, T, H, K, V = (shape[d] for d in "BTHKV")
    like = op if op in LINRNN_OPS else PEERS[op].like
    n_bytes = flops.min_bytes(B, T, H, K, V, elt=2, gate_elems=N_GATES[like])
    if op == "torch:sdpa_causal":
        return n_bytes, flops.attention_flops(B, T, H, K, V)
    if chunk is None:  # a step/recurrent peer: 4·K·V per token and head
        return n_bytes, 4.0 * B * T * H * K * V
    return n_bytes, flops.chunkwise_flops_leading(B, T, H, K, V, chunk)


def floor(row: dict, specs: dict | None) -> dict:
    n_bytes, flops = floor_counts(row["op"], parse_shape(row["shape"]), row["chunk"])
    out = {"floor_bytes": n_bytes, "floor_flops": flops}
    if specs:
        floor_ms = 1e3 * max(n_bytes / specs["bandwidth_Bps"], flops / specs["bf16_dense_flops"])
        out["floor_ms"] = floor_ms
        if row.get("fwd_ms"):
            out["x_floor"] = row["fwd_ms"] / floor_ms
    return out


def machine_info(args) -> dict:
    case = dict(task="info", device=args.device)
    (row,) = run_items(case, [{"what": "info"}], args.timeout, worker_env(), args.verbose)
    return report.machine_info(row, args.device, args.commit)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse_args(argv):
    names = [*LINRNN_OPS, *PEERS]
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: smoke test with backend torch, mode chunk, no peers",
    )
    p.add_argument(
        "--backend",
        choices=("triton", "torch"),
        help="linrnn backend (default: triton on cuda, torch on cpu)",
    )
    p.add_argument(
        "--ops", nargs="+", metavar="OP", help=f"subset by name, library or family prefix: {names}"
    )
    p.add_argument(
        "--shapes",
        nargs="+",
        metavar="ID",
        help=f"benchmark shapes (default {list(BENCH_SHAPES)}; any B..-T..-H..-K..-V..)",
    )
    p.add_argument(
        "--check-shapes",
        nargs="+",
        metavar="ID",
        help=f"correctness shapes (default {list(CHECK_SHAPES)})",
    )
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument(
        "--check-chunk-sizes",
        type=int,
        nargs="+",
        help="chunk sizes of the correctness cases (default: the engine's default)",
    )
    p.add_argument(
        "--vector",
        action="store_true",
        help=f"also the per-channel-decay ops {sorted(VECTOR_OPS)} and their fla peers",
    )
    p.add_argument("--skip-correctness", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--modes", nargs="+", choices=MODES, default=None, help="linrnn modes (both)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"one small shape for each part ({QUICK_BENCH_SHAPE}, "
        f"{QUICK_CHECK_SHAPES[0]}), results under benchmarks/results/tmp/",
    )
    p.add_argument("--timeout", type=float, default=300, help="seconds per worker item (300)")
    p.add_argument("--jobs", type=int, default=4, help="correctness workers at once (4)")
    p.add_argument("--threads", type=int, help="torch threads per worker (cpu)")
    p.add_argument("--warmup-ms", type=float, default=25, help="do_bench warm-up (25)")
    p.add_argument("--rep-ms", type=float, default=100, help="do_bench repetition time (100)")
    p.add_argument("--cpu-repeats", type=int, default=5, help="timed calls on cpu (5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-poison", action="store_true", help="no NaN-filled torch.empty")
    p.add_argument("--commit", help="git commit to record (the GPU copy may lack .git)")
    p.add_argument("--out", type=Path, help="JSON path")
    p.add_argument("--verbose", action="store_true", help="echo the workers' output")
    p.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    args.backend = args.backend or ("triton" if args.device == "cuda" else "torch")
    if args.shapes is None:
        if args.device == "cpu":
            args.shapes = [CPU_BENCH_SHAPE]
        else:
            args.shapes = [QUICK_BENCH_SHAPE] if args.quick else list(BENCH_SHAPES)
    if args.check_shapes is None:
        args.check_shapes = list(QUICK_CHECK_SHAPES if args.quick else CHECK_SHAPES)
    args.check_chunk_sizes = args.check_chunk_sizes or [None]
    for shape_id in [*args.shapes, *args.check_shapes]:
        try:
            parse_shape(shape_id)
        except ValueError as exc:
            p.error(str(exc))
    if min([*args.chunk_sizes, *filter(None, args.check_chunk_sizes), args.jobs]) < 1:
        p.error("--chunk-sizes, --check-chunk-sizes and --jobs must be ≥ 1")
    tokens = {
        tag
        for op in names
        for tag in (op, library_of(op), op.split("[")[0], op.split(":")[-1].split("[")[0])
    } | {"peers"}
    unknown = set(args.ops or ()) - tokens
    if unknown:
        p.error(f"unknown --ops {sorted(unknown)}; choose from {sorted(tokens)}")
    return args


def print_header(args, machine) -> None:
    who = machine.get("gpu") or "CPU"
    print(
        f"{who} | driver {machine.get('driver')} | torch {machine.get('torch')} "
        f"(CUDA {machine.get('cuda_runtime')}) | Triton {machine.get('triton')} | "
        f"fla-core {machine.get('fla-core')} | mlstm-kernels {machine.get('mlstm-kernels')}"
    )
    print(
        f"commit {machine['git_commit']} | {machine['date']} | backend {args.backend}, "
        f"modes {modes_for(args)}"
        + ("" if args.backend == "triton" else " (fused_chunk is Triton only)")
    )
    if args.device == "cpu":
        print(
            "cpu smoke mode: peers skipped (they need CUDA), times from time.perf_counter, "
            "no memory figures (backend triton needs TRITON_INTERPRET=1)"
        )


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return _worker(args.worker)
    machine = machine_info(args)
    if args.device == "cuda" and not machine.get("cuda_available"):
        why = machine.get("status", "torch.cuda.is_available() is False")
        print(f"no CUDA device ({why}); use --device cpu for the smoke test", file=sys.stderr)
        return 2
    print_header(args, machine)
    specs = gpu_spec(machine.get("gpu")) if args.device == "cuda" else None
    rows = {"check": [], "bench": []}

    def write(kind=None, done=None):
        """Write the report with what is measured so far (after every case, and at the end)."""
        if kind:
            rows[kind] = list(done)
        return write_report(
            args, argv, machine, specs, rows["check"], rows["bench"], complete=kind is None
        )

    check_rows = [] if args.skip_correctness else run_correctness(args, lambda d: write("check", d))
    bench_rows = [] if args.skip_bench else run_benchmarks(args, specs, lambda d: write("bench", d))
    rows.update(check=check_rows, bench=bench_rows)
    out, failed_checks, failed_bench, ratios, target = write()
    if check_rows:
        print(f"\ncorrectness vs fp64 torch chunk engine, RMS-relative error, tol {TOLERANCE}")
        print(correctness_table(check_rows))
    if bench_rows:
        spec_text = (
            f"floor from {specs['matched']} spec sheet: {specs['bandwidth_Bps'] / 1e12:g}"
            f" TB/s, {specs['bf16_dense_flops'] / 1e12:g} TFLOP/s bf16 dense"
            if specs
            else "no floor (unknown device)"
        )
        print(
            f"\nbenchmark, {BENCH_DTYPE}, medians in ms; peak = fwd+bwd call; first s = "
            f"first fwd+bwd call incl. compile (* = not the first shape in its process); "
            f"× floor = fwd / floor; {spec_text}"
        )
        print(bench_table(bench_rows))
    if ratios:
        print(f"\nissue 3 targets (time ratio = linrnn / peer; < 1: linrnn faster) at {target}:")
        print("\n".join(ratio_lines(ratios)))

    print(
        f"\n{len(check_rows) - len(failed_checks)}/{len(check_rows)} correctness cases pass; "
        f"{len(failed_bench)} linrnn benchmark rows not ok; wrote {out}"
    )
    return 1 if failed_checks or failed_bench else 0


def write_report(args, argv, machine, specs, check_rows, bench_rows, complete=False):
    """Write the JSON report; returns (path, failed checks, failed linrnn rows, ratios,
    target shape)."""
    target = TARGET_SHAPE if TARGET_SHAPE in args.shapes else args.shapes[0]
    ratios = target_ratios(bench_rows, target) if bench_rows else []
    failed_checks = [r for r in check_rows if not r["status"].startswith("PASS")]
    failed_bench = [r for r in bench_rows if r["library"] == "linrnn" and r["status"] != "ok"]
    date = machine["date"][:10]
    default_out = (
        ROOT
        / "benchmarks"
        / "results"
        / (f"{'tmp/' if args.quick else ''}{date}-{slug(machine.get('gpu'))}-engine.json")
    )
    out = args.out or default_out
    report = {
        "benchmark": "gpu_engine",
        "complete": complete,  # False while running (rewritten after every case)
        "machine": machine,
        "command": shlex.join([sys.executable, *sys.argv])
        if argv is None
        else shlex.join(["benchmarks/gpu_engine.py", *argv]),
        "config": {k: v for k, v in vars(args).items() if k not in ("worker", "out")},
        "tolerance": TOLERANCE,
        "gpu_spec": specs,
        "correctness": check_rows,
        "bench": bench_rows,
        "target_shape": target,
        "ratios": ratios,
        "failures": {"correctness": len(failed_checks), "linrnn_bench": len(failed_bench)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(clean_json(report), indent=1, default=str) + "\n")
    return out, failed_checks, failed_bench, ratios, target


if __name__ == "__main__":
    sys.exit(main())
