"""GPU check and benchmark of the Triton chunkwise engine (issue 3), with its peers side by side.

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
import dataclasses
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import queue
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout without installing linrnn
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------

TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}  # RMS-relative, vs fp64
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MODES = ("chunk", "fused_chunk")
REFERENCE_CALL = dict(mode="chunk", backend="torch")  # in float64
PREFIX_T = 32  # steps of the prefix whose final state is the checked initial state

CHECK_SHAPES = ("B2-T300-H3-K96-V80", "B2-T300-H2-K256-V256")
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

# Spec-sheet numbers (NVIDIA H100 / H200 datasheets): HBM bandwidth in B/s and dense
# (no sparsity) BF16 tensor-core throughput in FLOP/s. Matched in order against the device
# name, so "H100" (SXM5) comes after the PCIe and NVL variants.
GPU_SPECS = (
    ("H200", 4.8e12, 989e12),
    ("H100 NVL", 3.9e12, 835e12),
    ("H100 PCIe", 2.0e12, 756e12),
    ("H100", 3.35e12, 989e12),
)

MARK = "@@gpu_engine@@ "  # prefix of the worker's event lines on stdout

# linrnn variants: name -> (selfcheck variant, extra options, gradient names of the gates)
LINRNN_OPS = {
    "linear_attn": ("linear_attn", {}, ()),
    "linear_attn[normalize]": ("linear_attn[normalize]", {}, ()),
    "retention": ("retention", {}, ("log_gamma",)),
    "simple_gla": ("simple_gla", {}, ("g",)),
    "mlstm[sigmoid]": ("mlstm[sigmoid]", {}, ("i", "f")),
    "mlstm[sigmoid,normalize]": ("mlstm[sigmoid]", {"normalize": True}, ("i", "f")),
    "mlstm[exp]": ("mlstm[exp]", {}, ("i", "f")),
}


@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer op: the linrnn variant it matches (its inputs), its chunk size, and a note."""

    library: str
    like: str  # linrnn op whose inputs and floor it shares
    chunk: int | None
    note: str = ""


PEERS = {
    "mlstm_kernels:triton_xl_chunk_siging": Peer(
        "mlstm_kernels", "mlstm[sigmoid]", 128, "normalize=False; [B,H,T,D]"
    ),
    "mlstm_kernels:triton_xl_chunk_siging[normalize]": Peer(
        "mlstm_kernels", "mlstm[sigmoid,normalize]", 128, "normalize=True (default); [B,H,T,D]"
    ),
    "mlstm_kernels:triton_xl_chunk": Peer("mlstm_kernels", "mlstm[exp]", 128, "[B,H,T,D]"),
    "mlstm_kernels:triton_limit_chunk": Peer("mlstm_kernels", "mlstm[exp]", 64, "[B,H,T,D]"),
    "fla:chunk_simple_gla": Peer("fla", "simple_gla", 64),
    "fla:chunk_retention": Peer("fla", "retention", 64),
    "fla:chunk_linear_attn": Peer("fla", "linear_attn", 64, "normalize=False"),
    "fla:chunk_linear_attn[normalize]": Peer("fla", "linear_attn[normalize]", 64),
    "torch:sdpa_causal": Peer("torch", "linear_attn", None, "softmax baseline; [B,H,T,D]"),
}
N_GATES = {  # fp32 [B, T, H] gate tensors read by the op (for the floor's bytes)
    "linear_attn": 0,
    "linear_attn[normalize]": 0,
    "retention": 0,
    "simple_gla": 1,
    "mlstm[sigmoid]": 2,
    "mlstm[sigmoid,normalize]": 2,
    "mlstm[exp]": 2,
}

