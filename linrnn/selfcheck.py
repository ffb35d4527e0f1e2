"""``python -m linrnn selfcheck``: every family and torch mode, fp32, against the fp64 reference.

For each family variant (:data:`VARIANTS`) and each mode in :data:`MODES`, seeded random fp32
inputs run through the op, and the output and final state are compared with the same inputs
in float64 under ``mode="reference"``. The error is RMS-relative, ``‖a − b‖ / ‖b‖``; a row fails
when it exceeds the tolerance (1e-4 by default, ample for fp32 against fp64) or is not finite.

:data:`VARIANTS` and :func:`make_inputs` are also the input recipe of the benchmarks.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

import linrnn

MODES = ("chunk", "parallel", "recurrent")
DEFAULT_SHAPE = dict(B=2, T=200, H=2, K=32, V=24)  # T on purpose not a multiple of the chunk
DEFAULT_TOL = 1e-4


@dataclass(frozen=True)
class Variant:
    """One family configuration. ``make(gen, B, T, H, K, V)`` returns the positional tensor
    arguments of ``op`` after q, k, v (the gates) and any tensor keyword arguments."""

    name: str
    family: str
    op: Callable
    make: Callable[..., tuple[tuple[Tensor, ...], dict[str, Tensor]]]
    options: dict = field(default_factory=dict)  # fixed keyword arguments
    positive_qk: bool = False  # feature-mapped q, k (for the sum normalizer)


# Data-dependent log decays are logsigmoid(x) / DECAY_NORMALIZER, as GLA's layers make them
# (normalizer τ = 16; about −0.05 per step). A normalizer of 1 gives strong decays (−0.8 per
# step, e^−51 over 64 steps), which the chunk engine handles on its exact log-space path.
DECAY_NORMALIZER = 16.0


def _log_decay(gen, *shape, normalizer=DECAY_NORMALIZER) -> Tensor:
    return F.logsigmoid(torch.randn(*shape, generator=gen)) / normalizer  # ≤ 0


# Gate makers: (gen, B, T, H, K, V, normalizer) -> (positional gates after q, k, v; tensor
# keyword args).
def _no_gates(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    return (), {}


def _retention(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    return (torch.log(1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float32))),), {}


def _simple_gla(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    return (_log_decay(gen, B, T, H, normalizer=normalizer),), {}


def _gla(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    return (_log_decay(gen, B, T, H, K, normalizer=normalizer),), {}


def _gla_gv(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    gk = _log_decay(gen, B, T, H, K, normalizer=normalizer)
    return (gk,), {"gv": _log_decay(gen, B, T, H, V, normalizer=normalizer)}


def _rwkv6(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    w = _log_decay(gen, B, T, H, K, normalizer=normalizer)
    return (w, torch.randn(H, K, generator=gen)), {}


def _mlstm(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    i = torch.randn(B, T, H, generator=gen)
    f = torch.randn(B, T, H, generator=gen) + 3
    return (i, f), {}


# The delta rule: β = sigmoid(randn) in (0, 1), as a layer's sigmoid projection makes it; q and
# k are normalized inside the op (the variants' use_qk_l2norm=True), so the recurrence is
# non-expansive (β|k|² ≤ 2).
def _delta_rule(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    return (torch.sigmoid(torch.randn(B, T, H, generator=gen)),), {}


def _gated_delta_rule(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    g = _log_decay(gen, B, T, H, normalizer=normalizer)
    return (g, torch.sigmoid(torch.randn(B, T, H, generator=gen))), {}


# Mamba2 (docs/DESIGN.md §11), with mamba_ssm's Mamba2 initialization: A = −exp(A_log), A_log =
# log U[1, 16]; dt_bias = softplus⁻¹(dt₀), dt₀ log-uniform in [1e-3, 1e-1] per head; the
# pre-activation dt per token and head such that Δ = softplus(dt + dt_bias) is log-uniform in
# [1e-3, 1e-1] (log decays Δ·A in [−1.6, −1e-3]); D standard normal. K = N (B and C: k and q),
# V = P (x: v); the gates are [B, T, H] and [H] per value head.
MAMBA2_DT_RANGE = (1e-3, 1e-1)
MAMBA2_A_RANGE = (1.0, 16.0)


def _log_uniform(gen, *shape, lo: float, hi: float) -> Tensor:
    u = torch.rand(*shape, generator=gen, dtype=torch.float64)
    return torch.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * u)


def _inverse_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))  # softplus(y + log(1 − e^−y)) = y


def _mamba2(gen, B, T, H, K, V, normalizer=DECAY_NORMALIZER):
    A = -torch.empty(H, dtype=torch.float64).uniform_(*MAMBA2_A_RANGE, generator=gen)
    dt_bias = _inverse_softplus(_log_uniform(gen, H, lo=MAMBA2_DT_RANGE[0], hi=MAMBA2_DT_RANGE[1]))
    delta = _log_uniform(gen, B, T, H, lo=MAMBA2_DT_RANGE[0], hi=MAMBA2_DT_RANGE[1])
    dt = _inverse_softplus(delta) - dt_bias
    D = torch.randn(H, generator=gen, dtype=torch.float64)
    return tuple(x.float() for x in (dt, A, D, dt_bias)), {}


def mamba2_qkv(q, k, v, dt, A, D, dt_bias, **kwargs):
    """:func:`linrnn.mamba2` with the argument order of the other families: C = q, B = k (q
    and k may have fewer heads than v: the groups), x = v, then the gates dt, A, D, dt_bias."""
    return linrnn.mamba2(v, dt, A, k, q, D=D, dt_bias=dt_bias, **kwargs)


VARIANTS: tuple[Variant, ...] = (
    Variant("linear_attn", "linear_attn", linrnn.linear_attn, _no_gates),
    Variant("linear_attn[normalize]", "linear_attn", linrnn.linear_attn, _no_gates,
            options={"normalize": True}, positive_qk=True),
    Variant("retention", "retention", linrnn.retention, _retention),
    Variant("simple_gla", "simple_gla", linrnn.simple_gla, _simple_gla),
    Variant("gla", "gla", linrnn.gla, _gla),
    Variant("gla[gv]", "gla", linrnn.gla, _gla_gv),
    Variant("rwkv6", "rwkv6", linrnn.rwkv6, _rwkv6),
    Variant("mlstm[exp]", "mlstm", linrnn.mlstm, _mlstm, options={"input_gate": "exp"}),
    Variant("mlstm[sigmoid]", "mlstm", linrnn.mlstm, _mlstm, options={"input_gate": "sigmoid"}),
    Variant("delta_rule", "delta_rule", linrnn.delta_rule, _delta_rule,
            options={"use_qk_l2norm": True}),
    Variant("gated_delta_rule", "gated_delta_rule", linrnn.gated_delta_rule, _gated_delta_rule,
            options={"use_qk_l2norm": True}),
    Variant("mamba2", "mamba2", mamba2_qkv, _mamba2, options={"dt_softplus": True}),
)  # fmt: skip


def make_inputs(variant: Variant, B, T, H, K, V, *, seed: int = 0, normalizer=DECAY_NORMALIZER):
    """Seeded fp32 inputs for ``variant``: ``(args, kwargs)`` with q, k, v first in args;
    data-dependent log decays are ``logsigmoid(randn) / normalizer``."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    if variant.positive_qk:
        q, k = F.elu(q) + 1, F.elu(k) + 1
    gates, tensor_kwargs = variant.make(gen, B, T, H, K, V, normalizer)
    return (q, k, v, *gates), tensor_kwargs


