"""The configuration of one engine call: its compile-time flags (:class:`ChunkConfig`), the
packing tables of variable-length batches, the scalar-gate tile table, and the one rule that
picks the chunk length L (:func:`resolve_chunk_size`).

Chunk size. ``chunk_size`` is an int ≥ 1, None or ``"auto"``:

* an int is taken as it is (``fused_chunk`` holds one chunk in one register tile, so it takes
  L ≤ :data:`FUSED_MAX_CHUNK`), but never longer than the call needs (:func:`fit_length`: a
  chunk past the next power of two ≥ T, and past :data:`LENGTH_FLOOR`, is cut to that);
* None is :func:`default_chunk_size`: 64 on the PyTorch path and in ``fused_chunk``; on the
  Triton chunk path 128 for head dims ≥ 128 (≥ 256 for per-channel decays), else 64;
* ``"auto"`` is :func:`auto_chunk_size`: the fastest L the user measured on this GPU
  (``linrnn bench --suite chunksize --save-cache`` writes ``~/.cache/linrnn/chunk_size.json``,
  ``$LINRNN_CACHE_DIR`` moves it), else the fastest L measured for linrnn on this GPU model
  (:data:`MEASURED_CHUNK_SIZES`), else the runtime-optimal L of the TFLA runtime model
  (the TFLA paper, App. G: :func:`runtime_optimal_chunk`), capped for ``fused_chunk``.

This module imports neither Triton nor the benchmark harness: the PyTorch path uses the same
rule.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from linrnn._runtime import to_device
from linrnn.engine.host_math import cdiv, next_pow2

# --------------------------------------------------------------------------------------------
# Chunk size

FUSED_MAX_CHUNK = 128  # fused_chunk keeps one chunk in one register tile
TORCH_CHUNK_SIZE = 64  # the PyTorch path's default


# fit_length never cuts L below this: every default and "auto" choice up to it stands as it is.
LENGTH_FLOOR = 128


def fit_length(L: int, T) -> int:
    """L for a call of T steps: at most ``max(next_pow2(T), LENGTH_FLOOR)``. A chunk at least as
    long as T is one chunk whatever its length, so the cut changes no result beyond rounding,
    but it bounds the padded [L, L] tiles and loops (``chunk_size=10**9`` at T = 12 would
    otherwise allocate gigabytes). T None (unknown, or symbolic while ``torch.compile``
    traces: comparing it would pin the graph to a length range) leaves L as it is."""
    if T is None:
        return L
    return min(L, max(LENGTH_FLOOR, next_pow2(int(T))))


def check_chunk_size(value) -> None:
    """Raise for anything but a positive int, ``"auto"`` or None (the message names them)."""
    if value is None or value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"chunk_size must be a positive int, 'auto' or None, got {value!r}")
    if value < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {value}")


def default_chunk_size(K: int, V: int, *, triton: bool = True, fused: bool = False,
                       vector: bool = False) -> int:  # fmt: skip
    """L when the caller gives none. Triton chunk path: 128 for head dims ≥ 128, where fewer
    chunk states save more memory traffic than the longer intra-chunk products cost; per-channel
    decays (``vector``: GLA, RWKV6) 128 only from head dims of 256. fused_chunk: 64 (one chunk
    is one register tile). PyTorch path: 64."""
    if not triton or fused:
        return 64 if fused else TORCH_CHUNK_SIZE
    if vector:
        return 128 if max(K, V) >= 256 else 64
    return 128 if max(K, V) >= 128 else 64


def fused_cap(K: int, V: int) -> int:
    """The largest L ``"auto"`` gives ``fused_chunk``: 128, and 64 above head dim 128 (a chunk
    of 128 steps spills registers there)."""
    return 64 if max(K, V) > 128 else FUSED_MAX_CHUNK


# mode=None on the Triton path runs ``fused_chunk`` instead of ``chunk`` (each at its default
# chunk size) where that measured faster: ``benchmarks/mode_default.py`` times both per op, head
# dims and walkers N·H (in fused_chunk one program per sequence, head and value tile walks the
# whole sequence, so with few walkers the GPU idles), H200, bf16 (docs/tuning.md).
# {op: {with a gradient: (fewest walkers, head dims (K, V))}}; an op, or head dims, not named
# here keep chunk mode.
FUSED_DEFAULT = {
    "linear_attn": {
        True: (128, ((32, 32), (64, 64), (64, 128), (128, 128))),
        False: (256, ((64, 64),)),
    },
    "retention": {
        True: (128, ((32, 32), (64, 64), (64, 128), (128, 128))),
        False: (128, ((64, 64), (64, 128))),
    },
    "mlstm[sigmoid]": {True: (256, ((64, 128),)), False: (256, ((64, 64),))},
}


def default_fused(op: str, K: int, V: int, walkers: int, grad: bool) -> bool:
    """Whether mode=None runs ``op`` (a key of :data:`FUSED_DEFAULT`) in ``fused_chunk`` for
    head dims K, V and ``walkers`` = N·H state walks, with (``grad``) or without a gradient."""
    fewest, dims = FUSED_DEFAULT.get(op, {}).get(grad, (0, ()))
    return (K, V) in dims and walkers >= fewest


def resolve_chunk_size(value, K: int, V: int, *, triton: bool, fused: bool = False,
                       vector: bool = False, family: str | None = None, dtype=None,
                       device=None, T: int | None = None) -> int:  # fmt: skip
    """The chunk length L of one call (see the module docstring): ``value`` validated, None
    replaced by the default and ``"auto"`` by :func:`auto_chunk_size` (which needs ``family``,
    ``dtype`` and ``device``), then cut to the call's length T by :func:`fit_length`.
    ``fused`` rejects L > :data:`FUSED_MAX_CHUNK` (whatever T)."""
    check_chunk_size(value)
    if value is None:
        L = default_chunk_size(K, V, triton=triton, fused=fused, vector=vector)
    elif value == "auto":
        L = auto_chunk_size(family, K, V, dtype, device)
        if fused:
            L = min(L, fused_cap(K, V))
    else:
        L = int(value)
    if fused and L > FUSED_MAX_CHUNK:
        raise ValueError(
            f"mode='fused_chunk' holds one chunk in one tile: chunk_size must be ≤ "
            f"{FUSED_MAX_CHUNK}, got {L} (mode='chunk' takes any chunk size)"
        )
    return fit_length(L, T)


# "auto": measured choices, first the user's own (a cache file), then linrnn's.

CACHE_NAME = "chunk_size.json"
CACHE_FORMAT = 1
CANDIDATES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
FAMILY_OPS = {"mlstm": "mlstm[exp]"}  # the op a family's chunk size is looked up as
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}

# The fastest L (forward + backward, mode "chunk", bf16, B8-T8192-H16 and, for rwkv6, H64)
# measured with ``linrnn bench --suite chunksize`` on each GPU model: {(GPU, dtype, K, V):
# {op: L}}. The GPU is matched as a substring of the device name.
MEASURED_CHUNK_SIZES = {
    ("H200", "bf16", 256, 256): {
        "linear_attn": 128, "linear_attn[normalize]": 128, "retention": 128,
        "simple_gla": 128, "mlstm[sigmoid]": 128, "mlstm[sigmoid,normalize]": 128,
        "mlstm[exp]": 128, "gla": 128, "gla[gv]": 64,
    },
    ("H200", "bf16", 64, 64): {"rwkv6": 64},
}  # fmt: skip

_loaded: dict = {}  # cache path -> parsed file


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """``override``, else ``$LINRNN_CACHE_DIR``, else ``~/.cache/linrnn``."""
    if override is not None:
        return Path(override)
    env = os.environ.get("LINRNN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "linrnn"


def dtype_name(dtype) -> str:
    """ "bf16", "fp16", "fp32" or "fp64" for a torch dtype or such a string."""
    text = str(dtype).replace("torch.", "")
    name = DTYPE_NAMES.get(text, text)
    if name not in DTYPE_NAMES.values():
        raise ValueError(f"dtype must be bf16, fp16, fp32 or fp64, got {dtype!r}")
    return name


def device_name(device) -> str:
    """The GPU's name for a CUDA device ("NVIDIA H200"), "cpu" otherwise."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        return torch.cuda.get_device_name(device.index or 0)
    return device.type


