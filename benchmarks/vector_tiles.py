"""The tile configurations benchmarks/vector_sweep.py tries on the vector-gate path
(triton_chunk_vec's VEC_TILES, GATED_BO, DIAG_LOOP, SCORES, WALK_UNROLL, SPLIT_INTER,
DIAG_SPAN, FAST_CHUNKS, SKIP_SUB_CHUNKS, PRE_GATE, SCORE_TILES): the
candidate lists, their legality, applying one to a config, what the kernels get after
clipping, and setting the engine to a config and back."""

from __future__ import annotations

import contextlib

import torch

from linrnn.engine import triton_chunk_vec as tcv

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}  # RMS-relative, vs the default tiles
# The switches first (in this order, each adopted as the base when faster), then the tiles
SWITCHES = ("diag_loop", "scores", "walk_unroll", "split_inter", "diag_span", "fast_chunks",
            "skip_sub_chunks", "pre_gate")  # fmt: skip
SCORE_KERNELS = ("score_tiles", "apply_tiles", "inter_tiles", "fast_tiles")
KERNELS = (*SWITCHES, "rows", "states", "cols", "gated_bo", *SCORE_KERNELS, "fused")
MODE_KERNELS = {
    "chunk": (*SWITCHES, "rows", "states", "cols", "gated_bo", *SCORE_KERNELS),
    "fused_chunk": (*SWITCHES, "fused"),  # scores: a row that says it has no effect
}
ARITY = {"states": 5, "rows": 6, "cols": 6, "fused": 6, "score_tiles": 5, "apply_tiles": 6,
         "inter_tiles": 5, "fast_tiles": 5}  # fmt: skip
# their SCORE_TILES entries
SCORE_KEYS = {"score_tiles": "scores", "apply_tiles": "apply", "inter_tiles": "inter",
              "fast_tiles": "fast"}  # fmt: skip
HAS_DIAG_LOOP = hasattr(tcv, "DIAG_LOOP")  # added in 35acbf2
HAS_SCORES = hasattr(tcv, "SCORES")  # added in 502a28b (with SCORE_TILES, triton_scores)
HAS_WALK_UNROLL = hasattr(tcv, "WALK_UNROLL")  # added in session 6
HAS_SPLIT_INTER = hasattr(tcv, "SPLIT_INTER")  # added in session 7
HAS_DIAG_SPAN = hasattr(tcv, "DIAG_SPAN")  # added in session 9
HAS_FAST_CHUNKS = hasattr(tcv, "FAST_CHUNKS")  # added in session 9
HAS_SKIP_SUB_CHUNKS = hasattr(tcv, "SKIP_SUB_CHUNKS")  # added in session 11
HAS_PRE_GATE = hasattr(tcv, "PRE_GATE")  # added in session 11
# diag_span's 1: the diagonal's fast form at the engine's span (60 where the engine has it off)
SPAN_ON = float(getattr(tcv, "DIAG_SPAN", 0.0) or 60.0)