# The targets: (label, linrnn ops, peer ops; the fastest peer that ran is used)
TARGETS = (
    (
        "mLSTM-sig",
        ("mlstm[sigmoid,normalize]",),
        ("mlstm_kernels:triton_xl_chunk_siging[normalize]",),
    ),
    ("mLSTM-sig, no normalizer", ("mlstm[sigmoid]",), ("mlstm_kernels:triton_xl_chunk_siging",)),
    (
        "mLSTM-exp",
        ("mlstm[exp]",),
        ("mlstm_kernels:triton_xl_chunk", "mlstm_kernels:triton_limit_chunk"),
    ),
    ("simple GLA", ("simple_gla",), ("fla:chunk_simple_gla",)),
    ("linear attention", ("linear_attn",), ("fla:chunk_linear_attn",)),
)


# ---------------------------------------------------------------------------------------------
# Small helpers shared by the parent and the workers
# ---------------------------------------------------------------------------------------------


def parse_shape(shape_id: str) -> dict:
    """``"B8-T8192-H16-K256-V256"`` -> ``{"B": 8, "T": 8192, "H": 16, "K": 256, "V": 256}``."""
    m = re.fullmatch(r"B(\d+)-T(\d+)-H(\d+)-K(\d+)-V(\d+)", shape_id)
    if not m or min(map(int, m.groups())) < 1:
        raise ValueError(f"shape {shape_id!r} is not of the form B8-T8192-H16-K256-V256")
    return dict(zip("BTHKV", map(int, m.groups())))


def rel_err(a, b) -> float:
    """RMS-relative error ``‖a − b‖ / ‖b‖`` in fp64 (absolute when ``b`` is all zeros)."""
    a, b = a.detach().double(), b.detach().double()
    diff = torch.linalg.vector_norm(a - b).item()
    ref = torch.linalg.vector_norm(b).item()
    return diff / ref if ref > 0 else diff


def state_parts(state) -> list:
    """The tensors of a state: a tensor, or a tuple such as (S, n) or (C, n, m)."""
    if state is None:
        return []
    return list(state) if isinstance(state, (tuple, list)) else [state]


def short_error(exc: BaseException) -> str:
    """The first line of ``Type: message`` (the row's status)."""
    lines = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__


def error_detail(exc: BaseException) -> str:
    """The whole exception text (kept in the JSON), at most 2000 characters."""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]


def ms(value) -> str:
    return "—" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


# ---------------------------------------------------------------------------------------------
# Worker side: input recipes, op builders, checks and timings (runs in a subprocess)
# ---------------------------------------------------------------------------------------------


def emit(event: dict) -> None:
    """One event line for the parent (the only stdout lines it reads)."""
    print(MARK + json.dumps(event), flush=True)


def linrnn_variant(name: str):
    """The :class:`linrnn.selfcheck.Variant` behind a linrnn op name, with its options."""
    from linrnn.selfcheck import VARIANTS

    base, extra, _ = LINRNN_OPS[name]
    variant = next(v for v in VARIANTS if v.name == base)
    return dataclasses.replace(variant, name=name, options={**variant.options, **extra})


def variant_inputs(name: str, shape: dict, seed: int, device):
    """Seeded fp32 inputs of a linrnn op (the self-check's recipe) on ``device``:
    ``(args, kwargs)`` with q, k, v first. q, k, v come from a device generator (fast for the
    benchmark shapes); the gates from the self-check's CPU recipe."""
    import torch.nn.functional as F

    variant = linrnn_variant(name)
    B, T, H, K, V = (shape[d] for d in "BTHKV")
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, device=device, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, device=device, generator=gen)
    if variant.positive_qk:
        q, k = F.elu(q) + 1, F.elu(k) + 1
    gates, tensor_kwargs = variant.make(torch.Generator().manual_seed(seed + 1), B, T, H, K, V)
    move = lambda x: x.to(device)  # noqa: E731
    return (q, k, v, *map(move, gates)), {n: move(x) for n, x in tensor_kwargs.items()}


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


# --- benchmark builders: each returns (leaves, fwd) with fwd() -> o ---------------------------