def cache_key(op: str, K: int, V: int, dtype, gpu: str, version: str | None = None) -> str:
    """The user cache's key: ``op|K..|V..|dtype|device name|linrnn version``."""
    import linrnn

    version = version or linrnn.__version__
    return f"{op}|K{K}|V{V}|{dtype_name(dtype)}|{gpu}|linrnn {version}"


def load_cache(directory=None, reload: bool = False) -> dict:
    """The parsed user cache (``{"format": 1, "entries": {key: entry}}``), read once per
    process; empty when the file is missing or unreadable."""
    path = cache_dir(directory) / CACHE_NAME
    if reload or str(path) not in _loaded:
        try:
            data = json.loads(path.read_text())
            if data.get("format") != CACHE_FORMAT or not isinstance(data.get("entries"), dict):
                data = None
        except (OSError, ValueError):
            data = None
        _loaded[str(path)] = data or {"format": CACHE_FORMAT, "entries": {}}
    return _loaded[str(path)]


def cached_timings(op: str, K: int, V: int, dtype, gpu: str, objective: str = "fwdbwd",
                   directory=None) -> tuple[dict, dict | None]:  # fmt: skip
    """``(measured, entry)``: the user cache's figures by L for this key (those with a time for
    ``objective`` or a forward time), and the raw entry (None when there is none)."""
    entry = load_cache(directory)["entries"].get(cache_key(op, K, V, dtype, gpu))
    if not entry:
        return {}, None
    figures = entry["measured"].items()
    measured = {int(L): f for L, f in figures if f.get(f"{objective}_ms") or f.get("fwd_ms")}
    return measured, entry


