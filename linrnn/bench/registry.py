"""What ``linrnn bench`` measures: the linrnn ops (one per family variant), the input recipe,
shapes, and the named suites.

Shapes are ids such as ``"B8-T8192-H16-K256-V256"``, or with grouped value heads
``"B8-T8192-H16-HV32-K128-V128"`` (:func:`parse_shape`; HV = H when absent). Inputs follow the
self-check's recipe (:data:`linrnn.selfcheck.VARIANTS`): q, k, v standard normal (in the
benchmark dtype), gates fp32 (log decays ``logsigmoid(randn)/16``; mLSTM pre-activations),
except the gates an op lists in ``dtype_gates`` (the delta rule's β = sigmoid(randn), in the
benchmark dtype as fla's layers and tests make it). The delta-rule ops normalize q and k inside
the op (``use_qk_l2norm=True``, as fla's ``use_qk_l2norm_in_kernel=True``).

Mamba2 (docs/DESIGN.md §11) maps onto the same ids: q = C and k = B with H = G groups, v = x
with HV heads, K = N, V = P (``"B8-T8192-H1-HV64-K128-V64"``: 64 heads sharing one group). Its
gates follow mamba_ssm's Mamba2 module: dt per token and head in the benchmark dtype (a slice
of the bf16 in-projection there), Δ = softplus(dt + dt_bias) log-uniform in [1e-3, 1e-1],
A = −U[1, 16], D and dt_bias fp32 per head (:func:`linrnn.selfcheck.mamba2_qkv`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import torch

from linrnn.engine import config as engine_config

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TORCH_MODES = ("chunk", "parallel", "recurrent", "reference")
TRITON_MODES = ("chunk", "fused_chunk")  # the scalar and vector engines' Triton modes
ALL_MODES = ("chunk", "fused_chunk", "recurrent", "parallel", "reference")
FUSED_MAX_CHUNK = 128  # fused_chunk keeps one chunk in one register tile


def _none(K: int, V: int) -> int:
    return 0


@dataclasses.dataclass(frozen=True)
class Op:
    """A linrnn op variant: ``variant`` names its :data:`linrnn.selfcheck.VARIANTS` entry,
    ``options`` adds keyword arguments, ``grad_names`` names the gate tensors after q, k, v,
    ``gate_elems(K, V)`` counts the fp32 gate values read per token and (value) head and
    ``dtype_gates`` names the gates made in the benchmark dtype instead (one value per token
    and value head each; for the byte counts), ``triton`` says whether the engine's Triton
    kernels for modes chunk and fused_chunk exist, ``triton_modes`` replaces those two modes
    for an op with other kernels (the delta rule: chunk and recurrent), ``grouped`` whether v
    may have more heads than q and k (HV a multiple of H), ``chunk_default`` the op's chunk
    length for ``chunk_size=None`` on every backend (None: the engine's rule,
    :func:`default_chunk`), ``form`` the FLOP/byte model of :mod:`linrnn.bench.flops`
    ("scalar": the engine's chunk form; "delta": the delta rule's)."""

    name: str
    family: str
    variant: str
    options: dict = dataclasses.field(default_factory=dict)
    grad_names: tuple = ()
    gate_elems: Callable[[int, int], int] = _none
    triton: bool = False
    triton_modes: tuple | None = None
    dtype_gates: tuple = ()
    grouped: bool = False
    chunk_default: int | None = None
    form: str = "scalar"

    def kernel_modes(self) -> tuple:
        """The modes with Triton kernels."""
        if self.triton_modes is not None:
            return self.triton_modes
        return TRITON_MODES if self.triton else ()

    def gate_fp32_elems(self, K: int, V: int, elt: int) -> float:
        """Gate bytes per token and value head over 4: the fp32 gates plus the gates in the
        benchmark dtype (``elt`` bytes each)."""
        return self.gate_elems(K, V) + len(self.dtype_gates) * elt / 4


# The delta rule's chunk length for chunk_size=None (fla's 64 on both paths; its Triton solve
# keeps one chunk in one register tile, so the scalar engine's 128 for head dims ≥ 128 does not
# apply): the engine's constant where this build has it.
DELTA_CHUNK = getattr(engine_config, "DELTA_CHUNK_SIZE", 64)
DELTA = dict(triton_modes=("chunk", "recurrent"), grouped=True, chunk_default=DELTA_CHUNK,
             form="delta", dtype_gates=("beta",))  # fmt: skip


OPS = {
    op.name: op
    for op in (
        Op("linear_attn", "linear_attn", "linear_attn", triton=True),
        Op("linear_attn[normalize]", "linear_attn", "linear_attn[normalize]", triton=True),
        Op("retention", "retention", "retention", grad_names=("log_gamma",), triton=True),
        Op("simple_gla", "simple_gla", "simple_gla", grad_names=("g",),
           gate_elems=lambda K, V: 1, triton=True),
        Op("gla", "gla", "gla", grad_names=("gk",), gate_elems=lambda K, V: K, triton=True),
        Op("gla[gv]", "gla", "gla[gv]", grad_names=("gk",), gate_elems=lambda K, V: K + V,
           triton=True),
        Op("rwkv6", "rwkv6", "rwkv6", grad_names=("w", "u"), gate_elems=lambda K, V: K,
           triton=True),
        Op("mlstm[sigmoid]", "mlstm", "mlstm[sigmoid]", grad_names=("i", "f"),
           gate_elems=lambda K, V: 2, triton=True),
        Op("mlstm[sigmoid,normalize]", "mlstm", "mlstm[sigmoid]", {"normalize": True},
           ("i", "f"), lambda K, V: 2, triton=True),
        Op("mlstm[exp]", "mlstm", "mlstm[exp]", grad_names=("i", "f"),
           gate_elems=lambda K, V: 2, triton=True),
        Op("delta_rule", "delta_rule", "delta_rule", grad_names=("beta",), **DELTA),
        Op("gated_delta_rule", "gated_delta_rule", "gated_delta_rule", grad_names=("g", "beta"),
           gate_elems=lambda K, V: 1, **DELTA),
        # Mamba2: q = C, k = B (G groups: the shape's H), v = x (the shape's HV heads), gates
        # dt (per token and head, in the benchmark dtype), A, D, dt_bias (per head, fp32)
        Op("mamba2", "mamba2", "mamba2", grad_names=("dt", "A", "D", "dt_bias"), triton=True,
           dtype_gates=("dt",), grouped=True),
    )
}  # fmt: skip
FAMILY_DEFAULT_OP = {  # a family name given where an op name is expected
    "linear_attn": "linear_attn",
    "retention": "retention",
    "simple_gla": "simple_gla",
    "gla": "gla",
    "rwkv6": "rwkv6",
    "mlstm": "mlstm[exp]",  # linrnn.mlstm's default input gate
    "delta_rule": "delta_rule",
    "gated_delta_rule": "gated_delta_rule",
    "mamba2": "mamba2",
}
DELTA_FAMILIES = ("delta_rule", "gated_delta_rule")
ENGINE_FAMILIES = ("linear_attn", "retention", "simple_gla", "gla", "rwkv6", "mlstm")


def resolve_op(name: str) -> Op:
    """The :class:`Op` of an op or family name; ``ValueError`` naming the choices otherwise."""
    name = FAMILY_DEFAULT_OP.get(name, name)
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}; choose from {sorted({*OPS, *FAMILY_DEFAULT_OP})}")
    return OPS[name]


# --- shapes ---------------------------------------------------------------------------------


def parse_shape(shape_id: str) -> dict:
    """``"B8-T8192-H16-K256-V256"`` -> ``{"B": 8, "T": 8192, "H": 16, "HV": 16, "K": 256,
    "V": 256}``; ``"B8-T8192-H16-HV32-K128-V128"`` gives 32 value heads (grouped value heads:
    q and k have H heads, v, the gates, the state and o have HV, a multiple of H)."""
    m = re.fullmatch(r"B(\d+)-T(\d+)-H(\d+)(?:-HV(\d+))?-K(\d+)-V(\d+)", shape_id)
    if not m or min(int(x) for x in m.groups() if x is not None) < 1:
        raise ValueError(
            f"shape {shape_id!r} is not of the form B8-T8192-H16-K256-V256 or, with grouped "
            "value heads, B8-T8192-H16-HV32-K128-V128"
        )
    B, T, H, HV, K, V = (None if x is None else int(x) for x in m.groups())
    HV = H if HV is None else HV
    if HV % H:
        raise ValueError(f"shape {shape_id!r}: HV={HV} value heads is no multiple of H={H}")
    return {"B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V}


def shape_id(B: int, T: int, H: int, K: int, V: int, HV: int | None = None) -> str:
    """The id of a shape (``-HV…`` only when HV differs from H)."""
    heads = f"H{H}" if HV is None or HV == H else f"H{H}-HV{HV}"
    return f"B{B}-T{T}-{heads}-K{K}-V{V}"


def grouped(shape: dict) -> bool:
    """Whether a parsed shape has grouped value heads (HV > H)."""
    return shape.get("HV", shape["H"]) != shape["H"]


def takes_shapes(name: str, shapes, takes_grouped: bool, notes: list) -> list:
    """The shapes an op (or peer) runs: those with grouped value heads (HV > H) only when it
    takes them (``takes_grouped``); a note names the ones left out."""
    ok = [s for s in shapes if takes_grouped or not grouped(parse_shape(s))]
    if len(ok) < len(shapes):
        left = [s for s in shapes if s not in ok]
        notes.append(f"{name}: no grouped value heads, skipped {' '.join(left)}")
    return ok


# --- modes and backends ---------------------------------------------------------------------


def backend_for(op: Op, mode: str, device: str, requested: str | None = None) -> str | None:
    """The backend that runs ``op`` in ``mode`` on ``device`` ("cuda" or "cpu"), or None when
    no backend does: Triton for the op's Triton modes on CUDA (:meth:`Op.kernel_modes`: every
    engine family's chunk and fused_chunk; the delta rule's chunk and recurrent), the PyTorch
    path for the other modes (and on CPU). ``requested`` forces one backend (None when it
    cannot run the combination)."""
    triton_ok = mode in op.kernel_modes()
    if requested == "triton":
        return "triton" if triton_ok else None
    if requested == "torch" or device != "cuda":
        return "torch" if mode in TORCH_MODES else None
    if triton_ok:
        return "triton"
    return "torch" if mode in TORCH_MODES else None


def default_chunk(
    backend: str | None, mode: str | None, K: int, V: int, op: Op | None = None
) -> int | None:
    """The chunk size an op uses for ``chunk_size=None`` (README, API conventions): torch
    chunk 64; Triton chunk 128 when K or V ≥ 128, else 64; fused_chunk 64; None for the
    modes without chunks; an ``op`` with its own ``chunk_default`` (the delta rule: 64) that
    in mode chunk."""
    if mode == "fused_chunk":
        return 64
    if mode != "chunk":
        return None
    if op is not None and op.chunk_default is not None:
        return op.chunk_default
    return 128 if backend == "triton" and max(K, V) >= 128 else 64


# --- inputs ---------------------------------------------------------------------------------


def selfcheck_variant(name: str):
    """The :class:`linrnn.selfcheck.Variant` behind an op name, with the op's options."""
    from linrnn.selfcheck import VARIANTS

    op = OPS[name]
    variant = next(v for v in VARIANTS if v.name == op.variant)
    return dataclasses.replace(variant, name=name, options={**variant.options, **op.options})


