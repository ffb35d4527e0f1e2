"""Measuring the chunk size: ``linrnn bench --suite chunksize --save-cache`` writes the user
cache that ``chunk_size="auto"`` reads (:func:`linrnn.engine.config.auto_chunk_size`), and
:func:`chunk_size_choice` explains a choice, optionally under a memory budget::

    from linrnn.bench.autotune import choose_chunk_size

    L = choose_chunk_size("mlstm[exp]", K=256, V=256, dtype=torch.bfloat16, device=q.device)
    # under a memory budget for a known call shape (B, T, H):
    L = choose_chunk_size("gla", 128, 128, torch.bfloat16, "cuda",
                          memory_budget=40 * 2**30, shape=(8, 8192, 32))

``family`` is an op name of :data:`linrnn.bench.registry.OPS` (``"mlstm[exp]"``,
``"linear_attn[normalize]"``, …) or a family name (``"mlstm"`` means ``"mlstm[exp]"``).

Measured choice: the chunksize suite times every op in mode "chunk" at L = 64 … 4096 and writes
one entry per (op, K, V, dtype, device name, linrnn version) to
``~/.cache/linrnn/chunk_size.json`` (``$LINRNN_CACHE_DIR`` or ``cache_dir`` elsewhere). The
fastest L wins (forward + backward by default, ``objective="fwd"`` for prefill); with
``memory_budget`` (bytes) the fastest L whose measured peak fits, the peak scaled linearly from
the measured shape to ``shape`` (every buffer of the chunk path is linear in B·T·H at fixed K,
V, L). When none fits, the L with the smallest peak.

Without a user measurement (and without a budget) the choice is ``chunk_size="auto"``'s:
linrnn's measurement on this GPU model, else the analytical estimate
(:func:`linrnn.engine.config.analytical_chunk_size`); with a budget and a shape, the smallest
L ≥ the analytical estimate whose :func:`~linrnn.bench.flops.chunk_memory_bytes` fits.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os

from linrnn.bench import flops, registry
from linrnn.engine.config import (  # noqa: F401  (the cache's reading side)
    CACHE_FORMAT,
    CACHE_NAME,
    CANDIDATES,
    analytical_chunk_size,
    cache_dir,
    cache_key,
    cached_timings,
    device_name,
    dtype_name,
    fastest,
    load_cache,
    shipped_chunk_size,
)


@dataclasses.dataclass(frozen=True)
class Choice:
    """A chunk-size decision and where it came from: "measured" (the user cache), "shipped"
    (linrnn's table, :data:`linrnn.engine.config.MEASURED_CHUNK_SIZES`) or "analytical"."""

    chunk_size: int
    source: str
    reason: str
    key: str
    measured: dict | None = None  # L -> figures, for a measured choice


def save_measurements(rows: list[dict], gpu: str, directory=None, commit: str | None = None):
    """Write one cache entry per (op, K, V, dtype) from bench rows of linrnn ops in mode
    "chunk" whose status is ok (the latest measurement replaces an older one). Returns the
    keys written."""
    data = load_cache(directory, reload=True)
    groups: dict = {}
    for r in rows:
        if r.get("library") != "linrnn" or r.get("mode") != "chunk" or r.get("status") != "ok":
            continue
        shape = registry.parse_shape(r["shape"])
        key = cache_key(r["op"], shape["K"], shape["V"], r["dtype"], gpu)
        entry = groups.setdefault(key, {"shape": r["shape"], "measured": {}})
        if entry["shape"] != r["shape"]:  # keep the shape with the most tokens × heads
            n = lambda s: math.prod(registry.parse_shape(s)[d] for d in "BTH")  # noqa: E731
            if n(r["shape"]) < n(entry["shape"]):
                continue
            if n(r["shape"]) > n(entry["shape"]):
                entry.update(shape=r["shape"], measured={})
        entry["measured"][str(r["chunk"])] = {
            k: r.get(k) for k in ("fwd_ms", "fwdbwd_ms", "peak_fwd_mib", "peak_fwdbwd_mib")
        }
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    for key, entry in groups.items():
        data["entries"][key] = {**entry, "date": now, "git_commit": commit}
    path = cache_dir(directory) / CACHE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return sorted(groups)


def _as_shape(shape) -> tuple[int, int, int] | None:
    if shape is None:
        return None
    if isinstance(shape, str):
        s = registry.parse_shape(shape)
        return s["B"], s["T"], s["H"]
    B, T, H = shape
    return int(B), int(T), int(H)


def chunk_size_choice(
    family: str,
    K: int,
    V: int,
    dtype,
    device=None,
    memory_budget: float | None = None,
    *,
    shape=None,
    objective: str = "fwdbwd",
    cache_dir=None,
    gpu: str | None = None,
) -> Choice:
    """The full decision behind :func:`choose_chunk_size` (same arguments), with its source,
    a one-line reason and the measurements used. ``gpu`` overrides the device name (tests)."""
    op = registry.resolve_op(family).name
    if objective not in ("fwdbwd", "fwd"):
        raise ValueError(f"objective must be 'fwdbwd' or 'fwd', got {objective!r}")
    if memory_budget is not None and not memory_budget > 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget}")
    gpu = gpu or device_name(device)
    key = cache_key(op, K, V, dtype, gpu)
    call_shape = _as_shape(shape)
    measured, entry = cached_timings(op, K, V, dtype, gpu, objective, cache_dir)
    if measured:
        fits = list(measured)
        why = f"fastest measured {objective} at {entry['shape']}"
        if memory_budget is not None:
            m = registry.parse_shape(entry["shape"])
            scale = (
                1.0 if call_shape is None else math.prod(call_shape) / (m["B"] * m["T"] * m["H"])
            )

            def peak(L):
                f = measured[L]
                mib = f.get("peak_fwdbwd_mib") if objective == "fwdbwd" else f.get("peak_fwd_mib")
                return None if mib is None else mib * 2**20 * scale

            known = [L for L in measured if peak(L) is not None]
            fits = [L for L in known if peak(L) <= memory_budget]
            if fits:
                why += f" whose peak fits {memory_budget / 2**20:.0f} MiB"
            elif known:
                best = min(known, key=peak)
                return Choice(
                    best, "measured", "no measured L fits the budget; smallest peak", key,
                    measured,
                )  # fmt: skip
            else:
                fits, why = list(measured), why + " (no peak memory measured on this device)"
        return Choice(fastest(measured, objective, fits), "measured", why, key, measured)

    shipped = shipped_chunk_size(op, K, V, dtype, gpu) if memory_budget is None else None
    if shipped is not None:
        return Choice(shipped, "shipped", "linrnn's measurement on this GPU model", key)

    L, L_opt, intensity = analytical_chunk_size(K, V, gpu)
    why = f"no measurement cached; App. G runtime model L_opt={L_opt:.0f} at I_acc={intensity:.0f}"
    if memory_budget is not None:
        if call_shape is None:
            why += "; memory budget ignored (no shape given)"
        else:
            B, T, H = call_shape
            name = dtype_name(dtype)
            elt, gates = flops.DTYPE_BYTES[name], registry.OPS[op].gate_elems(K, V)
            need = lambda c: flops.chunk_memory_bytes(B, T, H, K, V, c, elt, gates)  # noqa: E731
            ok = [c for c in CANDIDATES if c >= L and need(c) <= memory_budget]
            L = ok[0] if ok else CANDIDATES[-1]
            why += f"; smallest L ≥ it within {memory_budget / 2**20:.0f} MiB (analytical)"
    return Choice(L, "analytical", why, key)


def choose_chunk_size(
    family: str,
    K: int,
    V: int,
    dtype,
    device=None,
    memory_budget: float | None = None,
    **options,
) -> int:
    """The chunk size L for ``mode="chunk"`` of ``family`` at head dims ``K``, ``V``.

    Args:
        family: op or family name (``"mlstm[exp]"``, ``"simple_gla"``, ``"mlstm"`` …).
        K, V: head dims of queries/keys and of values.
        dtype: input dtype (``torch.bfloat16`` or ``"bf16"``, …).
        device: where the op runs (``torch.device``, ``"cuda"``, ``"cpu"``; None: CPU).
        memory_budget: optional peak-memory budget in bytes for one forward + backward;
            pass ``shape=(B, T, H)`` to apply it to that call (else to the measured shape).
        **options: ``shape``, ``objective`` ("fwdbwd" or "fwd"), ``cache_dir``, ``gpu``.

    Returns the fastest measured L (cache under ``~/.cache/linrnn/``), else linrnn's
    measurement on this GPU model, else the analytical estimate; see
    :func:`chunk_size_choice`."""
    return chunk_size_choice(family, K, V, dtype, device, memory_budget, **options).chunk_size