def fastest(measured: dict, objective: str = "fwdbwd", among=None) -> int:
    """The L of ``measured`` (or of ``among``) with the least time for ``objective``."""
    t = lambda L: measured[L].get(f"{objective}_ms") or measured[L]["fwd_ms"]  # noqa: E731
    return min(among if among is not None else measured, key=t)


def shipped_chunk_size(op: str, K: int, V: int, dtype, gpu: str) -> int | None:
    """L from :data:`MEASURED_CHUNK_SIZES` for this GPU model, or None."""
    name = dtype_name(dtype)
    for (model, dt, k, v), table in MEASURED_CHUNK_SIZES.items():
        if model.lower() in gpu.lower() and (dt, k, v) == (name, K, V) and op in table:
            return table[op]
    return None


# The analytical fallback: the runtime model of the TFLA paper (App. G).

F_CAUSAL = 0.5  # the causal fraction of a chunk's intra-chunk products
STATE_BYTES = 4  # fp32 states (bytes_C)

# Spec-sheet numbers (NVIDIA datasheets): HBM bandwidth in B/s and dense (no sparsity) BF16
# tensor-core throughput in FLOP/s. Matched in order against the device name, so "H100" (SXM5)
# comes after the PCIe and NVL variants.
GPU_SPECS = (
    ("H200", 4.8e12, 989e12),
    ("H100 NVL", 3.9e12, 835e12),
    ("H100 PCIe", 2.0e12, 756e12),
    ("H100", 3.35e12, 989e12),
    ("A100", 2.0e12, 312e12),
)

# Accelerator intensity (FLOP/byte) assumed for a CPU in the analytical chunk-size estimate
# only: ~1 TFLOP/s fp32 over ~100 GB/s, a nominal server CPU.
NOMINAL_CPU_INTENSITY = 10.0


def accelerator_intensity(gpu: str | None) -> float:
    """The device's FLOP/byte ratio α/β from :data:`GPU_SPECS` (nominal for anything else)."""
    for key, bandwidth, peak in GPU_SPECS:
        if gpu and key.lower() in gpu.lower():
            return peak / bandwidth
    return NOMINAL_CPU_INTENSITY


def runtime_optimal_chunk(K: int, V: int, intensity_acc: float, state_bytes: int = STATE_BYTES,
                          f_causal: float = F_CAUSAL) -> float:  # fmt: skip
    """Runtime-optimal chunk size of the TFLA runtime model (dτ/dL = 0 for
    τ = FLOPs/α + Bytes/β, with d_hv² p_qk = K·V)::

        L_opt = sqrt( (2KV + 5 + 2·I_acc·KV·bytes_C) / (2·F_c·(K + V + 3) + 1) )

    ``I_acc = α/β`` is the accelerator's FLOP/byte ratio. With ``I_acc = 0`` this is the
    FLOP-optimal L. The model ignores the slower pointwise work, so it overestimates the
    measured optimum."""
    num = 2 * K * V + 5 + 2 * intensity_acc * K * V * state_bytes
    den = 2 * f_causal * (K + V + 3) + 1
    return math.sqrt(num / den)