# Built-in candidates, most promising first (the sweep is cut by the deadline). The defaults
# since the session-6 sweep: VEC_TILES = states (64, 64, 64, 4, 2), rows (16, 64, 32, 64, 4,
# 2), cols (16, 64, 32, 64, 4, 1), fused (16, 0, 32, 0, 4, 1), GATED_BO = 64, DIAG_LOOP on the
# GPU, SCORES on, SCORE_TILES scores (16, 32, 32, 4, 2) and apply (64, 64, 32, 64, 4, 2).
# diag_loop's and scores' candidate is the other form than the base's (set in parse_args).
# In that sweep 8 warps always lost to 4 on the 16-row programs: 2 warps come first now.
CANDIDATES = {
    "rows": [  # (BC, BS, BD, BO, warps, stages)
        (16, 64, 32, 64, 2, 2),  # 2 warps: a [16, 64] tile is 4 elements per thread at 4
        (16, 64, 64, 64, 2, 1),
        (16, 64, 32, 256, 4, 2),  # BO = V: the forward computes the gated q·kᵀ once, not V/64×
        (16, 64, 32, 256, 8, 2),
        (16, 64, 32, 64, 8, 2),  # 8 warps alone (RWKV6: V = 64, the BO above clip to this)
        (16, 64, 64, 256, 8, 2),  # BD 64: half the depth steps; [16, 16, 64] fp32 diagonal
        (16, 64, 16, 256, 4, 2),  # BD 16
        (16, 32, 32, 256, 8, 2),  # BS 32: fewer masked keys before query tiles 1–3 of a chunk
        (16, 64, 32, 256, 8, 3),
        (16, 128, 32, 256, 8, 2),  # BS 128: one key tile at L = 128 (same as BS 64 at L = 64)
        (16, 64, 32, 256, 8, 1),
        (16, 64, 16, 64, 4, 1),
        (32, 64, 16, 256, 8, 2),  # BC 32: half the query tiles, twice the log-space diagonal
    ],
    "states": [  # (BS, BK, BV, warps, stages)
        (64, 64, 256, 4, 2),  # the scalar engine's tuned states_fwd tile
        (64, 64, 128, 4, 2),  # session 7-9's default
        (64, 32, 128, 4, 2),
        (64, 16, 256, 4, 2),  # four times the walks of BK 64
        (64, 64, 64, 8, 2),
        (64, 64, 256, 8, 2),
        (64, 128, 128, 8, 2),
        (32, 64, 64, 4, 2),
        (64, 64, 64, 4, 3),
        (64, 32, 64, 4, 2),  # more walks (RWKV6: B·H·K/BK programs)
        (128, 64, 64, 4, 2),  # BS 128 (L = 128)
        (64, 64, 64, 4, 1),
    ],
    "cols": [  # (BC, BQ, BD, BO, warps, stages); BO: dv's V tile without gv
        (16, 64, 32, 64, 2, 1),  # 2 warps
        (16, 64, 64, 64, 2, 1),
        (16, 64, 32, 256, 4, 2),  # dv's BO = V: one pass over the later queries, not V/64
        (16, 64, 32, 64, 8, 2),
        (16, 64, 32, 256, 8, 2),
        (16, 64, 64, 256, 8, 2),
        (16, 64, 16, 64, 4, 2),
        (16, 32, 32, 64, 4, 2),
        (16, 64, 32, 64, 4, 3),
        (16, 128, 32, 64, 4, 2),
        (16, 64, 32, 64, 4, 1),
        (32, 64, 16, 64, 8, 2),
    ],
    "gated_bo": [  # (BO,) or (BO, warps of rows and cols)
        (64, 2),
        (128, 4),  # GLA K = 256: two K tiles in dq and dk
        (64, 8),  # RWKV6: the whole K in dq and dk (one output tile, not two)
        (64,),
        (128, 8),  # GLA K = 256: dq and dk recompute the gated products per K tile (8× at 32)
        (16,),
    ],
    "fused": [  # (BC, 0, BD, 0, warps, stages)
        (16, 0, 32, 0, 8, 1),
        (16, 0, 16, 0, 4, 1),
        (16, 0, 64, 0, 8, 1),
        (16, 0, 32, 0, 4, 2),
        (32, 0, 16, 0, 8, 1),
    ],
    # With SCORES in the base only (otherwise these kernels do not run)
    "score_tiles": [  # scores_kernel (BC, BS, BD, warps, stages)
        (16, 32, 32, 2, 2),  # 2 warps
        (16, 32, 64, 2, 2),  # BD 64 (RWKV6: K = 64 in one step)
        (16, 64, 64, 8, 2),  # BD 64: half the depth steps of each score tile
        (16, 32, 32, 4, 2),  # BS 32: fewer masked keys before the sub-chunks 1–3
        (16, 128, 32, 4, 2),  # BS 128: one key tile at L = 128
        (16, 64, 32, 8, 2),
        (32, 64, 16, 8, 2),  # BC 32: half the programs; [32, 32, 16] fp32 diagonal block
        (16, 64, 32, 4, 3),
    ],
    "apply_tiles": [  # apply_kernel (BQ, BS, BD, BO, warps, stages)
        (64, 64, 32, 128, 8, 2),  # BO 128: each score tile read for half as many V tiles
        (64, 64, 32, 256, 8, 2),  # BO = V (GLA): the scores read once
        (128, 64, 32, 128, 8, 2),  # BQ 128: the whole chunk at L = 128
        (64, 32, 32, 128, 8, 2),  # BS 32: fewer masked entries of the triangle
        (64, 128, 32, 128, 8, 2),  # BS 128 (L = 128)
        (64, 64, 32, 64, 8, 2),  # 8 warps alone (RWKV6: V = 64, the BO above clip to this)
        (64, 64, 32, 128, 8, 3),
        (64, 64, 32, 128, 8, 1),
        (64, 64, 64, 128, 8, 2),  # BD 64: the state part's depth steps
        (64, 64, 32, 64, 4, 2),  # session 7-9's default
    ],
    # With SPLIT_INTER (and, for what they finish, FAST_CHUNKS) in the base: apply_kernel's
    # INTER, dq's and dk's inter-chunk parts, and in fast chunks the whole dq / dk
    "inter_tiles": [  # (BQ, BD, BO, warps, stages)
        (64, 32, 64, 8, 2),  # 8 warps: the fast chunks' [64, 64] fp32 P, Z and gate tiles
        (64, 64, 64, 8, 2),  # BD 64: the state part's depth steps
        (32, 32, 64, 4, 2),  # BQ 32: half the rows per program, fewer registers
        (64, 32, 128, 8, 2),  # BO 128 (GLA): the chunk's P read for half as many K tiles
        (64, 32, 32, 4, 2),  # BO 32
        (64, 32, 64, 4, 3),
        (64, 32, 64, 4, 2),  # session 7-9's default
        (64, 128, 64, 4, 1),  # BD 128: half the state part's depth steps of BD 64
        (64, 64, 32, 4, 1),
        (64, 64, 64, 4, 2),
    ],
    "fast_tiles": [  # fast_scores_kernel (BQ, BS, BD, warps, stages), FAST_CHUNKS in the base
        (64, 64, 64, 4, 2),  # BD 64: RWKV6's K in one step
        (64, 64, 32, 8, 2),
        (64, 64, 64, 8, 2),
        (32, 64, 32, 4, 2),  # BQ 32
        (64, 32, 32, 4, 2),  # BS 32: the keys past the row tile skipped sooner
        (64, 64, 32, 4, 3),
    ],
}
# Only with DIAG_LOOP on (the block form's [BC, BC, tile] fp32 product would be 4–16× larger):
# query / key tiles of 32 and 64 rows, i.e. fewer re-reads of each chunk's state and M = 32/64
# tensor-core products instead of M = 16, for more log-space work on the diagonal. First in
# their kernel's list when the walk is the base.
LOOP_ONLY = {
    "rows": [(32, 64, 32, 256, 8, 2), (64, 64, 32, 256, 8, 2), (32, 64, 64, 256, 8, 2)],
    "cols": [(32, 64, 32, 256, 8, 2), (64, 64, 32, 256, 8, 2)],
    "score_tiles": [(32, 64, 32, 8, 2), (32, 64, 64, 8, 2)],
}
QUICK_CANDIDATES = {  # distinct from the defaults after clipping at K = V = 32, L = 16
    "rows": [(16, 16, 16, 32, 4, 1)],
    "states": [(16, 32, 16, 4, 1)],
    "cols": [(16, 16, 16, 32, 4, 1)],
    "gated_bo": [(16,)],
    "fused": [(16, 0, 16, 0, 4, 1)],
    "score_tiles": [(16, 16, 16, 4, 1)],
    "apply_tiles": [(16, 16, 16, 32, 4, 1)],
    "inter_tiles": [(16, 16, 16, 4, 1)],
    "fast_tiles": [(16, 16, 16, 4, 1)],
}
QUICK_LOOP_ONLY = {"rows": [(32, 16, 16, 32, 4, 1)]}


