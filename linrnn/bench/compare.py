"""Ratios read off one report's rows: each linrnn op against the peers that share its inputs,
and the delta rule's and Mamba2's targets.

* :func:`peer_ratios`: per peer row, the linrnn row of the op it matches (``Peer.like``) at the
  same shape and dtype (mode chunk at the op's default chunk size, else the only linrnn row):
  peer time / linrnn time for the forward and for forward+backward (> 1: linrnn is faster),
  linrnn's peak memory / the peer's (< 1: linrnn needs less), and both first calls.
* :func:`delta_targets`: the delta-rule families' targets (:data:`DELTA_TARGETS`) per shape,
  each with its measured value and whether it is met; a row that did not finish is named by
  its status instead. :func:`mamba2_targets` likewise for Mamba2 (:data:`MAMBA2_TARGETS`).
"""

from __future__ import annotations

from linrnn.bench import peers, registry, report

# (name, what, bound): the ratios the delta rule aims at, from rows of one run (bf16).
DELTA_TARGETS = (
    ("delta fwd+bwd speed-up", "fla:chunk_delta_rule / linrnn delta_rule, fwd+bwd ms", ">= 1.3"),
    ("delta peak memory", "linrnn delta_rule / fla:chunk_delta_rule, fwd+bwd peak MiB", "<= 1"),
    ("gated fwd speed-up", "fla:chunk_gated_delta_rule / linrnn gated_delta_rule, fwd ms",
     ">= 1.2"),
    ("gate cost", "linrnn gated_delta_rule / linrnn delta_rule, fwd+bwd ms", "<= 1.15"),
    ("first call", "linrnn first forward+backward (fresh Triton cache), s", "< 30"),
    ("decode", "linrnn step in a CUDA graph / memory floor", "<= 1.2"),
)  # fmt: skip
# (name, what, bound): the engine families' targets in the heads suite (bf16): linrnn's best
# mode against the best peer of the same inputs, per op (family variant) and shape
ENGINE_TARGETS = (
    ("fwd+bwd speed-up", "best peer / linrnn's best mode, fwd+bwd ms", ">= 1.25"),
    ("fwd speed-up", "best peer / linrnn's best mode, fwd ms", ">= 1.2"),
    ("fwd x floor", "linrnn's best forward / its floor, at K = V = 256", "<= 3"),
    ("exp / sigmoid", "mlstm[exp] / mlstm[sigmoid], best fwd+bwd ms", "<= 1.1"),
)  # fmt: skip
MAMBA_SSM = "mamba_ssm:mamba_chunk_scan_combined"
FLA_MAMBA2 = "fla:chunk_simple_gla[mamba2]"
# (name, what, bound): Mamba2's (the TFLA paper's margin over Mamba2's kernel; bf16, one run)
MAMBA2_TARGETS = (
    ("mamba2 fwd+bwd speed-up vs mamba_ssm", f"{MAMBA_SSM} / linrnn mamba2, fwd+bwd ms",
     ">= 2"),
    ("mamba2 fwd+bwd speed-up vs fla mapped", f"{FLA_MAMBA2} / linrnn mamba2, fwd+bwd ms",
     ">= 1.3"),
    ("first call", "linrnn first forward+backward (fresh Triton cache), s", "< 30"),
)  # fmt: skip


def _ok(row: dict | None) -> bool:
    return row is not None and report.ok_status(row["status"])


def linrnn_rows(rows: list[dict]) -> dict:
    """``{(op, shape, dtype, layout): row}`` of the linrnn rows a peer is compared with: mode
    chunk at the default chunk size where there is one (decode rows: their one row)."""
    out: dict = {}
    for r in rows:
        if r["library"] != "linrnn":
            continue
        key = (r["op"], r["shape"], r.get("dtype"), r.get("layout"))
        default = r.get("chunk_requested") is None
        rank = (r.get("mode") in ("chunk", "recurrent") and default, _ok(r))
        old = out.get(key)
        if old is None or rank > old[0]:
            out[key] = (rank, r)
    return {k: r for k, (_, r) in out.items()}