def analytical_chunk_size(K: int, V: int, gpu: str | None) -> tuple[int, float, float]:
    """``(L, L_opt, I_acc)``: the runtime-optimal L for this device, rounded to the nearest
    power of two (in log scale) within [16, 4096]."""
    intensity = accelerator_intensity(gpu)
    L_opt = runtime_optimal_chunk(K, V, intensity)
    L = 2 ** round(math.log2(L_opt))
    return int(min(max(L, CANDIDATES[0]), CANDIDATES[-1])), L_opt, intensity


def auto_chunk_size(family: str, K: int, V: int, dtype, device=None, *, cache=None) -> int:
    """``chunk_size="auto"`` for mode "chunk": the user's fastest measured L on this device
    (forward + backward), else linrnn's measurement on this GPU model, else the analytical
    estimate. ``cache`` overrides the user cache's folder."""
    op = FAMILY_OPS.get(family, family)
    gpu = device_name(device)
    measured, _ = cached_timings(op, K, V, dtype, gpu, directory=cache)
    if measured:
        return fastest(measured)
    shipped = shipped_chunk_size(op, K, V, dtype, gpu)
    if shipped is not None:
        return shipped
    return analytical_chunk_size(K, V, gpu)[0]


# --------------------------------------------------------------------------------------------
# Tiles of the scalar-gate kernels

# Per kernel: (time tile, depth tile, output tile, num_warps, num_stages), each clipped to the
# problem. Depth/output are K/V for the forward kernels, V/K for dq and dk. The state-gradient
# walk has two entries: states_bwd for a walk that carries dC alone (its one-tile form when the
# chunk is one time tile), states_bwd_sums for one that also carries dn or the decay gradient's
# chunk-end sums (more live tiles; the tiled form).
TILES = {
    "states_fwd": (128, 64, 256, 8, 2),
    "out_fwd": (64, 32, 256, 4, 3),
    "states_bwd": (128, 32, 256, 8, 2),
    "states_bwd_sums": (64, 32, 256, 4, 2),
    "dq_bwd": (64, 64, 128, 4, 2),
    "dqk_bwd": (64, 64, 64, 4, 1),
    "dk_bwd": (64, 64, 256, 8, 3),
    "dv_bwd": (64, 32, 256, 8, 3),
    # fused_chunk's four walks (fused_kernels): only their warps and stages; the tiles follow
    # from the chunk and the head dims (ChunkConfig).
    "fused_fwd": (0, 0, 0, 4, 1),
    "fused_dq": (0, 0, 0, 4, 1),
    "fused_dk": (0, 0, 0, 4, 1),
    "fused_dv": (0, 0, 0, 4, 1),
}

# Smaller heads: entries that replace TILES' when both head dims K, V are at most 64
# (HD64_TILES) or 128 (HD128_TILES); the kernels they leave out keep TILES' entry (clipped).
# Measured on an H200 at B8-T8192 with H64-K64-V64 and H32-K128-V128 (docs/tuning.md).
HD64_TILES = {
    "states_fwd": (64, 64, 64, 4, 2),
    "states_bwd": (64, 64, 64, 2, 2),
    "states_bwd_sums": (64, 64, 64, 2, 2),
    "dk_bwd": (64, 64, 64, 4, 1),
    "dv_bwd": (64, 64, 64, 4, 2),
    "fused_fwd": (0, 0, 0, 4, 2),
    "fused_dq": (0, 0, 0, 4, 3),
    "fused_dk": (0, 0, 0, 4, 3),
    "fused_dv": (0, 0, 0, 4, 3),
}
HD128_TILES = {
    "out_fwd": (64, 64, 128, 4, 3),
    "states_bwd": (128, 64, 128, 4, 2),
    "states_bwd_sums": (64, 64, 128, 4, 2),
    "dk_bwd": (64, 64, 128, 4, 2),
    "dv_bwd": (64, 64, 128, 4, 2),
    "fused_fwd": (0, 0, 0, 4, 2),
    "fused_dq": (0, 0, 0, 4, 2),
    "fused_dk": (0, 0, 0, 4, 2),
    "fused_dv": (0, 0, 0, 4, 2),
}