# ---------------------------------------------------------------------------------------------
# Tiles: candidates, clipping, patching
# ---------------------------------------------------------------------------------------------


def current() -> dict:
    """The engine's config now: VEC_TILES, GATED_BO, DIAG_LOOP, SCORES, SCORE_TILES (None
    where the engine has no such switch)."""
    return {
        "VEC_TILES": dict(tcv.VEC_TILES),
        "GATED_BO": tcv.GATED_BO,
        "DIAG_LOOP": bool(tcv.DIAG_LOOP) if HAS_DIAG_LOOP else None,
        "SCORES": bool(tcv.SCORES) if HAS_SCORES else None,
        "SCORE_TILES": dict(tcv.SCORE_TILES) if HAS_SCORES else None,
        "WALK_UNROLL": bool(tcv.WALK_UNROLL) if HAS_WALK_UNROLL else None,
        "SPLIT_INTER": bool(tcv.SPLIT_INTER) if HAS_SPLIT_INTER else None,
        "DIAG_SPAN": float(tcv.DIAG_SPAN) if HAS_DIAG_SPAN else None,
        "FAST_CHUNKS": bool(tcv.FAST_CHUNKS) if HAS_FAST_CHUNKS else None,
        "SKIP_SUB_CHUNKS": bool(tcv.SKIP_SUB_CHUNKS) if HAS_SKIP_SUB_CHUNKS else None,
        "PRE_GATE": bool(tcv.PRE_GATE) if HAS_PRE_GATE else None,
    }