def map_tensors(args, kwargs, fn):
    """Apply ``fn`` to every tensor of ``(args, kwargs)``."""
    f = lambda x: fn(x) if isinstance(x, Tensor) else x  # noqa: E731
    return tuple(map(f, args)), {key: f(val) for key, val in kwargs.items()}


def run(variant: Variant, args, kwargs, **call_kwargs):
    """Call the op with its fixed options; returns ``(o, final_state)``."""
    return variant.op(*args, **kwargs, **variant.options, **call_kwargs)


def rel_err(a: Tensor, b: Tensor) -> float:
    """RMS-relative error ``‖a − b‖ / ‖b‖`` in fp64 (absolute when ``b`` is all zeros)."""
    a, b = a.double(), b.double()
    diff = torch.linalg.vector_norm(a - b).item()
    ref = torch.linalg.vector_norm(b).item()
    return diff / ref if ref > 0 else diff


def _state_parts(state) -> list[Tensor]:
    return list(state) if isinstance(state, (tuple, list)) else [state]


def state_err(a, b) -> float:
    """Largest :func:`rel_err` over the parts of a (possibly tuple) state."""
    return max(rel_err(x, y) for x, y in zip(_state_parts(a), _state_parts(b), strict=True))


@dataclass
class Row:
    variant: str
    mode: str
    out_err: float = float("nan")
    state_err: float = float("nan")
    ms: float = float("nan")
    error: str | None = None  # exception text when the call raised

    def passed(self, tol: float) -> bool:
        return self.error is None and self.out_err <= tol and self.state_err <= tol


