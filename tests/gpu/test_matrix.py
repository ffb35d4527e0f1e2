"""The GPU correctness matrix: every linrnn op with Triton kernels × its modes with kernels
(chunk, fused_chunk; the delta rule: chunk, recurrent) × dtype (bf16, fp16, fp32) against
float64, through the public API only.

Each case runs the op with ``backend="triton"`` on seeded random inputs (the bench's recipe,
:func:`linrnn.bench.registry.make_inputs`; q, k, v in the tested dtype, gates fp32), from an
initial state (the op's final state over a 32-step random prefix, fp32) with
``output_final_state=True``. The output, every final-state tensor and the gradients of q, k,
v, the gates and every initial-state tensor of ``(o·do).sum() + Σ (h_T·dh_T).sum()`` (fixed
random cotangents) are compared with the same inputs in float64 on the PyTorch path: the
step-by-step reference (``mode="reference"``) on the short shapes, the chunk engine
(``mode="chunk"``, exact up to fp64 rounding, checked against the reference by the CPU suite)
on the long one. Error: RMS-relative ``‖a − b‖ / ‖b‖``; a case passes when every error is at
most TOLERANCE[dtype]. The shapes: T = 300 is no multiple of any chunk size, K = 96 and V = 80
no powers of two; K = V = 256 spans several tiles, and T = 4096 (32 chunks of 128, two query
tiles each) is where a race between pipeline stages showed up that short shapes missed.

    pytest tests/gpu/test_matrix.py -q        # worst errors at the end

Compiling the kernels of 180 cases one after another takes longer than running them: the cases
run in LINRNN_GPU_JOBS worker processes (default: one per CPU core, at most 8), a fresh one per
op × mode × dtype, on the visible GPUs in turn, and the tests report their results. Every
floating-point ``torch.empty``, ``empty_like`` and ``new_empty`` in a worker returns NaN-filled
memory, so an element a kernel forgets to write shows up.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

from linrnn.bench import registry
from linrnn.selfcheck import run

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton on CPU tensors: interpreter only")  # fmt: skip

TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}
# Gradients that are exactly a sum over batch and time of another leaf's per-token gradient
# (Mamba2: Δ = softplus(dt + dt_bias), so d(dt_bias)_h = Σ_{b,t} d(dt)_{b,t,h}). Their terms
# cancel, so their size says little about their rounding: each per-token term carries the
# per-token error, and B·T of them add up to about that error times the terms' root sum of
# squares. Their error is taken relative to that yardstick, per head (the terms themselves are
# checked as the other leaf's gradient, relative to their own size).
SUMMED_GRADS = {"mamba2": {"ddt_bias": "ddt"}}
# One shape per tile table (config.head_tiles: head dims ≤ 64, ≤ 128, larger).
SHAPES = ("B2-T300-H3-K64-V48", "B2-T300-H3-K96-V80", "B1-T4096-H2-K256-V256")
GROUPED_SHAPES = (
    "B2-T300-H3-HV6-K64-V48",
    "B2-T300-H3-HV6-K96-V80",
    "B1-T4096-H2-K256-V256",
)  # grouped value heads
# Mamba2 also as it is used: one B/C group of 8 heads, N = 128, P = 64, enough chunks that the
# kernels for large groups serve several heads per program.
EXTRA_SHAPES = {"mamba2": ("B4-T4096-H1-HV8-K128-V64",)}
# Every op × each of its modes with Triton kernels (chunk and fused_chunk; the delta rule's
# chunk and recurrent).
OP_MODES = [(name, mode) for name, op in registry.OPS.items() for mode in op.kernel_modes()]


def shapes_of(op: str) -> tuple:
    """The shapes one op runs at: the grouped or plain pair, and its extra shapes."""
    return (GROUPED_SHAPES if registry.OPS[op].grouped else SHAPES) + EXTRA_SHAPES.get(op, ())


CASES = [(name, mode, dtype, shape) for name, mode in OP_MODES for dtype in TOLERANCE
         for shape in shapes_of(name)]  # fmt: skip
PREFIX_T = 32  # steps of the prefix whose final state is the initial state
REFERENCE_MAX_T = 512  # longer shapes take the fp64 chunk engine (the loop would take seconds)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """RMS-relative error in fp64 (absolute when ``b`` is all zeros). The fp64 reference is
    rounded to fp32 first, the engine's state dtype: a value below fp32's range (an unnormalized
    mLSTM's initial-normalizer gradient reaches ~1e-87 at T = 4096) is zero for any fp32 engine."""
    a, b = a.detach().double(), b.detach().float().double()
    ref = torch.linalg.vector_norm(b).item()
    diff = torch.linalg.vector_norm(a - b).item()
    return diff / ref if ref > 0 else diff


def state_parts(state) -> list:
    if state is None:
        return []
    return list(state) if isinstance(state, (tuple, list)) else [state]


def reference_call(T: int) -> dict:
    mode = "reference" if T <= REFERENCE_MAX_T else "chunk"
    return dict(backend="torch", mode=mode)


def loss_and_grads(call, leaves, seed: int):
    """``call() -> (o, state)``; returns the output, the state's parts and the gradients of
    ``(o·do).sum() + Σ (h_T·dh_T).sum()`` with fixed fp64 cotangents (None where unused)."""
    o, state = call()
    parts = state_parts(state)
    gen = torch.Generator(device=o.device).manual_seed(seed)
    cot = lambda x: torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float64)  # noqa: E731
    loss = (o.double() * cot(o)).sum()
    for p in parts:
        loss = loss + (p.double() * cot(p)).sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return o.detach(), [p.detach() for p in parts], list(grads)


