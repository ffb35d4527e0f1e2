"""What ``linrnn bench`` measures: the linrnn ops (one per family variant), the input recipe,
shapes, and the named suites.

Shapes are ids such as ``"B8-T8192-H16-K256-V256"`` (:func:`parse_shape`). Inputs follow the
self-check's recipe (:data:`linrnn.selfcheck.VARIANTS`): q, k, v standard normal (in the
benchmark dtype), gates fp32 (log decays ``logsigmoid(randn)/16``; mLSTM pre-activations).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TORCH_MODES = ("chunk", "parallel", "recurrent", "reference")
TRITON_MODES = ("chunk", "fused_chunk")
ALL_MODES = ("chunk", "fused_chunk", "recurrent", "parallel", "reference")
FUSED_MAX_CHUNK = 128  # fused_chunk keeps one chunk in one register tile


def _none(K: int, V: int) -> int:
    return 0


@dataclasses.dataclass(frozen=True)
class Op:
    """A linrnn op variant: ``variant`` names its :data:`linrnn.selfcheck.VARIANTS` entry,
    ``options`` adds keyword arguments, ``grad_names`` names the gate tensors after q, k, v,
    ``gate_elems(K, V)`` counts the fp32 gate values read per token and head (for the byte
    counts), ``triton`` says whether Triton kernels exist (modes chunk and fused_chunk)."""

    name: str
    family: str
    variant: str
    options: dict = dataclasses.field(default_factory=dict)
    grad_names: tuple = ()
    gate_elems: Callable[[int, int], int] = _none
    triton: bool = False


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
    )
}  # fmt: skip
FAMILY_DEFAULT_OP = {  # a family name given where an op name is expected
    "linear_attn": "linear_attn",
    "retention": "retention",
    "simple_gla": "simple_gla",
    "gla": "gla",
    "rwkv6": "rwkv6",
    "mlstm": "mlstm[exp]",  # linrnn.mlstm's default input gate
}


def resolve_op(name: str) -> Op:
    """The :class:`Op` of an op or family name; ``ValueError`` naming the choices otherwise."""
    name = FAMILY_DEFAULT_OP.get(name, name)
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}; choose from {sorted({*OPS, *FAMILY_DEFAULT_OP})}")
    return OPS[name]


# --- shapes ---------------------------------------------------------------------------------


def parse_shape(shape_id: str) -> dict:
    """``"B8-T8192-H16-K256-V256"`` -> ``{"B": 8, "T": 8192, "H": 16, "K": 256, "V": 256}``."""
    m = re.fullmatch(r"B(\d+)-T(\d+)-H(\d+)-K(\d+)-V(\d+)", shape_id)
    if not m or min(map(int, m.groups())) < 1:
        raise ValueError(f"shape {shape_id!r} is not of the form B8-T8192-H16-K256-V256")
    return dict(zip("BTHKV", map(int, m.groups())))


def shape_id(B: int, T: int, H: int, K: int, V: int) -> str:
    return f"B{B}-T{T}-H{H}-K{K}-V{V}"


# --- modes and backends ---------------------------------------------------------------------


def backend_for(op: Op, mode: str, device: str, requested: str | None = None) -> str | None:
    """The backend that runs ``op`` in ``mode`` on ``device`` ("cuda" or "cpu"), or None when
    no backend does: Triton for every family's chunk and fused_chunk on CUDA, the
    PyTorch path for the other modes (and on CPU). ``requested`` forces one backend (None when
    it cannot run the combination)."""
    triton_ok = op.triton and mode in TRITON_MODES
    if requested == "triton":
        return "triton" if triton_ok else None
    if requested == "torch" or device != "cuda":
        return "torch" if mode in TORCH_MODES else None
    if triton_ok:
        return "triton"
    return "torch" if mode in TORCH_MODES else None


def default_chunk(backend: str | None, mode: str | None, K: int, V: int) -> int | None:
    """The chunk size an op uses for ``chunk_size=None`` (README, API conventions): torch
    chunk 64; Triton chunk 128 when K or V ≥ 128, else 64; fused_chunk 64; None for the
    modes without chunks."""
    if mode == "fused_chunk":
        return 64
    if mode != "chunk":
        return None
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
    self-check's CPU recipe."""
    import torch.nn.functional as F

    variant = selfcheck_variant(name)
    B, T, H, K, V = (shape[d] for d in "BTHKV")
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, device=device, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, device=device, generator=gen)
    if variant.positive_qk:
        q, k = F.elu(q) + 1, F.elu(k) + 1
    gates, tensor_kwargs = variant.make(torch.Generator().manual_seed(seed + 1), B, T, H, K, V)
    move = lambda x: x.to(device)  # noqa: E731
    return (q, k, v, *map(move, gates)), {n: move(x) for n, x in tensor_kwargs.items()}