def make_inputs(name: str, shape: dict, seed: int, device):
    """Seeded fp32 inputs of op ``name`` on ``device``: ``(args, kwargs)`` with q, k, v first.
    q, k, v come from a device generator (fast for large shapes); the gates from the
    self-check's CPU recipe, made per value head (the recipe's head count is HV: v, the gates
    and the state have HV heads, q and k H). ``ValueError`` for grouped value heads (HV > H)
    with an op that takes none."""
    import torch.nn.functional as F

    variant = selfcheck_variant(name)
    B, T, H, K, V = (shape[d] for d in "BTHKV")
    HV = shape.get("HV", H)
    if HV != H and not OPS[name].grouped:
        raise ValueError(
            f"op {name!r} takes no grouped value heads (HV={HV} with H={H}); only "
            f"{sorted(n for n, o in OPS.items() if o.grouped)} do"
        )
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, device=device, generator=gen) for _ in range(2))
    v = torch.randn(B, T, HV, V, device=device, generator=gen)
    if variant.positive_qk:
        q, k = F.elu(q) + 1, F.elu(k) + 1
    gates, tensor_kwargs = variant.make(torch.Generator().manual_seed(seed + 1), B, T, HV, K, V)
    move = lambda x: x.to(device)  # noqa: E731
    return (q, k, v, *map(move, gates)), {n: move(x) for n, x in tensor_kwargs.items()}