def candidate_problem(kernel: str, t: tuple) -> str | None:
    """Why ``t`` is no legal candidate for ``kernel`` (None: legal)."""
    pow2 = lambda n: n >= 16 and n & (n - 1) == 0  # noqa: E731
    if kernel in SWITCHES:
        return None if t in ((0,), (1,)) else f"{kernel.upper()} is 0 or 1"
    if kernel == "gated_bo":
        if len(t) not in (1, 2) or not pow2(t[0]):
            return "GATED_BO is BO or BO,warps with BO a power of two ≥ 16"
        if len(t) == 2 and t[1] not in (1, 2, 4, 8, 16):
            return "warps must be 1, 2, 4, 8 or 16"
        return None
    if len(t) != ARITY[kernel]:
        return f"{kernel} takes {ARITY[kernel]} numbers, got {len(t)}"
    tiles = {"states": (0, 1, 2), "rows": (0, 1, 2, 3), "cols": (0, 1, 2, 3), "fused": (0, 2),
             "score_tiles": (0, 1, 2), "apply_tiles": (0, 1, 2, 3), "inter_tiles": (0, 1, 2),
             "fast_tiles": (0, 1, 2)}  # fmt: skip
    if not all(pow2(t[i]) for i in tiles[kernel]):
        return "tiles must be powers of two ≥ 16 (tl.arange, tl.dot)"
    if kernel == "fused" and (t[1] or t[3]):
        return "fused entries 2 and 4 are unused: 0"
    if t[-2] not in (1, 2, 4, 8, 16) or not 1 <= t[-1] <= 6:
        return "warps must be 1, 2, 4, 8 or 16 and stages 1–6"
    return None