def bf16_inputs(case: dict, shape: dict):
    """The benchmark inputs of the linrnn op that ``case["op"]`` is or matches: q, k, v in
    bf16, gates fp32; ``(args, kwargs, gradient mask over args)``."""
    like = case["op"] if case["op"] in LINRNN_OPS else PEERS[case["op"]].like
    args, kwargs = variant_inputs(like, shape, case["seed"], torch.device(case["device"]))
    dtype = DTYPES[BENCH_DTYPE]
    args = (*(x.to(dtype) for x in args[:3]), *args[3:])
    needs_grad = [like != "retention" or j < 3 for j in range(len(args))]
    args = tuple(x.requires_grad_(n) for x, n in zip(args, needs_grad))
    return args, kwargs, needs_grad


def build_linrnn(case: dict, shape: dict):
    from linrnn.selfcheck import run

    args, kwargs, needs_grad = bf16_inputs(case, shape)
    variant = linrnn_variant(case["op"])
    opts = dict(mode=case["mode"], backend=case["backend"], chunk_size=case["chunk"])
    leaves = [x for x, n in zip(args, needs_grad) if n]
    return leaves, lambda: run(variant, args, kwargs, **opts)[0]


def head_first(x):
    """[B, T, H, ...] -> [B, H, T, ...], contiguous, as a new leaf (done before timing)."""
    return x.detach().transpose(1, 2).contiguous().requires_grad_(x.requires_grad)


def build_mlstm_kernels(case: dict, shape: dict):
    (q, k, v, i, f), _, _ = bf16_inputs(case, shape)
    kernel = case["op"].split(":")[1].split("[")[0]
    if kernel == "triton_xl_chunk_siging":
        from mlstm_kernels.torch.chunkwise.triton_xl_chunk_siging import (
            mlstm_siging_chunkwise__xl_chunk as fn,
        )

        extra = {"normalize": case["op"].endswith("[normalize]")}
    elif kernel == "triton_xl_chunk":
        from mlstm_kernels.torch.chunkwise.triton_xl_chunk import mlstm_chunkwise__xl_chunk as fn

        extra = {}
    else:
        from mlstm_kernels.torch.chunkwise.triton_limit_chunk import (
            mlstm_chunkwise__limit_chunk as fn,
        )

        extra = {}
    leaves = [head_first(x) for x in (q, k, v, i, f)]
    chunk = PEERS[case["op"]].chunk
    return leaves, lambda: fn(*leaves, chunk_size=chunk, return_last_states=False, **extra)


def build_fla(case: dict, shape: dict):
    args, _, needs_grad = bf16_inputs(case, shape)
    leaves = [x for x, n in zip(args, needs_grad) if n]
    op = case["op"].split(":")[1]
    if op == "chunk_simple_gla":
        from fla.ops.simple_gla import chunk_simple_gla

        q, k, v, g = args
        return leaves, lambda: chunk_simple_gla(q, k, v, g=g)[0]
    if op == "chunk_retention":
        from fla.ops.retention import chunk_retention

        q, k, v, _ = args  # fla makes the same per-head decays itself
        return leaves, lambda: chunk_retention(q, k, v)[0]
    from fla.ops.linear_attn import chunk_linear_attn

    q, k, v = args
    normalize = op.endswith("[normalize]")
    return leaves, lambda: chunk_linear_attn(q, k, v, normalize=normalize)[0]


def build_sdpa(case: dict, shape: dict):
    import torch.nn.functional as F

    (q, k, v), _, _ = bf16_inputs(case, shape)
    q, k, v = map(head_first, (q, k, v))
    return [q, k, v], lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


BUILDERS = {
    "linrnn": build_linrnn,
    "mlstm_kernels": build_mlstm_kernels,
    "fla": build_fla,
    "torch": build_sdpa,
}


def library_of(op: str) -> str:
    return "linrnn" if op in LINRNN_OPS else PEERS[op].library