def cast_inputs(name: str, args: tuple, dtype: str) -> tuple:
    """``args`` (q, k, v, gates) in the benchmark ``dtype``: q, k, v and the op's
    ``dtype_gates``; the other gates stay fp32."""
    op = OPS[name]
    cast = DTYPES[dtype]
    in_dtype = [True] * 3 + [n in op.dtype_gates for n in op.grad_names]
    in_dtype += [False] * (len(args) - len(in_dtype))
    return tuple(x.to(cast) if c else x for x, c in zip(args, in_dtype))


def bench_inputs(name: str, shape: dict, dtype: str, seed: int, device):
    """Benchmark inputs of op ``name``: q, k, v in ``dtype``, gates fp32 (those of
    ``dtype_gates`` in ``dtype``), each a leaf that needs a gradient except retention's fixed
    per-head decay; ``(args, kwargs, needs_grad)``."""
    args, kwargs = make_inputs(name, shape, seed, torch.device(device))
    args = cast_inputs(name, args, dtype)
    needs_grad = [OPS[name].family != "retention" or j < 3 for j in range(len(args))]
    args = tuple(x.requires_grad_(n) for x, n in zip(args, needs_grad))
    return args, kwargs, needs_grad


def build_linrnn(case: dict, shape: dict):
    """``(leaves, fwd)`` for a linrnn case: ``fwd()`` returns the output. With
    ``case["initial_state"]`` (no named suite sets it now) the call continues from the final
    state of a 4-step prefix and returns its own final state, as a decoding step does."""
    from linrnn.selfcheck import run

    dtype = case.get("dtype", "bf16")
    args, kwargs, needs_grad = bench_inputs(case["op"], shape, dtype, case["seed"], case["device"])
    variant = selfcheck_variant(case["op"])
    opts = dict(mode=case["mode"], backend=case["backend"], chunk_size=case["chunk"])
    if case.get("initial_state"):
        p_args, p_kwargs = make_inputs(case["op"], dict(shape, T=4), case["seed"] + 1000, "cpu")
        with torch.no_grad():
            p_args = cast_inputs(case["op"], p_args, dtype)
            _, state = run(
                variant, p_args, p_kwargs, mode="recurrent", backend="torch",
                output_final_state=True,
            )  # fmt: skip
        move = lambda x: x.to(case["device"])  # noqa: E731
        state = tuple(map(move, state)) if isinstance(state, tuple) else move(state)
        opts.update(initial_state=state, output_final_state=True)
    leaves = [x for x, n in zip(args, needs_grad) if n]
    return leaves, lambda: run(variant, args, kwargs, **opts)[0]