def _ratio(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0:
        return a / b
    return None


def _get(r: dict | None, key: str):
    return None if r is None else r.get(key)


def _peak(r: dict | None):
    return _get(r, "peak_fwdbwd_mib")


def first_call(r: dict) -> str:
    """A row's first call in s: forward+backward; "f" after it: the forward alone (a row
    without a backward, or whose backward failed); ">" before it: a first call that never
    finished (the worker died or timed out after that long); "—": none."""
    if r.get("first_call_s") is not None:
        return f"{r['first_call_s']:.1f}" + ("f" if r.get("fwd_only") else "")
    if r.get("first_call_s_at_least") is not None:
        return f">{r['first_call_s_at_least']:.1f}"
    if r.get("first_fwd_s") is not None:
        return f"{r['first_fwd_s']:.1f}f"
    return "—"


def peer_ratios(rows: list[dict]) -> list[dict]:
    """One entry per peer row with a linrnn row to compare: ``fwd_speedup`` (peer / linrnn
    forward ms), ``fwdbwd_speedup``, ``peak_ratio`` (linrnn / peer fwd+bwd peak MiB), the first
    calls (:func:`first_call`) and both statuses."""
    ours = linrnn_rows(rows)
    out = []
    for p in rows:
        if p["library"] == "linrnn" or p["op"] not in peers.PEERS:
            continue
        mine = ours.get((peers.like_of(p["op"]), p["shape"], p.get("dtype"), p.get("layout")))
        if mine is None:
            continue
        out.append(
            {
                "op": mine["op"],
                "peer": p["op"],
                "shape": p["shape"],
                "layout": p.get("layout"),
                "fwd_speedup": _ratio(p.get("fwd_ms"), mine.get("fwd_ms")),
                "fwdbwd_speedup": _ratio(p.get("fwdbwd_ms"), mine.get("fwdbwd_ms")),
                "peak_ratio": _ratio(_peak(mine), _peak(p)),
                "first_call": first_call(mine),
                "peer_first_call": first_call(p),
                "status": mine["status"],
                "peer_status": p["status"],
            }
        )
    return out


def _verdict(value, bound: str) -> str:
    if value is None:
        return "—"
    op, limit = bound.split()
    limit = float(limit)
    met = {">=": value >= limit, "<=": value <= limit, "<": value < limit}[op]
    return "met" if met else "missed"


def _target_rows(rows: list[dict]) -> tuple[dict, dict]:
    """``(ours, by_op)``: the linrnn rows a target reads (:func:`linrnn_rows`, not varlen)
    and every row, by ``(op, shape, dtype)``."""
    ours = {k[:3]: r for k, r in linrnn_rows(rows).items() if k[3] is None}  # not varlen
    by_op: dict = {}
    for r in rows:
        if r.get("layout") is None:
            by_op.setdefault((r["op"], r["shape"], r.get("dtype")), r)
    return ours, by_op


def _adder(out: list, table: tuple, ours: dict, by_op: dict):
    """``add(name, shape, value, mine, other_op=None)``: appends one target of ``table`` to
    ``out``, with why it has no value (a row not ok, or ``other_op``'s row missing)."""
    bounds = {name: bound for name, _, bound in table}

    def add(name, shape, value, mine, other_op=None):
        key = (other_op, shape, mine.get("dtype"))
        other = (ours.get(key) or by_op.get(key)) if other_op else None
        not_ok = [r for r in (mine, other) if r and r["status"] != "ok"]
        why = "; ".join(f"{r['op']}: {r['status'][:80]}" for r in not_ok)
        if not why and other_op and other is None:
            why = f"no {other_op} row"
        out.append(
            {
                "target": name,
                "shape": shape,
                "value": value,
                "bound": bounds[name],
                "verdict": _verdict(value, bounds[name]),
                "why": why,
            }
        )

    return add


def delta_targets(rows: list[dict]) -> list[dict]:
    """The delta-rule targets met or missed per shape (rows of the delta and decode suites):
    ``{"target", "shape", "value", "bound", "verdict", "why"}``; ``why`` names the status of
    a row that gave no value."""
    ours, by_op = _target_rows(rows)
    out: list = []
    add = _adder(out, DELTA_TARGETS, ours, by_op)

    keys = [k for k in ours if k[0] in ("delta_rule", "gated_delta_rule")]  # in the rows' order
    for op, shape, dtype in keys:
        r = ours[(op, shape, dtype)]
        if "step_ms" in r:  # decode
            add("decode", shape, r.get("graph_x_floor"), r)
            continue
        if op == "delta_rule":
            fla = by_op.get(("fla:chunk_delta_rule", shape, dtype))
            speedup = _ratio(_get(fla, "fwdbwd_ms"), r.get("fwdbwd_ms"))
            add("delta fwd+bwd speed-up", shape, speedup, r, "fla:chunk_delta_rule")
            memory = _ratio(_peak(r), _peak(fla))
            add("delta peak memory", shape, memory, r, "fla:chunk_delta_rule")
        else:
            fla = by_op.get(("fla:chunk_gated_delta_rule", shape, dtype))
            speedup = _ratio(_get(fla, "fwd_ms"), r.get("fwd_ms"))
            add("gated fwd speed-up", shape, speedup, r, "fla:chunk_gated_delta_rule")
            plain = ours.get(("delta_rule", shape, dtype))
            cost = _ratio(r.get("fwdbwd_ms"), _get(plain, "fwdbwd_ms"))
            add("gate cost", shape, cost, r, "delta_rule")
        if r.get("first_in_process", True):  # later items reuse the compiled kernels
            add("first call", f"{shape} ({op})", r.get("first_call_s"), r)
    return out


def mamba2_targets(rows: list[dict]) -> list[dict]:
    """Mamba2's targets per shape (:data:`MAMBA2_TARGETS`: fwd+bwd speed-ups over mamba_ssm's
    kernel and fla's mapped simple GLA, the first call), as :func:`delta_targets`."""
    ours, by_op = _target_rows(rows)
    out: list = []
    add = _adder(out, MAMBA2_TARGETS, ours, by_op)
    for op, shape, dtype in [k for k in ours if k[0] == "mamba2"]:  # in the rows' order
        r = ours[(op, shape, dtype)]
        for name, peer in ((MAMBA2_TARGETS[0][0], MAMBA_SSM), (MAMBA2_TARGETS[1][0], FLA_MAMBA2)):
            other = by_op.get((peer, shape, dtype))
            add(name, shape, _ratio(_get(other, "fwdbwd_ms"), r.get("fwdbwd_ms")), r, peer)
        if r.get("first_in_process", True):  # later items reuse the compiled kernels
            add("first call", f"{shape} ({op})", r.get("first_call_s"), r)
    return out


def _best(rows: list[dict], key: str) -> dict | None:
    """The row with the least ``key`` (None when none has it; a row whose backward failed
    still has its forward's time)."""
    timed = [r for r in rows if isinstance(r.get(key), (int, float)) and r[key] > 0]
    return min(timed, key=lambda r: r[key]) if timed else None


def _label(r: dict) -> str:
    return (r.get("mode") or "") if r["library"] == "linrnn" else r["op"]


def engine_targets(rows: list[dict]) -> list[dict]:
    """The engine families' targets (:data:`ENGINE_TARGETS`) per linrnn op and shape of the
    heads suite's rows, as :func:`delta_targets`: linrnn's fastest mode (at its default chunk
    size) against the fastest peer row of the same inputs, for fwd+bwd and for the forward
    alone (each picks its own fastest rows; ``why`` names them), the forward's × floor at
    K = V = 256, and mLSTM exp over sigmoid."""
    bounds = {name: bound for name, _, bound in ENGINE_TARGETS}
    out: list = []

    def add(name, op, shape, value, why):
        out.append({"target": f"{op} {name}", "shape": shape, "value": value,
                    "bound": bounds[name], "verdict": _verdict(value, bounds[name]),
                    "why": why})  # fmt: skip

    groups: dict = {}
    for r in rows:
        if r.get("suite") != "heads" or r.get("layout") is not None:
            continue
        if r["op"] in peers.PEERS or r.get("chunk_requested") is None:
            groups.setdefault((peers.like_of(r["op"]), r["shape"], r.get("dtype")), []).append(r)
    for (op, shape, dtype), group in groups.items():
        mine = [r for r in group if r["library"] == "linrnn"]
        theirs = [r for r in group if r["library"] != "linrnn"]
        if not mine:
            continue
        for name, key in (("fwd+bwd speed-up", "fwdbwd_ms"), ("fwd speed-up", "fwd_ms")):
            if not theirs:
                continue
            a, b = _best(mine, key), _best(theirs, key)
            value = _ratio(_get(b, key), _get(a, key))
            failed = [r for r in (*mine, *theirs) if not _ok(r) or r.get(key) is None]
            why = (f"{_label(a)} against {_label(b)}" if value is not None else
                   "; ".join(f"{r['op']}: {r['status'][:60]}" for r in failed))  # fmt: skip
            add(name, op, shape, value, why)
        dims = registry.parse_shape(shape)
        if dims["K"] == dims["V"] == 256:
            a = _best(mine, "fwd_ms")
            add("fwd x floor", op, shape, _get(a, "x_floor"), _label(a) if a else "no ok row")
        if op == "mlstm[exp]":
            sig = [r for r in groups.get(("mlstm[sigmoid]", shape, dtype), [])
                   if r["library"] == "linrnn"]  # fmt: skip
            a, b = _best(mine, "fwdbwd_ms"), _best(sig, "fwdbwd_ms")
            value = _ratio(_get(a, "fwdbwd_ms"), _get(b, "fwdbwd_ms"))
            why = f"{_label(a)} / {_label(b)}" if value is not None else "no ok pair of rows"
            add("exp / sigmoid", "mlstm", shape, value, why)
    return out


def _num(x, fmt=".2f") -> str:
    return "—" if x is None else format(x, fmt)


RATIO_HEADER = ("op", "peer", "shape", "fwd ×", "fwd+bwd ×", "peak ratio", "first s",
                "peer first s", "peer status")  # fmt: skip
TARGET_HEADER = ("target", "shape", "value", "bound", "verdict", "why")


def ratio_cells(rows: list[dict]) -> list[tuple]:
    return [
        (e["op"], e["peer"], e["shape"] + (f":{e['layout']}" if e["layout"] else ""),
         _num(e["fwd_speedup"]), _num(e["fwdbwd_speedup"]), _num(e["peak_ratio"]),
         e["first_call"], e["peer_first_call"],
         e["peer_status"][:60])
        for e in peer_ratios(rows)
    ]  # fmt: skip


def target_cells(rows: list[dict], targets=delta_targets) -> list[tuple]:
    return [
        (t["target"], t["shape"], _num(t["value"]), t["bound"], t["verdict"], t["why"][:100])
        for t in targets(rows)
    ]


TARGET_TABLES = (
    ("engine targets", engine_targets),
    ("delta-rule targets", delta_targets),
    ("Mamba2 targets", mamba2_targets),
)


RATIO_NOTE = (
    "fwd × and fwd+bwd × = peer ms / linrnn ms (> 1: linrnn faster); peak ratio = linrnn / peer "
    "fwd+bwd peak MiB (< 1: linrnn needs less); first s = first forward+backward incl. compile "
    "(f: the forward alone, > : never finished)"
)


def text(rows: list[dict]) -> str:
    """The tables as plain text ("" when none has a line)."""
    parts = []
    ratios = ratio_cells(rows)
    if ratios:
        parts.append(f"linrnn against its peers: {RATIO_NOTE}")
        parts.append(report.format_table(RATIO_HEADER, ratios, (0, 0, 0, 1, 1, 1, 1, 1, 0)))
    for title, fn in TARGET_TABLES:
        targets = target_cells(rows, fn)
        if targets:
            parts.append(f"{title}:")
            parts.append(report.format_table(TARGET_HEADER, targets, (0, 0, 1, 0, 0, 0)))
    return "\n".join(parts)


def markdown_lines(rows: list[dict]) -> list[str]:
    """The tables in Markdown (no lines when none has one)."""
    lines: list[str] = []
    ratios = ratio_cells(rows)
    if ratios:
        lines += ["", "### linrnn against its peers", "", RATIO_NOTE + ".", ""]
        lines += report.md_table(RATIO_HEADER, ratios)
    for title, fn in TARGET_TABLES:
        targets = target_cells(rows, fn)
        if targets:
            lines += ["", f"### {title}", ""]
            lines += report.md_table(TARGET_HEADER, targets)
    return lines