def check_variant(
    variant: Variant, shape: dict, seed: int, repeats: int, device: str = "cpu"
) -> list[Row]:
    """Rows for one variant: each mode in fp32 on ``device`` against the fp64 CPU reference."""
    args, kwargs = make_inputs(variant, **shape, seed=seed)
    args64, kwargs64 = map_tensors(args, kwargs, lambda x: x.double())
    args, kwargs = map_tensors(args, kwargs, lambda x: x.to(device))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    try:
        o_ref, s_ref = run(variant, args64, kwargs64, mode="reference", output_final_state=True)
    except Exception as exc:  # every row of this variant fails, the other variants still run
        traceback.print_exc()
        reason = f"fp64 reference: {type(exc).__name__}: {exc}".splitlines()[0]
        return [Row(variant.name, mode, error=reason) for mode in MODES]
    rows = []
    for mode in MODES:
        row = Row(variant.name, mode)
        try:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                o, s = run(variant, args, kwargs, mode=mode, output_final_state=True)
                sync()
                times.append(time.perf_counter() - t0)
            row.ms = 1e3 * min(times)
            if o.device.type != torch.device(device).type:
                raise RuntimeError(f"output on {o.device}, inputs on {device}")
            o, s = o.cpu(), [x.cpu() for x in _state_parts(s)]
            row.out_err, row.state_err = rel_err(o, o_ref), state_err(s, s_ref)
        except Exception as exc:  # report the failure in the table, keep checking the rest
            row.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            traceback.print_exc()
        rows.append(row)
    return rows


def machine_line() -> str:
    try:
        import triton

        triton_info = f"Triton {triton.__version__} importable"
    except Exception as exc:  # ImportError, or a broken install
        triton_info = f"Triton not importable ({type(exc).__name__})"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (
        f"linrnn {linrnn.__version__} | torch {torch.__version__} | Python "
        f"{platform.python_version()} | {os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
        f"threads | CUDA GPU: {gpu} | {triton_info}"
    )


def format_table(rows: list[Row], tol: float) -> str:
    header = ("family", "mode", "out err", "state err", "ms", "result")
    lines = []
    for r in rows:
        result = "PASS" if r.passed(tol) else ("ERROR" if r.error else "FAIL")
        lines.append(
            (r.variant, r.mode, f"{r.out_err:.2e}", f"{r.state_err:.2e}", f"{r.ms:.1f}", result)
        )
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    right = (False, False, True, True, True, False)  # numbers right-aligned
    fmt = lambda cells: "  ".join(  # noqa: E731
        c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)
    ).rstrip()
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, lines)])


def positive_int(text: str) -> int:
    """argparse type: an int ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    parser.add_argument(
        "--device", default="cpu", help="device of the checked calls, e.g. cuda (default cpu)"
    )
    parser.add_argument(
        "--tol", type=float, default=DEFAULT_TOL, help=f"error tolerance (default {DEFAULT_TOL})"
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="timed calls per row, best reported (default 3)",
    )
    meaning = dict(B="batch", T="sequence length", H="heads", K="key dim", V="value dim")
    for dim, size in DEFAULT_SHAPE.items():
        parser.add_argument(
            f"-{dim}", type=positive_int, default=size, help=f"{meaning[dim]} ({size})"
        )


def main(args: argparse.Namespace) -> int:
    """Run the self-check, print the table; 0 if every row passes, else 1."""
    shape = {dim: getattr(args, dim) for dim in DEFAULT_SHAPE}
    print(machine_line())
    print(
        f"self-check on {args.device}: fp32 mode vs fp64 mode='reference' on CPU, "
        "error = ‖a−b‖/‖b‖, "
        f"tolerance {args.tol:g}, shape "
        + ", ".join(f"{d}={n}" for d, n in shape.items())
        + f"; ms = best of {args.repeats} calls"
    )
    rows = [
        row
        for v in VARIANTS
        for row in check_variant(v, shape, args.seed, args.repeats, args.device)
    ]
    print(format_table(rows, args.tol))
    failed = [r for r in rows if not r.passed(args.tol)]
    for r in failed:
        if r.error:
            print(f"{r.variant} mode={r.mode}: {r.error}")
    print(f"{len(rows) - len(failed)}/{len(rows)} passed" + (" — FAILED" if failed else ""))
    return 1 if failed else 0