# --- suites ---------------------------------------------------------------------------------

PAPER_BT = ((32, 2048), (8, 8192), (4, 16384))  # 65,536 tokens each
# (H, K, V) at which the engine families are compared with their peers at B=8, T=8192: TFLA's
# widths 4096 (K = V) and its H=16, K=128, V=256 layout
HEAD_LAYOUTS = ((16, 256, 256), (16, 128, 256), (32, 128, 128), (64, 64, 64))


@dataclasses.dataclass(frozen=True)
class Suite:
    """A named sweep. ``shapes`` (GPU) and ``cpu_shapes`` are shape ids for every op; an entry
    of ``family_shapes`` replaces them for that family. ``modes`` are tried in order (a mode no
    backend runs on the device is skipped); ``chunk_sizes`` None means the op's default.
    ``fwdbwd`` False times the forward only; ``initial_state`` passes a state (decoding).
    ``kind`` "decode", "varlen" and "train" are run by :mod:`linrnn.bench.decode`,
    :mod:`linrnn.bench.varlen` and :mod:`linrnn.bench.training` (the train suite's shapes
    are ``B<batch>-T<length>`` ids). ``families`` limits the linrnn ops, and the peers by the op
    they match (None: every family)."""

    name: str
    description: str
    shapes: tuple
    cpu_shapes: tuple | None = None
    family_shapes: dict = dataclasses.field(default_factory=dict)
    families: tuple | None = None
    modes: tuple = ALL_MODES
    chunk_sizes: tuple = (None,)
    peers: bool = True
    fwdbwd: bool = True
    initial_state: bool = False
    backend: str | None = None  # force a backend
    note: str = ""
    kind: str = "ops"  # "ops": the op × mode sweep; "decode", "varlen", "train": their own tasks
    docs: int = 8  # varlen: documents packed into the shape's T tokens

    def shapes_for(self, family: str, device: str) -> tuple:
        if device != "cuda" and self.cpu_shapes is not None:
            return self.cpu_shapes
        return self.family_shapes.get(family, self.shapes)

    def runs_family(self, family: str) -> bool:
        return self.families is None or family in self.families