# --- benchmark measurements -------------------------------------------------------------------


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    """Seconds of one call, synchronized."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def median_ms(fn, case: dict, device) -> float:
    """Median time of ``fn`` in ms: ``triton.testing.do_bench`` on CUDA (its warm-up
    excluded), else ``time.perf_counter`` over ``cpu_repeats`` calls after one warm-up."""
    if device.type == "cuda":
        import triton.testing

        return float(
            triton.testing.do_bench(
                fn, warmup=case["warmup_ms"], rep=case["rep_ms"], return_mode="median"
            )
        )
    fn()
    return 1e3 * statistics.median(timed(fn, device) for _ in range(case["cpu_repeats"]))


def peak_mib(fn, device) -> tuple[float | None, float | None]:
    """``(peak, peak − allocated before the call)`` in MiB for one call of ``fn`` (CUDA)."""
    if device.type != "cuda":
        return None, None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return peak / 2**20, (peak - before) / 2**20


def bench_case(case: dict, item: dict) -> dict:
    """Figures for one op × mode × chunk size × shape. A stage that raises ends the row (a
    backward that raises still leaves the forward to time); the figures measured before it
    are kept, and the exception becomes the status."""
    row: dict = {"status": "ok"}
    where = {"stage": "inputs"}

    def stage(name: str) -> None:
        where["stage"] = name
        emit({"event": "stage", "stage": name})

    try:
        bench_stages(case, parse_shape(item["shape"]), row, stage)
    except Exception as exc:
        traceback.print_exc()
        row["status"] = f"error ({where['stage']}): {short_error(exc)}"
        row["error_detail"] = error_detail(exc)
    return row


def bench_stages(case: dict, shape: dict, row: dict, stage) -> None:
    device = torch.device(case["device"])
    stage("inputs")
    leaves, fwd = BUILDERS[library_of(case["op"])](case, shape)
    sync(device)
    if device.type == "cuda":
        row["inputs_mib"] = torch.cuda.memory_allocated(device) / 2**20

    stage("first forward")  # with autograd, as in training; its graph feeds the first backward
    sync(device)
    t0 = time.perf_counter()
    o = fwd()
    sync(device)
    row["first_fwd_s"] = time.perf_counter() - t0
    do = torch.randn_like(o.detach())

    def fwd_bwd():
        torch.autograd.grad(fwd(), leaves, do)

    def fwd_nograd():
        with torch.no_grad():
            fwd()

    stage("first backward")
    try:
        row["first_bwd_s"] = timed(partial(torch.autograd.grad, o, leaves, do), device)
        row["first_call_s"] = row["first_fwd_s"] + row["first_bwd_s"]
    except Exception as exc:  # e.g. fla's simple-GLA backward on Triton < 3.7.1
        traceback.print_exc()
        row["status"] = f"error (first backward): {short_error(exc)}"
        row["error_detail"] = error_detail(exc)
    del o  # the first call's graph

    stage("timing forward")
    row["fwd_ms"] = median_ms(fwd_nograd, case, device)
    row["peak_fwd_mib"], row["extra_fwd_mib"] = peak_mib(fwd_nograd, device)
    if row["status"] == "ok":
        stage("timing forward+backward")
        row["fwdbwd_ms"] = median_ms(fwd_bwd, case, device)
        row["peak_fwdbwd_mib"], row["extra_fwdbwd_mib"] = peak_mib(fwd_bwd, device)


# --- worker entry point ---------------------------------------------------------------------


def info_case(case: dict, item: dict) -> dict:
    """Versions and the device as the worker sees them (the parent never touches CUDA)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # CPU machines may lack it
        triton_version = None
    info = {
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda_runtime": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "python": platform.python_version(),
    }
    for dist in ("fla-core", "mlstm-kernels"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = None
    if torch.cuda.is_available() and case["device"] == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
        )
    return info