def apply(kernel: str | None, t, cfg: dict) -> dict:
    """``cfg`` with candidate ``t`` of ``kernel`` in place of its entry."""
    cfg = dict(cfg, VEC_TILES=dict(cfg["VEC_TILES"]))
    if cfg.get("SCORE_TILES") is not None:
        cfg["SCORE_TILES"] = dict(cfg["SCORE_TILES"])
    tiles = cfg["VEC_TILES"]
    if kernel == "diag_loop":
        cfg["DIAG_LOOP"] = bool(t[0])
    elif kernel == "scores":
        cfg["SCORES"] = bool(t[0])
    elif kernel == "walk_unroll":
        cfg["WALK_UNROLL"] = bool(t[0])
    elif kernel == "split_inter":
        cfg["SPLIT_INTER"] = bool(t[0])
    elif kernel == "diag_span":
        cfg["DIAG_SPAN"] = SPAN_ON if t[0] else 0.0
    elif kernel == "fast_chunks":
        cfg["FAST_CHUNKS"] = bool(t[0])
    elif kernel == "skip_sub_chunks":
        cfg["SKIP_SUB_CHUNKS"] = bool(t[0])
    elif kernel == "pre_gate":
        cfg["PRE_GATE"] = bool(t[0])
    elif kernel in SCORE_KEYS:
        cfg["SCORE_TILES"][SCORE_KEYS[kernel]] = tuple(t)
    elif kernel == "gated_bo":
        cfg["GATED_BO"] = t[0]
        if len(t) > 1:  # its warps for rows and cols
            for k in ("rows", "cols"):
                tiles[k] = (*tiles[k][:4], t[1], tiles[k][5])
    elif kernel == "states" and "states_gv" in tiles:  # the gk-only and the gv calls' tile
        tiles["states"] = tiles["states_gv"] = tuple(t)
    elif kernel is not None:
        tiles[kernel] = tuple(t)
    return cfg


def scores_apply(op: str, mode: str) -> str | None:
    """None where SCORES changes the op's kernels, else why it has no effect."""
    if not HAS_SCORES:
        return "this engine has no SCORES"
    if mode != "chunk":
        return f"SCORES has no effect in {mode} (chunk mode only)"
    if op == "gla_gv":
        return "SCORES has no effect with gv (gk-only calls)"
    return None


def effective(cfg: dict, mode: str, shape: dict, chunk: int, gv: bool) -> tuple:
    """What the kernels of ``mode`` get from ``cfg`` after clipping (depth and output tiles to
    max(K, V): conservative when K ≠ V). Equal keys: the same kernels."""
    f = tcv._fit
    tiles = cfg["VEC_TILES"]
    unroll = bool(cfg.get("WALK_UNROLL")) or (gv and getattr(tcv, "WALK_UNROLL_GV", False))
    loop = (cfg["DIAG_LOOP"], unroll and bool(cfg["DIAG_LOOP"]))
    loop = (*loop, cfg.get("DIAG_SPAN"))
    D, K, V = max(shape["K"], shape["V"]), shape["K"], shape["V"]
    if mode == "fused_chunk":
        BC, _, BD, _, nw, ns = tiles["fused"]
        return ("fused", BC, BD, nw, ns, loop)
    stored = bool(cfg.get("SCORES")) and not gv  # then rows: dq only, cols: dk only
    BS, BK, BV, nw, ns = tiles["states_gv" if gv and "states_gv" in tiles else "states"]
    key = [("states", f(BS, chunk), f(BK, K), f(BV, V), nw, ns)]
    for k in ("rows", "cols"):
        BC, BT, BD, BO, nw, ns = tiles[k]
        key.append((k, BC, f(BT, chunk), f(BD, D), None if gv or stored else f(BO, V), nw, ns))
    key.append(("gated_bo", f(cfg["GATED_BO"], D), loop))
    if stored:  # (fast chunks: gk-only calls in chunk mode, like the stored scores)
        key.append(("fast_chunks", cfg.get("FAST_CHUNKS"), cfg.get("SKIP_SUB_CHUNKS")))
        key.append(("pre_gate", cfg.get("PRE_GATE")))
        BC, BS, BD, nw, ns = cfg["SCORE_TILES"]["scores"]
        key.append(("scores", BC, f(BS, chunk), f(BD, K), nw, ns))
        BQ, BS, BD, BO, nw, ns = cfg["SCORE_TILES"]["apply"]
        key.append(("apply", f(BQ, chunk), f(BS, chunk), f(BD, K), f(BO, V), nw, ns))
        if cfg.get("SPLIT_INTER"):  # (gk-only calls in chunk mode, like the stored scores)
            key.append(("split_inter", *cfg["SCORE_TILES"]["inter"]))
        if cfg.get("FAST_CHUNKS") and "fast" in cfg["SCORE_TILES"]:
            key.append(("fast", *cfg["SCORE_TILES"]["fast"]))
    return tuple(key)