DELTA_SHAPES = (  # H = 16, K = V = 128: B=8, T=8192 plain and with 32 value heads, and the
    # 65,536-token set (B, T) in (32, 2048), (4, 16384)
    shape_id(8, 8192, 16, 128, 128),
    shape_id(8, 8192, 16, 128, 128, HV=32),
    shape_id(32, 2048, 16, 128, 128),
    shape_id(4, 16384, 16, 128, 128),
)

# Mamba2 at the TFLA paper's 65,536 tokens and width 4096 (H=64 heads of P=64, N=128, G=1 group)
# and B=8, T=8192 with H=32, G=8: in shape ids K = N, V = P, H = G (the heads of B and C) and
# HV = H (the heads of x, dt and the state).
MAMBA2_SHAPES = (
    *(shape_id(B, T, 1, 128, 64, HV=64) for B, T in PAPER_BT),
    shape_id(8, 8192, 8, 128, 64, HV=32),
)
# The decode and varlen suites' families. Mamba2 runs in its own suite (and the quick one): the
# decode suite steps the family functions through linrnn.step, and Mamba2's variant is an
# argument-order wrapper of linrnn.mamba2.
QKV_FAMILIES = (*ENGINE_FAMILIES, *DELTA_FAMILIES)


SUITES = {
    s.name: s
    for s in (
        Suite(
            "quick",
            "every family and every mode the device runs, one small shape (smoke test; the "
            "default on a CPU-only machine)",
            shapes=("B2-T256-H4-K64-V64",),
            cpu_shapes=("B1-T64-H2-K16-V16",),
        ),
        Suite(
            "paper",
            "TFLA's 65,536 tokens at width 4096: (B, T) in (32, 2048), (8, 8192), (4, 16384); "
            "H=16, K=V=256 and H=32, K=V=128; RWKV6 H=64, K=V=64",
            shapes=tuple(
                shape_id(B, T, H, d, d) for H, d in ((16, 256), (32, 128)) for B, T in PAPER_BT
            ),
            family_shapes={"rwkv6": tuple(shape_id(B, T, 64, 64, 64) for B, T in PAPER_BT)},
            families=ENGINE_FAMILIES,
            modes=("chunk", "fused_chunk"),
        ),
        Suite(
            "headdim",
            "B=4, T=8192, head dim 64 to 512 at width 4096 (H = 4096 / d)",
            shapes=tuple(shape_id(4, 8192, 4096 // d, d, d) for d in (64, 128, 256, 512)),
            families=ENGINE_FAMILIES,
            modes=("chunk", "fused_chunk"),
        ),
        Suite(
            "heads",
            "B=8, T=8192 at the head layouts (H, K, V) in (16, 256, 256), (16, 128, 256), "
            "(32, 128, 128), (64, 64, 64): every engine family beside its peers; fla's chunk "
            "kernels compile and autotune for up to minutes per op and shape, so run it a shape "
            "or a part at a time (--shapes, --ops, each with --resume --time-budget; "
            "scripts/gpu_runbook.sh heads)",
            shapes=tuple(shape_id(8, 8192, H, K, V) for H, K, V in HEAD_LAYOUTS),
            families=ENGINE_FAMILIES,
            modes=("chunk", "fused_chunk"),
        ),
        Suite(
            "chunksize",
            "chunk size L from 64 to 4096 at B=8, T=8192, H=16, K=V=256 (RWKV6 H=64, K=V=64): "
            "time and peak memory; --save-cache fills the chunk_size='auto' cache",
            shapes=(shape_id(8, 8192, 16, 256, 256),),
            family_shapes={"rwkv6": (shape_id(8, 8192, 64, 64, 64),)},
            families=ENGINE_FAMILIES,
            modes=("chunk",),
            chunk_sizes=(64, 128, 256, 512, 1024, 2048, 4096),
            peers=False,
        ),
        Suite(
            "delta",
            "the delta rule and the gated delta rule (q, k L2-normalized in the op) beside fla's "
            "chunk_delta_rule, chunk_gated_delta_rule and fused_recurrent_gated_delta_rule "
            "(whole sequence, forward only): H=16, K=V=128 at B=8, T=8192 (also with HV=32 "
            "value heads) and at (B, T) in (32, 2048), (4, 16384)",
            shapes=DELTA_SHAPES,
            cpu_shapes=(shape_id(1, 64, 2, 16, 16), shape_id(1, 64, 2, 16, 16, HV=4)),
            families=DELTA_FAMILIES,
            modes=("chunk",),
            note="fla's chunk kernels compile for ~40 s per op and head layout: the suite may "
            "not fit one time-limited call; run it in parts (--ops linrnn, then --ops peers, "
            "each with --resume --time-budget; scripts/gpu_runbook.sh delta)",
        ),
        Suite(
            "mamba2",
            "Mamba2 (dt_softplus, D, dt_bias) beside mamba_ssm's mamba_chunk_scan_combined "
            "(chunk 256, as its Mamba2 module) and fla's chunk_simple_gla on the mapped inputs: "
            "the TFLA paper's 65,536 tokens at width 4096, (B, T) in (32, 2048), (8, 8192), "
            "(4, 16384) with H=64 heads, P=64, N=128, G=1; and B=8, T=8192, H=32, G=8 (shape "
            "ids: K = N, V = P, H = G, HV = the heads)",
            shapes=MAMBA2_SHAPES,
            cpu_shapes=(shape_id(1, 64, 1, 16, 8, HV=4), shape_id(1, 64, 2, 16, 8, HV=4)),
            families=("mamba2",),
            modes=("chunk",),
            note="the peers' Triton kernels compile (and mamba_ssm's autotune) for ~40-60 s per "
            "op and shape: the suite may not fit one time-limited call; run it in parts (--ops "
            "linrnn, then --ops peers, each with --resume --time-budget; scripts/gpu_runbook.sh "
            "mamba2)",
        ),
        Suite(
            "decode",
            "tokens/s of one-token steps: B=64 sequences, T=1 per call, linrnn.step(inplace=True) "
            "on an fp32 state, a loop of --steps calls timed; H=16, K=V=256 and H=64, K=V=64 for "
            "every family (the delta rule also H=16, HV=32, K=V=128); with the peers' fused "
            "recurrent / step kernels",
            shapes=(shape_id(64, 1, 16, 256, 256), shape_id(64, 1, 64, 64, 64)),
            family_shapes={
                f: (
                    shape_id(64, 1, 16, 256, 256),
                    shape_id(64, 1, 64, 64, 64),
                    shape_id(64, 1, 16, 128, 128, HV=32),
                )
                for f in DELTA_FAMILIES
            },
            cpu_shapes=(shape_id(2, 1, 2, 8, 8),),
            families=QKV_FAMILIES,
            modes=("recurrent",),
            fwdbwd=False,
            initial_state=True,
            kind="decode",
        ),
        Suite(
            "varlen",
            "forward+backward of 8 packed documents of seeded random lengths, 65,536 tokens in "
            "all (cu_seqlens, B=1) vs the same documents right-padded to [8, max_len]; H=16, "
            "K=V=256; the scalar-gate families and the delta rule (native cu_seqlens in the "
            "Triton chunk kernels)",
            shapes=(shape_id(1, 65_536, 16, 256, 256),),
            cpu_shapes=(shape_id(1, 96, 2, 8, 8),),
            families=QKV_FAMILIES,
            modes=("chunk",),
            kind="varlen",
            note="fla's peer compiles its chunk kernels per layout for minutes; in parts with "
            "--resume --time-budget (scripts/gpu_runbook.sh varlen: --ops linrnn, then --ops "
            "peers)",
        ),
        Suite(
            "train",
            "whole-model training tokens/s: the byte-level LM of linrnn.train (width 512, 6 "
            "blocks, 4 heads, 19-25 M parameters) with every mixer, softmax attention (torch "
            "SDPA) first as the baseline; 65,536 tokens per step (B=8 at T=8192; --seq-len "
            "2048: B=32), bf16 autocast; step time, tokens/s and the ratio to softmax's, peak "
            "memory, loss curves (PNG) and validation loss; --mixers, --seq-len, --batch, "
            "--train-seconds",
            shapes=("B8-T8192",),
            cpu_shapes=("B4-T64",),
            modes=("chunk",),
            peers=False,
            kind="train",
            note="one worker per mixer (~20 s of training plus start-up and compilation): "
            "11 mixers may not fit one time-limited call; --resume --time-budget runs the rest "
            "(scripts/gpu_runbook.sh train)",
        ),
    )
}