def bench_inputs(name: str, shape: dict, dtype: str, seed: int, device):
    """Benchmark inputs of op ``name``: q, k, v in ``dtype``, gates fp32, each a leaf that
    needs a gradient except retention's fixed per-head decay; ``(args, kwargs, needs_grad)``."""
    args, kwargs = make_inputs(name, shape, seed, torch.device(device))
    args = (*(x.to(DTYPES[dtype]) for x in args[:3]), *args[3:])
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
            p_args = (*(x.to(DTYPES[dtype]) for x in p_args[:3]), *p_args[3:])
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


@dataclasses.dataclass(frozen=True)
class Suite:
    """A named sweep. ``shapes`` (GPU) and ``cpu_shapes`` are shape ids for every op; an entry
    of ``family_shapes`` replaces them for that family. ``modes`` are tried in order (a mode no
    backend runs on the device is skipped); ``chunk_sizes`` None means the op's default.
    ``fwdbwd`` False times the forward only; ``initial_state`` passes a state (decoding).
    ``kind`` "decode" and "varlen" are run by :mod:`linrnn.bench.decode` and
    :mod:`linrnn.bench.varlen`."""

    name: str
    description: str
    shapes: tuple
    cpu_shapes: tuple | None = None
    family_shapes: dict = dataclasses.field(default_factory=dict)
    modes: tuple = ALL_MODES
    chunk_sizes: tuple = (None,)
    peers: bool = True
    fwdbwd: bool = True
    initial_state: bool = False
    backend: str | None = None  # force a backend
    note: str = ""
    kind: str = "ops"  # "ops": the op × mode sweep; "decode" and "varlen": their own tasks
    docs: int = 8  # varlen: documents packed into the shape's T tokens

    def shapes_for(self, family: str, device: str) -> tuple:
        if device != "cuda" and self.cpu_shapes is not None:
            return self.cpu_shapes
        return self.family_shapes.get(family, self.shapes)


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
            modes=("chunk", "fused_chunk"),
        ),
        Suite(
            "headdim",
            "B=4, T=8192, head dim 64 to 512 at width 4096 (H = 4096 / d)",
            shapes=tuple(shape_id(4, 8192, 4096 // d, d, d) for d in (64, 128, 256, 512)),
            modes=("chunk", "fused_chunk"),
        ),
        Suite(
            "chunksize",
            "chunk size L from 64 to 4096 at B=8, T=8192, H=16, K=V=256 (RWKV6 H=64, K=V=64): "
            "time and peak memory; --save-cache fills the chunk_size='auto' cache",
            shapes=(shape_id(8, 8192, 16, 256, 256),),
            family_shapes={"rwkv6": (shape_id(8, 8192, 64, 64, 64),)},
            modes=("chunk",),
            chunk_sizes=(64, 128, 256, 512, 1024, 2048, 4096),
            peers=False,
        ),
        Suite(
            "decode",
            "tokens/s of one-token steps: B=64 sequences, T=1 per call, linrnn.step(inplace=True) "
            "on an fp32 state, a loop of --steps calls timed; H=16, K=V=256 and H=64, K=V=64 for "
            "every family; with the peers' fused recurrent / step kernels",
            shapes=(shape_id(64, 1, 16, 256, 256), shape_id(64, 1, 64, 64, 64)),
            cpu_shapes=(shape_id(2, 1, 2, 8, 8),),
            modes=("recurrent",),
            fwdbwd=False,
            initial_state=True,
            kind="decode",
        ),
        Suite(
            "varlen",
            "forward+backward of 8 packed documents of seeded random lengths, 65,536 tokens in "
            "all (cu_seqlens, B=1) vs the same documents right-padded to [8, max_len]; H=16, "
            "K=V=256; the scalar-gate families (native cu_seqlens in the Triton chunk kernels)",
            shapes=(shape_id(1, 65_536, 16, 256, 256),),
            cpu_shapes=(shape_id(1, 96, 2, 8, 8),),
            modes=("chunk",),
            kind="varlen",
            note="fla's peer compiles its chunk kernels per layout for minutes; in parts with "
            "--resume --time-budget (scripts/gpu_runbook.sh varlen: --ops linrnn, then --ops "
            "peers)",
        ),
    )
}