@contextlib.contextmanager
def using(cfg: dict):
    """The engine's VEC_TILES and SCORE_TILES (in place), GATED_BO, DIAG_LOOP and SCORES set;
    restored afterwards."""
    saved = current()
    tcv.VEC_TILES.update(cfg["VEC_TILES"])
    tcv.GATED_BO = cfg["GATED_BO"]
    if HAS_DIAG_LOOP:
        tcv.DIAG_LOOP = bool(cfg["DIAG_LOOP"])
    if HAS_SCORES:
        tcv.SCORES = bool(cfg["SCORES"])
        tcv.SCORE_TILES.update(cfg["SCORE_TILES"])
    if HAS_WALK_UNROLL:
        tcv.WALK_UNROLL = bool(cfg.get("WALK_UNROLL"))
    if HAS_SPLIT_INTER:
        tcv.SPLIT_INTER = bool(cfg.get("SPLIT_INTER"))
    if HAS_DIAG_SPAN and cfg.get("DIAG_SPAN") is not None:
        tcv.DIAG_SPAN = float(cfg["DIAG_SPAN"])
    if HAS_FAST_CHUNKS and cfg.get("FAST_CHUNKS") is not None:
        tcv.FAST_CHUNKS = bool(cfg["FAST_CHUNKS"])
    if HAS_SKIP_SUB_CHUNKS and cfg.get("SKIP_SUB_CHUNKS") is not None:
        tcv.SKIP_SUB_CHUNKS = bool(cfg["SKIP_SUB_CHUNKS"])
    if HAS_PRE_GATE and cfg.get("PRE_GATE") is not None:
        tcv.PRE_GATE = bool(cfg["PRE_GATE"])
    try:
        yield
    finally:
        tcv.VEC_TILES.clear()
        tcv.VEC_TILES.update(saved["VEC_TILES"])
        tcv.GATED_BO = saved["GATED_BO"]
        if HAS_DIAG_LOOP:
            tcv.DIAG_LOOP = saved["DIAG_LOOP"]
        if HAS_SCORES:
            tcv.SCORES = saved["SCORES"]
            tcv.SCORE_TILES.clear()
            tcv.SCORE_TILES.update(saved["SCORE_TILES"])
        if HAS_WALK_UNROLL:
            tcv.WALK_UNROLL = saved["WALK_UNROLL"]
        if HAS_SPLIT_INTER:
            tcv.SPLIT_INTER = saved["SPLIT_INTER"]
        if HAS_DIAG_SPAN:
            tcv.DIAG_SPAN = saved["DIAG_SPAN"]
        if HAS_FAST_CHUNKS:
            tcv.FAST_CHUNKS = saved["FAST_CHUNKS"]
        if HAS_SKIP_SUB_CHUNKS:
            tcv.SKIP_SUB_CHUNKS = saved["SKIP_SUB_CHUNKS"]
        if HAS_PRE_GATE:
            tcv.PRE_GATE = saved["PRE_GATE"]


def fmt(t) -> str:
    return ",".join(map(str, t)) if isinstance(t, (tuple, list)) else str(t)