def selftest_case(case: dict, item: dict) -> dict:
    """Failure modes on demand, for the test of the subprocess handling (item ``do``: ok,
    raise, abort, sleep)."""
    emit({"event": "stage", "stage": "first forward"})
    if item["do"] == "raise":
        raise RuntimeError("raised on purpose")
    if item["do"] == "abort":
        os.kill(os.getpid(), signal.SIGABRT)  # as Triton's compiler does
    if item["do"] == "sleep":
        time.sleep(3600)
    return {"status": "ok"}


TASKS = {"check": check_case, "bench": bench_case, "info": info_case, "selftest": selftest_case}


def _worker(case_json: str) -> int:
    """Run every item of one case, emitting ``start``, ``stage`` and ``row`` events. An
    exception fails its item only; a crash of the process is handled by the parent."""
    case = json.loads(case_json)
    if case.get("threads"):
        torch.set_num_threads(case["threads"])
    if case.get("fresh_triton_cache"):  # compile from scratch: first calls include it
        base = os.environ.get("TRITON_CACHE_DIR") or tempfile.gettempdir()
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_cache_", dir=base)
    task = TASKS[case["task"]]
    for index, item in enumerate(case["items"]):
        emit({"event": "start", "item": item})
        try:
            row = task(case, item)
        except Exception as exc:  # the item's status; the worker goes on to the next one
            traceback.print_exc()
            row = {"status": f"error: {short_error(exc)}", "error_detail": error_detail(exc)}
        row["first_in_process"] = index == 0
        emit({"event": "row", "item": item, "row": row})
        if case["device"] == "cuda":
            torch.cuda.empty_cache()
    return 0


# ---------------------------------------------------------------------------------------------
# Parent side: subprocess management
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Launch:
    """What one worker process reported before it ended."""

    rows: list  # (item, row) pairs
    current: dict | None = None  # the item in progress when the process ended
    stage: str | None = None
    stage_elapsed_s: float | None = None
    item_elapsed_s: float | None = None
    failure: str | None = None  # status for ``current`` (None: clean exit)
    stderr_tail: str = ""


def _read_lines(stream, sink: queue.Queue) -> None:
    for line in stream:
        sink.put(line)
    sink.put(None)


def _exit_status(rc: int, stderr_tail: str) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "?"
        return f"aborted: signal {-rc} ({name})"
    last = next((ln for ln in reversed(stderr_tail.splitlines()) if ln.strip()), "")
    return f"error: exit {rc}: {last.strip()[:200]}"