# The scalar chunk gate-gradient kernel (scalar_gate_grad_kernels): (steps per tile, chunks × L
# with the chunks clipped to the longest sequence; num_warps). Not tuned yet.
GATE_GRAD_TILES = {"scalar": (1024, 4)}

# Per kernel: (sub-chunk BC, tile of the other time side, depth tile, output tile, num_warps,
# num_stages); the states kernels: (time tile, K tile, V tile, num_warps, num_stages). A kernel
# whose output dimension carries a gate uses GATED_BO as its output tile.
VEC_TILES = {
    "states": (64, 32, 256, 4, 2),  # (time tile, K tile, V tile, ...): gk-only calls
    "states_gv": (64, 64, 128, 4, 2),  # with gv
    "rows": (16, 64, 32, 64, 4, 2),
    "cols": (16, 64, 32, 64, 4, 1),
    "fused": (16, 0, 32, 0, 4, 1),
}
GATED_BO = 64

# Tiles of the stored-scores kernels (vector_scores_kernels), used by gk-only calls in chunk mode:
# scores (sub-chunk, key tile, depth tile, warps, stages), apply (row tile, key tile, depth
# tile, output tile, warps, stages), dscores (the backward's ungated do vᵀ), inter (dq's and
# dk's inter-chunk parts: rows, depth tile, output tile, warps, stages), fast
# (fast_scores_kernel: rows, key tile, depth tile, warps, stages).
SCORE_TILES = {
    "scores": (16, 32, 32, 2, 2),
    "apply": (64, 64, 32, 64, 4, 1),
    "dscores": (64, 64, 64, 4, 2),
    "inter": (64, 64, 64, 4, 1),
    "fast": (64, 64, 32, 4, 2),
}


# Mamba2's B/C groups (scalar gates, linrnn.engine.scalar, docs/DESIGN.md §11). The dv kernel
# (group_scores_kernels): (time tile, depth tile, V tile, num_warps, num_stages), each clipped
# to the problem; a chunk may span at most two time tiles (the scores a program holds), so it
# takes L ≤ 2 × the time tile. The stages pipeline the loop over a program's heads. Picked by
# GPU sweeps (docs/tuning.md, "Mamba2's large groups"): a 128-row time tile holds a default
# 128-row chunk's scores whole.
GROUP_SCORE_TILES = {"dv": (128, 32, 64, 8, 3)}
# dB and dC (group_kernels): per kernel (time tile, V depth tile, K tile, num_warps,
# num_stages): dscores_kernel's K tile is the depth of its scores C·Bᵀ, dqk_group_kernel's the
# K columns of its output. The two time tiles are independent: dq and dk read the gradient
# matrix and dscores_kernel's per-tile sums by token. Picked by the same sweep.
GROUP_TILES = {"dscores": (64, 64, 64, 8, 3), "dq_dk": (64, 64, 64, 4, 3)}

# --------------------------------------------------------------------------------------------
# The delta rule's chunk path (linrnn.engine.delta)

# Its default chunk length (fla's too): A = (I + N)⁻¹ is one [L, L] fp32 register tile solved by
# block forward substitution (cost and the stored A [B·H, T, L] grow with L), and every chunk is
# one row tile of the state walk.
DELTA_CHUNK_SIZE = 64
DELTA_MAX_CHUNK = 128

# Per kernel: wy (the solve and W/U of chunks of up to 64 rows, 16-row blocks: K tile of K Kᵀ,
# K/V tile of W and U, num_warps, num_stages), wy_gated (the same with a log decay), wy_long
# (128-row chunks, 32-row blocks); walk (K block, fp32 state elements per program: with the K
# blocks this sets the V tile, num_warps, num_stages for 16-bit inputs; fp32 inputs take one
# stage, as three need 304 KB of shared memory at K = 256). The wy tiles keep register spills
# small on sm_90 (ptxas -v at K = V = 128): the 16 × 16 products replicate their operands in
# every warp, so a narrow K tile bounds what is live; 128-row chunks hold ten fp32 [32, 32]
# blocks, hence more warps. Two warps for the 64-row chunks (more programs per SM); a 32-wide
# W/U tile for the gated form only (its forward 0.87-0.95x the time of the 64-wide one on the
# H200, the plain rule's 1.03-1.04x). The walk in two 64-row K blocks with three pipeline
# stages: its forward 0.88-0.92x the time of one 128-row block in one stage over both forms
# and the delta suite's shapes (docs/tuning.md, the delta rule).
DELTA_TILES = {
    "wy": (16, 64, 2, 2),
    "wy_gated": (16, 32, 2, 2),
    "wy_long": (16, 16, 8, 1),
    "walk": (64, 8192, 4, 3),
}
DELTA_MAX_K = 256