def leaves_of(args, kwargs, state, cast_qkv, cast_rest):
    """Leaf copies of the inputs (q, k, v through ``cast_qkv``, gates and state parts through
    ``cast_rest``): ``(args, kwargs, state, leaves)``."""
    leaf = lambda x, cast: cast(x).detach().clone().requires_grad_()  # noqa: E731
    args = tuple(leaf(x, cast_qkv if j < 3 else cast_rest) for j, x in enumerate(args))
    kwargs = {n: leaf(x, cast_rest) for n, x in kwargs.items()}
    parts = [leaf(x, cast_rest) for x in state_parts(state)]
    state = tuple(parts) if isinstance(state, (tuple, list)) else (parts[0] if parts else None)
    return args, kwargs, state, [*args, *kwargs.values(), *parts]


def leaf_names(op: str, n_args: int, kwargs: dict, n_state: int) -> list[str]:
    gates = list(registry.OPS[op].grad_names)
    gates += [f"arg{j}" for j in range(len(gates) + 3, n_args)]
    return ["q", "k", "v", *gates[: n_args - 3], *kwargs, *(f"h0[{j}]" for j in range(n_state))]


@functools.cache
def inputs(op: str, shape_id: str, seed: int, device: str):
    """Seeded fp32 inputs and the fp64 initial state of ``op`` at ``shape_id``."""
    shape = registry.parse_shape(shape_id)
    args, kwargs = registry.make_inputs(op, shape, seed, torch.device(device))
    p_args, p_kwargs = registry.make_inputs(op, dict(shape, T=PREFIX_T), seed + 1000, device)
    to64 = lambda x: x.double()  # noqa: E731
    variant = registry.selfcheck_variant(op)
    p_args, p_kwargs = tuple(map(to64, p_args)), {n: to64(x) for n, x in p_kwargs.items()}
    with torch.no_grad():
        _, state = run(variant, p_args, p_kwargs, output_final_state=True, backend="torch",
                       mode="reference")  # fmt: skip
    return args, kwargs, state


@functools.cache
def reference(op: str, shape_id: str, dtype: str, seed: int, device: str):
    """The fp64 output, final state and gradients for inputs rounded to ``dtype``."""
    args, kwargs, state = inputs(op, shape_id, seed, device)
    rounded = lambda x: x.to(registry.DTYPES[dtype]).double()  # noqa: E731
    r_args, r_kwargs, r_state, r_leaves = leaves_of(
        args, kwargs, state, rounded, lambda x: x.float().double()
    )
    variant = registry.selfcheck_variant(op)
    T = registry.parse_shape(shape_id)["T"]
    call = lambda: run(variant, r_args, r_kwargs, initial_state=r_state,  # noqa: E731
                       output_final_state=True, **reference_call(T))  # fmt: skip
    return loss_and_grads(call, r_leaves, seed + 7)


def matrix_errors(op: str, mode: str, dtype: str, shape_id: str, device: str = "cuda",
                  seed: int = 0) -> dict[str, float]:  # fmt: skip
    """Errors of one case (module doc): ``{"o": ..., "h_T[j]": ..., "d<leaf>": ...}``."""
    args, kwargs, state = inputs(op, shape_id, seed, device)
    t_args, t_kwargs, t_state, t_leaves = leaves_of(
        args, kwargs, state, lambda x: x.to(registry.DTYPES[dtype]), torch.Tensor.float
    )
    variant = registry.selfcheck_variant(op)
    call = lambda: run(variant, t_args, t_kwargs, initial_state=t_state,  # noqa: E731
                       output_final_state=True, mode=mode, backend="triton")  # fmt: skip
    o, s, g = loss_and_grads(call, t_leaves, seed + 7)
    o_ref, s_ref, g_ref = reference(op, shape_id, dtype, seed, device)
    assert o.dtype == registry.DTYPES[dtype] and o.shape == o_ref.shape
    assert len(s) == len(s_ref), f"final state has {len(s)} tensors, expected {len(s_ref)}"
    errors = {"o": rel_err(o, o_ref)}
    errors.update({f"h_T[{j}]": rel_err(a, b) for j, (a, b) in enumerate(zip(s, s_ref))})
    names = leaf_names(op, len(args), kwargs, len(s))
    ref_of = {}
    for name, a, b in zip(names, g, g_ref, strict=True):
        assert (a is None) == (b is None), f"gradient of {name}: {a is None=} {b is None=}"
        if a is not None:
            errors[f"d{name}"] = rel_err(a, b)
            ref_of[f"d{name}"] = (a, b)
    for name, terms in SUMMED_GRADS.get(op, {}).items():
        a, b = ref_of[name]
        per_token = ref_of[terms][1].detach().double()  # [B, T, H]
        yardstick = per_token.flatten(0, 1).square().sum(0).sqrt()  # [H]
        diff = a.detach().double() - b.detach().float().double()
        errors[name] = (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(yardstick)).item()
    return errors