def launch(case: dict, timeout: float, env: dict, verbose: bool) -> Launch:
    """Run the worker on ``case`` until it exits, crashes or spends ``timeout`` seconds on one
    item (or on starting up); the process group is killed on timeout."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(case)]
    result = Launch(rows=[])
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        lines: queue.Queue = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
        reader.start()
        now = time.monotonic()
        deadline, item_t0, stage_t0 = now + timeout, now, now
        timed_out = False
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the worker's own process group
                break
            if line is None:
                break
            if not line.startswith(MARK):
                if verbose:
                    print(f"    | {line.rstrip()}", file=sys.stderr)
                continue
            event = json.loads(line[len(MARK) :])
            now = time.monotonic()
            if event["event"] == "start":
                result.current, result.stage = event["item"], "startup"
                deadline, item_t0, stage_t0 = now + timeout, now, now
            elif event["event"] == "stage":
                result.stage, stage_t0 = event["stage"], now
            elif event["event"] == "row":
                result.rows.append((event["item"], event["row"]))
                result.current = result.stage = None
                deadline = now + timeout
        rc = proc.wait()
        reader.join(timeout=5)
        end = time.monotonic()
        err.seek(0)
        result.stderr_tail = err.read()[-4000:]
    if verbose and result.stderr_tail.strip():
        print(result.stderr_tail, file=sys.stderr)
    if timed_out:
        result.failure = f"timeout ({timeout:g} s)"
    elif rc != 0:
        result.failure = _exit_status(rc, result.stderr_tail)
    if result.failure:
        result.stage_elapsed_s = end - stage_t0
        result.item_elapsed_s = end - item_t0
    return result


def item_key(item: dict) -> str:
    return json.dumps(item, sort_keys=True)


def failure_row(launch_result: Launch) -> dict:
    where = f" in {launch_result.stage}" if launch_result.stage else " at startup"
    status = f"{launch_result.failure}{where} after {launch_result.stage_elapsed_s:.1f} s"
    row = {"status": status, "died_after_s": launch_result.item_elapsed_s}
    row["stderr_tail"] = launch_result.stderr_tail[-1500:]  # e.g. the compiler's last words
    if launch_result.stage in ("first forward", "first backward"):
        row["first_call_s_at_least"] = launch_result.item_elapsed_s  # compile never finished
    return row


def run_items(case: dict, items: list, timeout: float, env: dict, verbose: bool) -> list:
    """Rows for every item of ``case``; after a crash, the item in progress gets the crash as
    its status and the remaining items run in a new process."""
    rows: dict = {}
    pending = list(items)
    while pending:
        res = launch(dict(case, items=pending), timeout, env, verbose)
        rows.update((item_key(item), row) for item, row in res.rows)
        if res.failure is None:
            break
        if res.current is None:  # died outside any item: the rest cannot run either
            for item in pending:
                rows.setdefault(item_key(item), failure_row(res))
            break
        rows[item_key(res.current)] = failure_row(res)
        pending = [it for it in pending if item_key(it) not in rows]
    missing = {"status": "error: the worker returned no result"}
    return [rows.get(item_key(item), missing) for item in items]


def worker_env(cache_dir: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if cache_dir:
        env["TRITON_CACHE_DIR"] = cache_dir
    return env


# ---------------------------------------------------------------------------------------------
# Parent side: the two parts of the run
# ---------------------------------------------------------------------------------------------


def selected(op: str, wanted: list[str] | None) -> bool:
    """``--ops`` matches an op by name, library (linrnn, mlstm_kernels, fla, torch, peers),
    family prefix (``mlstm`` matches ``mlstm[exp]``) or peer kernel name."""
    if not wanted:
        return True
    lib = library_of(op)
    tags = {op, lib, op.split("[")[0], op.split(":")[-1].split("[")[0]}
    if lib != "linrnn":
        tags.add("peers")
    return bool(tags & set(wanted))


def modes_for(args) -> list[str]:
    chosen = args.modes or MODES
    return [m for m in chosen if args.backend == "triton" or m == "chunk"]


def run_correctness(args, flush=lambda rows: None) -> list[dict]:
    """Correctness rows: one subprocess per op × mode × check chunk size, ``--jobs`` at once.
    ``flush(rows so far)`` runs after each case, so a run cut short keeps what it measured."""
    ops = [op for op in LINRNN_OPS if selected(op, args.ops)]
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
        if selected(op, args.ops)
        for mode in modes_for(args)
        for chunk in args.chunk_sizes
    ]
    if args.device == "cuda":
        cases += [
            dict(common, op=op, mode=None, chunk=peer.chunk)
            for op, peer in PEERS.items()
            if selected(op, args.ops)
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


def gpu_spec(name: str | None) -> dict | None:
    for key, bw, peak in GPU_SPECS:
        if name and key.lower() in name.lower():
            return {
                "matched": key,
                "bandwidth_Bps": bw,
                "bf16_dense_flops": peak,
                "source": "NVIDIA datasheet (spec sheet, not measured)",
            }
    return None


def floor_counts(op: str, shape: dict, chunk: int | None) -> tuple[float, float]:
    """(bytes, FLOPs) of one forward: q, k, v read and o written in bf16 plus fp32 gates;
    chunkwise FLOPs B·T·H·[2L(K+V)·½ + 4·K·V], causal attention B·H·T²·(K+V) for SDPA."""
    B, T, H, K, V = (shape[d] for d in "BTHKV")
    like = op if op in LINRNN_OPS else PEERS[op].like
    n_bytes = 2 * B * T * H * (2 * K + 2 * V) + 4 * B * T * H * N_GATES[like]
    if op == "torch:sdpa_causal":
        return n_bytes, B * H * T * T * (K + V)
    return n_bytes, B * T * H * (2 * chunk * (K + V) * 0.5 + 4 * K * V)


def floor(row: dict, specs: dict | None) -> dict:
    n_bytes, flops = floor_counts(row["op"], parse_shape(row["shape"]), row["chunk"])
    out = {"floor_bytes": n_bytes, "floor_flops": flops}
    if specs:
        floor_ms = 1e3 * max(n_bytes / specs["bandwidth_Bps"], flops / specs["bf16_dense_flops"])
        out["floor_ms"] = floor_ms
        if row.get("fwd_ms"):
            out["x_floor"] = row["fwd_ms"] / floor_ms
    return out


def git_commit(override: str | None) -> tuple[str | None, bool | None]:
    if override:
        return override, None

    def git(*cmd):
        try:
            out = subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "HEAD"), None if status is None else bool(status)


def driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


def machine_info(args) -> dict:
    case = dict(task="info", device=args.device)
    (row,) = run_items(case, [{"what": "info"}], args.timeout, worker_env(), args.verbose)
    row.pop("first_in_process", None)
    commit, dirty = git_commit(args.commit)
    return {
        **row,
        "device": args.device,
        "gpu": row.get("gpu") if args.device == "cuda" else None,
        "driver": driver_version() if args.device == "cuda" else None,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "git_commit": commit,
        "git_dirty": dirty,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def slug(text: str | None) -> str:
    text = re.sub(r"^nvidia\s+", "", (text or "cpu").strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def format_table(header, rows, numeric, width: int = 100) -> str:
    """Aligned plain text; columns flagged in ``numeric`` are right-aligned; cells are cut at
    ``width`` characters (the JSON keeps the full text)."""
    cut = lambda c: c if len(c) <= width else c[: width - 1] + "…"  # noqa: E731
    rows = [[cut(str(c)) for c in r] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(  # noqa: E731
        c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric)
    ).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def correctness_table(rows: list[dict]) -> str:
    header = (
        "op",
        "mode",
        "L",
        "dtype",
        "shape",
        "out err",
        "state err",
        "grad err (worst)",
        "tol",
        "result",
    )
    e = lambda x: "—" if x is None else f"{x:.2e}"  # noqa: E731
    body = [
        (
            r["op"],
            r["mode"],
            r["chunk"] or "def",
            r["dtype"],
            r["shape"],
            e(r.get("out_err")),
            e(r.get("state_err")),
            f"{e(r.get('grad_err'))} ({r.get('worst_grad') or '—'})" if "grad_err" in r else "—",
            f"{r['tol']:g}",
            r["status"],
        )
        for r in rows
    ]
    return format_table(header, body, (0, 0, 1, 0, 0, 1, 1, 1, 1, 0))


def bench_table(rows: list[dict]) -> str:
    header = (
        "op",
        "mode",
        "L",
        "shape",
        "fwd ms",
        "fwd+bwd ms",
        "peak MiB",
        "over inputs",
        "first s",
        "× floor",
        "status",
    )

    def first(r):
        if r.get("first_call_s") is not None:
            return f"{r['first_call_s']:.1f}" + ("" if r.get("first_in_process") else "*")
        if r.get("first_call_s_at_least") is not None:
            return f">{r['first_call_s_at_least']:.1f}"
        return "—"

    mib = lambda x: "—" if x is None else f"{x:.0f}"  # noqa: E731
    body = [
        (
            r["op"],
            r["mode"] if r["library"] == "linrnn" else "",
            r["chunk"] or "",
            r["shape"],
            ms(r.get("fwd_ms")),
            ms(r.get("fwdbwd_ms")),
            mib(r.get("peak_fwdbwd_mib")),
            mib(r.get("extra_fwdbwd_mib")),
            first(r),
            f"{r['x_floor']:.1f}" if r.get("x_floor") else "—",
            r["status"],
        )
        for r in rows
    ]
    return format_table(header, body, (0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0))


def best_row(rows, ops, shape, key):
    cands = [r for r in rows if r["op"] in ops and r["shape"] == shape and r.get(key)]
    return min(cands, key=lambda r: r[key]) if cands else None


def target_ratios(rows: list[dict], shape: str) -> list[dict]:
    """The issue's comparisons at ``shape``: linrnn's best chunk size and mode vs the fastest
    peer that ran, fwd+bwd (and fwd), with peak memory."""
    out = []
    for label, ours, peers in TARGETS:
        entry = {"target": label, "shape": shape}
        for key, tag in (("fwdbwd_ms", "fwdbwd"), ("fwd_ms", "fwd")):
            a, b = best_row(rows, ours, shape, key), best_row(rows, peers, shape, key)
            if a:
                entry[f"linrnn_{tag}"] = {
                    "op": a["op"],
                    "mode": a["mode"],
                    "chunk": a["chunk"],
                    "ms": a[key],
                    "peak_mib": a.get(f"peak_{tag}_mib"),
                }
            if b:
                entry[f"peer_{tag}"] = {
                    "op": b["op"],
                    "ms": b[key],
                    "peak_mib": b.get(f"peak_{tag}_mib"),
                }
            if a and b:
                entry[f"{tag}_time_ratio"] = a[key] / b[key]
                pa, pb = a.get(f"peak_{tag}_mib"), b.get(f"peak_{tag}_mib")
                entry[f"{tag}_peak_ratio"] = pa / pb if pa and pb else None
        why = [
            f"{r['op']}: {r['status']}"
            for r in rows
            if r["op"] in (*ours, *peers) and r["shape"] == shape and r["status"] != "ok"
        ]
        entry["not_ok"] = why
        out.append(entry)
    return out


def ratio_lines(ratios: list[dict]) -> list[str]:
    lines = []
    for e in ratios:
        head = f"{e['target']} @ {e['shape']}, fwd+bwd: "
        a, b = e.get("linrnn_fwdbwd"), e.get("peer_fwdbwd")
        if a and b:
            r = e["fwdbwd_time_ratio"]
            text = (
                f"linrnn {a['op']} {a['mode']} L={a['chunk']} {ms(a['ms'])} ms vs "
                f"{b['op']} {ms(b['ms'])} ms → time ratio {r:.2f} "
                + (f"(linrnn {1 / r:.2f}× faster)" if r < 1 else f"(linrnn {r:.2f}× slower)")
            )
            if e.get("fwdbwd_peak_ratio"):
                text += (
                    f"; peak {a['peak_mib']:.0f} vs {b['peak_mib']:.0f} MiB "
                    f"(ratio {e['fwdbwd_peak_ratio']:.2f})"
                )
        else:
            missing = [n for n, x in (("linrnn", a), ("peer", b)) if not x]
            text = f"n/a (no fwd+bwd figure for {' and '.join(missing)})"
        if "fwd_time_ratio" in e:
            text += f" | fwd ratio {e['fwd_time_ratio']:.2f}"
        lines.append(head + text)
        lines += [f"    not ok: {w}" for w in e["not_ok"]]
    return lines


def clean_json(x):
    """Non-finite floats as strings ("nan", "inf"): the JSON stays standard."""
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    if isinstance(x, dict):
        return {k: clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_json(v) for v in x]
    return x


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