# The delta rule backward's own kernels (delta_bwd_kernels): dv_local (largest V tile, num_warps);
# walk (largest V tile, fp32 state elements per program: with the K blocks this sets the V tile,
# halved again for 128-row chunks, num_warps, num_stages); wy (K and V tile, num_warps) for
# chunks of up to 64 rows, wy_long above. Registers (ptxas, Triton 3.6, sm_90, K = V = 128,
# L = 64, bf16, gated): dv_local 241, no spills; the walk and wy at these 4 warps 255 with 2.9
# and 3.3 KB spilled. The less spilled forms (8 warps, 32-wide V tiles) and a second pipeline
# stage in the walk were timed on the H200 and are slower or mixed (docs/tuning.md, the delta
# rule); dv_local on 4 warps: 0.96-0.97x the gated backward's time on 8, the plain one's ~1x.
DELTA_BWD_TILES = {
    "dv_local": (128, 4),
    "walk": (64, 8192, 4, 1),
    "wy": (64, 4),
    "wy_long": (32, 8),
}


def delta_chunk_size(value, K: int, V: int, *, family: str = "delta_rule", dtype=None,
                     device=None, T: int | None = None) -> int:  # fmt: skip
    """The delta rule's chunk length L on the Triton chunk path: an int ≤
    :data:`DELTA_MAX_CHUNK` as it is; None :data:`DELTA_CHUNK_SIZE`; ``"auto"`` the fastest L the
    user measured on this GPU (the cache of :func:`auto_chunk_size`, capped), else the
    default (no measurement of linrnn's and no runtime model for the delta rule yet); then
    :func:`fit_length` for a call of T steps."""
    return fit_length(_delta_chunk_size(value, K, V, family, dtype, device), T)


def _delta_chunk_size(value, K, V, family, dtype, device) -> int:
    check_chunk_size(value)
    if value is None:
        return DELTA_CHUNK_SIZE
    if value == "auto":
        measured = {}
        if dtype is not None:
            measured, _ = cached_timings(family, K, V, dtype, device_name(device))
        return min(fastest(measured), DELTA_MAX_CHUNK) if measured else DELTA_CHUNK_SIZE
    if value > DELTA_MAX_CHUNK:
        raise ValueError(
            f"the delta rule's chunk path solves each chunk in one tile: chunk_size must be ≤ "
            f"{DELTA_MAX_CHUNK}, got {value}"
        )
    return int(value)


# --------------------------------------------------------------------------------------------
# Tiles of the recurrent kernels

# The decode step's tile: the whole key dimension (BK = next power of two ≥ K) by a value tile
# BV = min(BV_MAX, STATE_ELEMS // BK, next power of two ≥ V) (at least 16), on NUM_WARPS warps
# (PLAIN_WARPS for a plain walk: the state and scalar per-step terms, no per-channel gates,
# input gate, bonus, n or m), or FULL_WARPS once the tile holds STATE_ELEMS fp32 entries. A
# step reads and writes the state once, so this tile sets how close it comes to the memory
# floor: a program's state tile is what it has in flight, and registers bound how many
# programs an SM holds (docs/tuning.md, "Decoding").
STEP_TILE = {"BV_MAX": 64, "STATE_ELEMS": 8192, "NUM_WARPS": 1, "PLAIN_WARPS": 4, "FULL_WARPS": 2}
# The delta rule's recurrent forward (its walk is never plain) and backward.
DELTA_STEP_TILE = {"BV_MAX": 64, "STATE_ELEMS": 8192, "NUM_WARPS": 2, "FULL_WARPS": 2}
DELTA_RECURRENT_BWD_TILE = {"BV_MAX": 64, "STATE_ELEMS": 8192, "NUM_WARPS": 4, "FULL_WARPS": 2}