@contextlib.contextmanager
def nan_poisoned_empty():
    """Within the block, floating-point ``torch.empty``, ``empty_like`` and ``new_empty``
    return NaN-filled memory."""
    originals = (torch.empty, torch.empty_like, torch.Tensor.new_empty)
    empty, empty_like, new_empty = originals

    def poison(t):
        return t.fill_(float("nan")) if t.dtype.is_floating_point else t

    torch.empty = lambda *a, **kw: poison(empty(*a, **kw))
    torch.empty_like = lambda *a, **kw: poison(empty_like(*a, **kw))
    torch.Tensor.new_empty = lambda self, *a, **kw: poison(new_empty(self, *a, **kw))
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = originals


def task_errors(op: str, mode: str, dtype: str, device: str = "cuda") -> dict:
    """Every shape of one op × mode × dtype: ``{shape: errors, or the exception as text}``,
    and the seconds it took under ``"seconds"``."""
    t0 = time.perf_counter()
    if device.startswith("cuda:"):
        torch.cuda.set_device(device)  # Triton launches on the current device
    out: dict = {}
    for shape in shapes_of(op):
        try:
            with nan_poisoned_empty():
                out[shape] = matrix_errors(op, mode, dtype, shape, device)
        except Exception as exc:  # the test reports it
            out[shape] = f"{type(exc).__name__}: {exc}"
        if device == "cuda":
            torch.cuda.empty_cache()  # the workers share the GPU
    out["seconds"] = time.perf_counter() - t0
    return out


@pytest.fixture(scope="module")
def results(request) -> dict:
    """``{(op, mode, dtype, shape): errors or error text}`` of every selected case (``-k``
    selects), from the workers."""
    jobs = int(os.environ.get("LINRNN_GPU_JOBS", min(8, os.cpu_count() or 1)))
    selected = {tuple(item.callspec.params[n] for n in ("op", "mode", "dtype"))
                for item in request.session.items
                if item.originalname == "test_matches_fp64"}  # fmt: skip
    tasks = [(op, mode, dtype) for op, mode in OP_MODES for dtype in TOLERANCE
             if (op, mode, dtype) in selected]  # fmt: skip
    gpus = max(torch.cuda.device_count(), 1)  # the tasks take the visible GPUs in turn
    spawn = multiprocessing.get_context("spawn")  # CUDA in the workers, none in this process
    # A fresh process per task (Python ≥ 3.11): a CUDA error (an illegal address) poisons its
    # process's contexts, and must fail its own cases only.
    fresh = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=spawn, **fresh) as pool:
        futures = {task: pool.submit(task_errors, *task, f"cuda:{j % gpus}")
                   for j, task in enumerate(tasks)}  # fmt: skip
        out = {}
        t0 = time.perf_counter()
        for task, future in futures.items():
            try:
                by_shape = future.result()
            except Exception as exc:  # a worker died: its cases fail
                by_shape = {shape: f"worker: {type(exc).__name__}: {exc}"
                            for shape in shapes_of(task[0])}  # fmt: skip
            seconds = by_shape.pop("seconds", float("nan"))
            print(f"matrix {' '.join(task)}: {seconds:.0f} s (done at "
                  f"{time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
            out.update({(*task, shape): r for shape, r in by_shape.items()})
    return out


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("op", "mode", "dtype", "shape"), CASES)
def test_matches_fp64(op, mode, dtype, shape, results, worst_errors):
    errors = results[(op, mode, dtype, shape)]
    assert isinstance(errors, dict), errors
    worst_errors("matrix", f"{op} {mode} {dtype} (tol {TOLERANCE[dtype]:g})", errors)
    bad = {n: e for n, e in errors.items() if not e <= TOLERANCE[dtype]}
    assert not bad, f"errors over {TOLERANCE[dtype]:g}: {bad}"


@interpreter
def test_helpers_on_cpu(worst_errors):
    """The case's machinery under the interpreter, fp32 at a tiny shape (every tensor checked)
    and the error itself: zero for equal tensors, the relative norm otherwise."""
    with nan_poisoned_empty():
        errors = matrix_errors("mlstm[exp]", "chunk", "fp32", "B1-T40-H2-K16-V8", device="cpu")
    assert set(errors) == {"o", "h_T[0]", "h_T[1]", "h_T[2]", "dq", "dk", "dv", "di", "df",
                           "dh0[0]", "dh0[1]", "dh0[2]"}  # fmt: skip
    assert max(errors.values()) <= TOLERANCE["fp32"], errors
    b = torch.randn(100).double()  # fp32 values: the reference side is rounded to fp32
    assert rel_err(b, b) == 0 and rel_err(b * 1.01, b) == pytest.approx(0.01, rel=1e-5)