# The backward's tiles: the dimension a program splits is tiled by up to 64, the other held whole
# (the product at most BWD_STATE_ELEMS).
BWD_TILE_MAX, BWD_STATE_ELEMS = 64, 8192

# Normalizer codes of the kernels' NORM constexpr.
NORM_NONE, NORM_SUM, NORM_MAX1, NORM_MAXM = 0, 1, 2, 3


def norm_code(normalizer: str | None, stabilize: bool) -> int:
    """The kernels' NORM code of a normalizer (None, "sum" or "mlstm")."""
    if normalizer == "mlstm":
        return NORM_MAXM if stabilize else NORM_MAX1
    return {None: NORM_NONE, "sum": NORM_SUM}[normalizer]


# --------------------------------------------------------------------------------------------
# The configuration of one call


class ChunkConfig:
    """Compile-time flags, sizes, packing tables and tile sizes of one chunk-engine call.
    ``chunk_size`` None takes the Triton default (:func:`default_chunk_size`)."""

    def __init__(self, q, k, v, *, scale, has_decay, has_igate, stabilize, track_n,
                 normalizer, eps, chunk_size, fused=False, offsets=None,
                 vector=False):  # fmt: skip
        B, T, H, K, V = q.shape[0], q.shape[1], v.shape[2], q.shape[3], v.shape[3]
        self.fused = fused
        self.scale, self.eps = float(scale), float(eps)
        self.has_decay, self.has_igate = has_decay, has_igate
        self.stab, self.track_n = stabilize, track_n
        self.norm = norm_code(normalizer, stabilize)
        self.L = resolve_chunk_size(chunk_size, K, V, triton=True, fused=fused, vector=vector)
        self.NT = cdiv(T, self.L)
        self.varlen = offsets is not None
        self.N, self.NSEQ = B, 1  # states (sequences) and sequences per row of B·H
        ints = dict(device=q.device, dtype=torch.int32)
        self.CO = self.CHUNKS = torch.zeros(3, **ints)
        self.longest = max(self.NT, 1)  # chunks of the longest sequence
        if self.varlen:
            self._pack(list(offsets), T, q.device)
        self.rows = B * H  # rows of the gates and chunk states (B = 1 when packed)
        self.walkers = self.N * H  # programs of the walking kernels: one per state
        if fused:  # one chunk = one tile; one dimension whole, the other tiled to fit
            self.BT = max(16, next_pow2(self.L))
            self.KP = max(16, next_pow2(K))
            self.VP = max(16, next_pow2(V))
            self.BVf = max(16, min(64, 8192 // self.KP, self.VP))
            self.BKf = max(16, min(64, 8192 // self.VP, self.KP))
        self.prec = "ieee" if q.dtype == torch.float32 else "tf32"
        self.head_dim = max(K, V)  # picks the tile table (head_tiles)
        self.dtype = q.dtype

    def _pack(self, offsets, T, device):
        """Packed sequences: chunk table rows (start, end, sequence), each sequence's first
        chunk CO[n], the per-token chunk start and chunk index. Vectorized: a Python loop over
        tokens would cost more host time than the kernels of a long packed call."""
        L, N = self.L, len(offsets) - 1
        bounds = torch.tensor(offsets, dtype=torch.long)
        bos, eos = bounds[:-1], bounds[1:]
        counts = (eos - bos + L - 1).div(L, rounding_mode="floor").clamp_(min=0)  # chunks
        co = F.pad(counts.cumsum(0), (1, 0))
        NT = int(co[-1])
        seq = torch.repeat_interleave(torch.arange(N), counts)  # each chunk's sequence
        c0 = bos[seq] + (torch.arange(NT) - co[seq]) * L
        rows = torch.stack([c0, torch.minimum(c0 + L, eos[seq]), seq], 1)
        self.N, self.NSEQ, self.NT = N, N, max(NT, 1)
        self.longest = max(int(counts.max()) if N else 0, 1)  # chunks
        self.offsets = offsets
        # Two host tables go to the device, with _runtime.to_device (a blocking copy would wait
        # for every kernel queued before this call); the rest is derived there.
        rows = rows if NT else torch.zeros(1, 3, dtype=torch.long)
        self.CHUNKS = to_device(rows.reshape(-1), device, torch.int32)
        ints = to_device(torch.cat([co, bounds]), device)  # CO [N + 1], then the bounds
        co_d, bounds_d = ints[: N + 1], ints[N + 1 :]
        self.CO = co_d.int()
        # Per token: its sequence, chunk and start
        t = torch.arange(T, device=device)
        tok_seq = torch.searchsorted(bounds_d[1:], t, right=True)
        pos = t - bounds_d[:-1][tok_seq]
        self.tok_chunk = co_d[tok_seq] + pos.div(L, rounding_mode="floor")
        self.tok_start = t - pos.remainder(L)
        self.final_slot = co_d[1:] + torch.arange(N, device=device)

    def tiles(self, name: str, D: int, O: int):
        """(time tile, depth tile, output tile, launch options) of kernel ``name``."""
        t, d, o, nw, ns = head_tiles(self.head_dim).get(name, TILES[name])
        fit = lambda x, n: max(16, min(x, next_pow2(n)))  # noqa: E731
        return fit(t, self.L), fit(d, D), fit(o, O), dict(num_warps=nw, num_stages=ns)

    def fused_launch(self, name: str) -> dict:
        """The launch options (warps, stages) of fused_chunk's walk ``name`` (fused_fwd,
        fused_dq, fused_dk, fused_dv)."""
        nw, ns = head_tiles(self.head_dim).get(name, TILES[name])[3:]
        return dict(num_warps=nw, num_stages=ns)

    def m_final(self, mc):
        """The final max state [N, H] from the chunk-boundary table MC [rows, NT + NSEQ]."""
        if self.varlen:
            return mc[:, self.final_slot].transpose(0, 1).contiguous()
        return mc[:, self.NT].reshape(self.N, -1).clone()


def head_tiles(head_dim: int) -> dict:
    """The tile entries that replace :data:`TILES`' for heads whose larger dim is
    ``head_dim``."""
    if head_dim <= 64:
        return HD64_TILES
    return HD128_TILES if head_dim <= 128 else {}


def chunk_counts(B: int, T, L: int, offsets):
    """(N states, NT chunk rows, NSEQ sequences per row) as :class:`ChunkConfig` computes them,
    from Python ints (T may be symbolic: the custom ops' fake implementations use it)."""
    if offsets is None:
        return B, (T + L - 1) // L, 1
    N = len(offsets) - 1
    rows = sum((offsets[n + 1] - offsets[n] + L - 1) // L for n in range(N))
    return N, max(rows, 1), N


# --------------------------------------------------------------------------------------------
# Inputs as the kernels read them


def chunk_state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the scalar engine's stored chunk states and state gradients: the inputs'
    16-bit dtype, else fp32. Every kernel that reads them for a product casts them to the
    inputs' dtype first (the tensor cores' operands), so 16-bit storage changes none of the
    outputs or dq, dk, dv and halves the bytes of the largest tensors of a call; the walks keep
    their running state in fp32 registers, and the final state is fp32 (docs/DESIGN.md §6.2)."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def fp32_contiguous(x):
    """x as fp32 contiguous (None stays None)."""
    return None if x is None else x.float().contiguous()


def per_head(g) -> bool:
    """Whether g ``[B, T, H]`` holds one value per head, the same for every token row b·T + t
    (stride 0 over B and over T, or size 1; stride 1 over H): retention's decay, broadcast."""
    (B, T, _), (sb, st, sh) = g.shape, g.stride()
    return (sb == 0 or B == 1) and (st == 0 or T == 1) and sh == 1


def prepare_state(S0, n0, m0, track_n: bool, stabilize: bool):
    """The initial state as the kernels read it: fp32 contiguous, n0/m0 zeros where the call
    tracks them but none was given, None where it does not (all None without S0). An fp32
    contiguous S0 comes back as the same tensor, so a final state may be written over it."""
    if S0 is None:
        return None, None, None
    if track_n and n0 is None:
        n0 = S0.new_zeros(S0.shape[:3])
    if stabilize and m0 is None:
        m0 = S0.new_zeros(S0.shape[:2])
    n0 = fp32_contiguous(n0) if track_n else None
    m0 = fp32_contiguous(m0) if stabilize else None
    return fp32_contiguous(S0), n0, m0
