"""Plots of a bench report (matplotlib, the optional ``plots`` extra): per family, runtime
against sequence length (linrnn solid in the family's colour, peers dashed) and grouped bars
of linrnn against each peer at one shape (forward, forward+backward, memory); memory and time
against the chunk size; a roofline chart; and the train suite's loss curves. Each function
takes the report's rows and writes a PNG; :func:`make_plots` writes every plot the rows allow
and returns their paths."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from linrnn.bench import flops, peers, registry


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out_dir, name: str, beside: bool = False) -> Path:
    """Write ``fig`` to ``out_dir/name`` (120 dpi; ``beside``: a legend beside the axes kept in
    the image) and close it."""
    fig.tight_layout()
    path = Path(out_dir) / name
    fig.savefig(path, dpi=120, **({"bbox_inches": "tight"} if beside else {}))
    _pyplot().close(fig)
    return path


def _ok(rows, key):
    return [r for r in rows if r.get(key) is not None and r.get("status") == "ok"]


def _label(r) -> str:
    if r["library"] == "linrnn":
        return f"linrnn {r['op']} {r['mode']}" + (f" L={r['chunk']}" if r.get("chunk") else "")
    return r["op"]


def family_of(r) -> str:
    return registry.OPS[peers.like_of(r["op"])].family


def is_linrnn(r) -> bool:
    return peers.library_of(r["op"]) == "linrnn"


FAMILY_COLORS = {  # one colour per family, the same in every plot
    "linear_attn": "tab:blue",
    "retention": "tab:orange",
    "simple_gla": "tab:green",
    "gla": "tab:red",
    "rwkv6": "tab:purple",
    "mlstm": "tab:brown",
    "delta_rule": "tab:pink",
    "gated_delta_rule": "tab:cyan",
    "mamba2": "tab:olive",
}
PEER_MARKERS = "s^vD<>xP*"
FIXED_T_SUITES = ("chunksize", "headdim")  # one T per op and head dim: points, not lines


def length_rows(rows: list[dict], key: str) -> list[dict]:
    """The rows :func:`runtime_vs_length` draws: ok rows with ``key``; in a report merged from
    several suites, not those of the suites that hold T fixed (the paper suite's lines stay
    readable)."""
    if len({r.get("suite") for r in rows}) > 1:
        rows = [r for r in rows if r.get("suite") not in FIXED_T_SUITES]
    return _ok(rows, key)


def heads_of(shape: str) -> str:
    s = registry.parse_shape(shape)
    value_heads = f"-HV{s['HV']}" if registry.grouped(s) else ""
    return f"H{s['H']}{value_heads}-K{s['K']}-V{s['V']}"


def _tokens(x, _pos=None) -> str:
    """Tick label of a sequence length: 2048 -> "2K", 1048576 -> "1M"."""
    for unit, div in (("M", 2**20), ("K", 2**10)):
        if x >= div and x % div == 0:
            return f"{int(x // div)}{unit}"
    return f"{int(x)}"


def length_lines(rows: list[dict], key: str) -> dict:
    """``{family: {heads: {label: [(T, value)]}}}``: one line per linrnn op in mode chunk
    (its rows at the default chunk size, the smallest chunk where several) and per peer, at
    each head configuration. fused_chunk and other chunk sizes stay in the tables."""
    lines: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    chosen = {}
    for r in length_rows(rows, key):
        if is_linrnn(r) and r.get("mode") != "chunk":
            continue
        k = (r["op"], r["shape"])
        if k not in chosen or (r.get("chunk") or 0) < (chosen[k].get("chunk") or 0):
            chosen[k] = r
    for r in chosen.values():
        T = registry.parse_shape(r["shape"])["T"]
        label = f"linrnn {r['op']}" if is_linrnn(r) else r["op"]
        lines[family_of(r)][heads_of(r["shape"])][label].append((T, r[key]))
    out: dict = {}  # lines of two or more lengths only (a suite at one T draws none)
    for family, by_heads in lines.items():
        for heads, by_label in by_heads.items():
            kept = {label: pts for label, pts in by_label.items() if len(pts) > 1}
            if kept:
                out.setdefault(family, {})[heads] = kept
    return out


def _grid(plt, n: int, width: float = 5.2, height: float = 4.6):
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def runtime_vs_length(rows: list[dict], out_dir: Path, key: str = "fwdbwd_ms") -> list[Path]:
    """One PNG per family, one panel per head configuration: ``key`` (ms) against T; linrnn's
    ops solid in the family's colour, each peer dashed in grey with its own marker."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    plt = _pyplot()
    paths = []
    what = "forward+backward" if "bwd" in key else "forward"
    for family, by_heads in sorted(length_lines(rows, key).items()):
        fig, axes = _grid(plt, len(by_heads))
        color = FAMILY_COLORS.get(family, "black")
        for ax, (heads, lines) in zip(axes, sorted(by_heads.items())):
            ts = sorted({t for pts in lines.values() for t, _ in pts})
            mine = sorted(k for k in lines if k.startswith("linrnn "))
            others = sorted(k for k in lines if not k.startswith("linrnn "))
            for j, label in enumerate(mine):
                pts = sorted(lines[label])
                ax.plot(*zip(*pts), color=color, lw=2.2, marker="os^D"[j % 4],
                        linestyle=("-", "-.", ":")[j % 3], label=label)  # fmt: skip
            for j, label in enumerate(others):
                pts = sorted(lines[label])
                ax.plot(*zip(*pts), color=f"{0.25 + 0.5 * j / max(1, len(others))}", lw=1.4,
                        linestyle="--", marker=PEER_MARKERS[j % len(PEER_MARKERS)],
                        label=label)  # fmt: skip
            ax.set(xscale="log", xlabel="sequence length T", ylabel=f"{what} time (ms)")
            ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.05)
            ax.xaxis.set_major_locator(FixedLocator(ts))
            ax.xaxis.set_major_formatter(FuncFormatter(_tokens))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{family}, {heads}", fontsize=10)
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
                      frameon=False)  # fmt: skip
        fig.suptitle(f"{family}: {what} time against T (linrnn solid, peers dashed)", fontsize=11)
        paths.append(_save(fig, out_dir, f"runtime-vs-T-{family}.png"))
    return paths


BAR_METRICS = (  # (row key, axis label, scale to the unit)
    ("fwd_ms", "forward (ms)", 1.0),
    ("fwdbwd_ms", "forward+backward (ms)", 1.0),
    ("peak_fwdbwd_mib", "peak memory, fwd+bwd (GiB)", 1 / 1024),
)


def _rank(shape: str, n_peers: dict) -> tuple:
    """The bars' shape: the most peers, then the widest heads, then T nearest 8192."""
    d = registry.parse_shape(shape)
    return n_peers[shape], d["K"], -abs(math.log2(d["T"] / 8192))


def bar_rows(rows: list[dict], shape: str | None = None) -> dict:
    """``{family: (shape, [row, ...])}`` for the grouped bars: per family the shape with the
    most peers measured (``shape`` where given and measured), linrnn's ops in mode chunk (the
    fastest chunk size of each) first, then each peer."""
    by_family: dict = defaultdict(lambda: defaultdict(list))
    for r in _ok(rows, "fwdbwd_ms"):
        if is_linrnn(r) and r.get("mode") != "chunk":
            continue
        by_family[family_of(r)][r["shape"]].append(r)
    out = {}
    for family, by_shape in sorted(by_family.items()):
        n_peers = {s: len({r["op"] for r in rs if not is_linrnn(r)}) for s, rs in by_shape.items()}
        if not any(n_peers.values()):
            continue

        pick = shape if shape in by_shape else max(by_shape, key=lambda s: _rank(s, n_peers))
        best = {}
        for r in by_shape[pick]:
            if r["op"] not in best or r["fwdbwd_ms"] < best[r["op"]]["fwdbwd_ms"]:
                best[r["op"]] = r
        mine = [r for op, r in sorted(best.items()) if is_linrnn(r)]
        out[family] = (pick, mine + [r for op, r in sorted(best.items()) if not is_linrnn(r)])
    return out


def _bar_label(r) -> str:
    if is_linrnn(r):
        return f"linrnn {r['op']}" + (f" L={r['chunk']}" if r.get("chunk") else "")
    return r["op"].replace("mlstm_kernels:", "mlstm_kernels:\n").replace("fla:", "fla:\n")


def peer_bars(rows: list[dict], out_dir: Path, shape: str | None = None) -> list[Path]:
    """One PNG per family with peers: at one shape (:func:`bar_rows`), a panel per figure of
    :data:`BAR_METRICS`, one bar per op (linrnn in the family's colour, peers grey), the
    value written on each bar."""
    plt = _pyplot()
    paths = []
    for family, (pick, rs) in bar_rows(rows, shape).items():
        fig, axes = plt.subplots(1, 3, figsize=(4.2 * 3, 3.2 + 0.18 * len(rs)))
        color = FAMILY_COLORS.get(family, "black")
        labels = [_bar_label(r) for r in rs]
        colors = [color if is_linrnn(r) else "0.6" for r in rs]
        for ax, (key, axis, scale) in zip(axes, BAR_METRICS):
            vals = [r[key] * scale if r.get(key) is not None else 0.0 for r in rs]
            ys = range(len(rs))
            ax.barh(ys, vals, color=colors)
            for y, v, r in zip(ys, vals, rs):
                ax.text(v, y, f" {v:.3g}" if r.get(key) is not None else " n/a", va="center",
                        fontsize=7)  # fmt: skip
            ax.set_yticks(list(ys))
            ax.set_yticklabels(labels if ax is axes[0] else [""] * len(rs), fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel(axis)
            ax.set_xlim(0, max([*vals, 1e-9]) * 1.25)
            ax.grid(True, axis="x", alpha=0.3)
        fig.suptitle(f"{family} at {pick} (bf16; shorter is better)", fontsize=11)
        paths.append(_save(fig, out_dir, f"bars-{family}.png"))
    return paths


def memory_vs_chunk(rows: list[dict], out_dir: Path) -> list[Path]:
    """Peak memory (and time on a second axis) against the chunk size for linrnn chunk-mode
    rows measured at two or more chunk sizes."""
    plt = _pyplot()
    lines = defaultdict(list)
    for r in rows:
        if r.get("library") == "linrnn" and r.get("mode") == "chunk" and r.get("chunk"):
            if r.get("status") == "ok":
                mem = r.get("peak_fwdbwd_mib") or r.get("peak_fwd_mib")
                mem = mem / 1024 if mem is not None else None
                t = r.get("fwdbwd_ms") or r.get("fwd_ms")
                lines[(r["op"], r["shape"])].append((r["chunk"], mem, t))
    lines = {k: sorted(v) for k, v in lines.items() if len(v) > 1}
    if not lines:
        return []
    fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(11, 4.5))
    variant = defaultdict(int)  # the family's colour; its variants by line style and marker
    for (op, shape), pts in sorted(lines.items()):
        family = registry.OPS[op].family
        j = variant[family]
        variant[family] += 1
        style = dict(color=FAMILY_COLORS.get(family, "black"), linestyle=("-", "--", ":")[j % 3],
                     marker="os^D"[j % 4], label=f"{op} {heads_of(shape)}")  # fmt: skip
        L = [p[0] for p in pts]
        if any(p[1] is not None for p in pts):
            ax_m.plot(L, [p[1] for p in pts], **style)
        ax_t.plot(L, [p[2] for p in pts], **style)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    sizes = sorted({p[0] for pts in lines.values() for p in pts})
    for ax in (ax_m, ax_t):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{int(x)}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(True, which="major", alpha=0.3)
    ax_m.set(xlabel="chunk size L", ylabel="peak memory (GiB)")
    ax_m.set_title("peak memory vs chunk size")
    ax_t.set(yscale="log", xlabel="chunk size L", ylabel="time (ms)")
    ax_t.set_title("time vs chunk size (fwd+bwd where measured)")
    for ax in (ax_m, ax_t):
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    return [_save(fig, out_dir, "memory-vs-chunk.png", beside=True)]


def roofline_chart(rows: list[dict], spec: dict | None, out_dir: Path) -> list[Path]:
    """Achieved forward TFLOP/s against arithmetic intensity (FLOPs / algorithm bytes), with
    the device's roofline ``min(β·I, α)`` when its spec is known."""
    plt = _pyplot()
    pts = [r for r in _ok(rows, "fwd_tflops") if r.get("intensity")]
    if not pts:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = defaultdict(list)
    for r in pts:
        groups[_label(r).rsplit(" L=", 1)[0]].append((r["intensity"], r["fwd_tflops"]))
    for i, (label, xy) in enumerate(sorted(groups.items())):  # 10 colours × 3 markers
        ax.scatter(*zip(*xy), label=label, s=18, color=f"C{i % 10}", marker="os^"[i // 10 % 3])
    if spec:
        lo = min(p["intensity"] for p in pts) / 4
        hi = max(
            max(p["intensity"] for p in pts) * 4,
            4 * spec["bf16_dense_flops"] / spec["bandwidth_Bps"],
        )
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(xs, [flops.roofline(x, spec) / 1e12 for x in xs], "k-", lw=1,
                label=f"{spec['matched']} roofline (spec sheet)")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
           ylabel="achieved TFLOP/s (forward)")  # fmt: skip
    ax.set_title("roofline")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    return [_save(fig, out_dir, "roofline.png", beside=True)]


MIXER_FAMILY = {"mlstm_exp": "mlstm", "mlstm_sig": "mlstm", "delta_net": "delta_rule",
                "gated_delta_net": "gated_delta_rule"}  # fmt: skip


def smooth(values: list, beta: float = 0.9) -> list:
    """Bias-corrected exponential moving average (the per-step loss is noisy)."""
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta**i))
    return out


def loss_curves(rows: list[dict], out_dir: Path, machine: dict | None = None) -> list[Path]:
    """The train suite's loss curves: one PNG per shape, the training loss of every mixer
    (EMA 0.9, solid) and its validation loss (dashed, dots at the evaluations) against the step
    and against the training time; softmax in black, each linear mixer in its family's
    colour."""
    by_shape = defaultdict(list)
    for r in rows:
        if r.get("suite") == "train" and (r.get("curve") or {}).get("loss"):
            by_shape[r["shape"]].append(r)
    if not by_shape:
        return []
    plt = _pyplot()
    device = (machine or {}).get("gpu") or (machine or {}).get("device") or ""
    paths, styles = [], ("-", "--", ":")
    for shape, rs in by_shape.items():
        fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
        low, high, seen = math.inf, -math.inf, defaultdict(int)
        for r in rs:
            loss = smooth([float(v) for v in r["curve"]["loss"]])
            family = MIXER_FAMILY.get(r["op"], r.get("family") or r["op"])
            color = "black" if r["op"] == "softmax" else FAMILY_COLORS.get(family, "0.5")
            ls = styles[seen[color] % len(styles)]
            seen[color] += 1
            tps = r.get("tokens_per_s")
            label = r["op"] if tps is None else f"{r['op']} ({tps:,.0f} tok/s)"
            by_step.plot(r["curve"]["step"], loss, lw=1.2, color=color, ls=ls, label=label)
            by_time.plot(r["curve"]["time_s"], loss, lw=1.2, color=color, ls=ls)
            evals = r.get("evals") or []
            val = [e["val"] for e in evals]
            if val:
                style = {"ls": "--", "marker": ".", "lw": 0.8, "color": color, "alpha": 0.7}
                by_step.plot([e["step"] for e in evals], val, **style)
                by_time.plot([e["time_s"] for e in evals], val, **style)
            low = min(low, *loss, *val)
            high = max(high, loss[min(len(loss) - 1, max(len(loss) // 10, 1))], *val)
        if math.isfinite(low) and math.isfinite(high):
            by_step.set_ylim(max(low - 0.1, 0.0), max(high, low + 0.5) + 0.1)
        r0 = rs[0]
        model = r0.get("model") or {}
        fig.suptitle(
            f"byte-level LM, width {model.get('d_model')}, blocks {model.get('layers')}, "
            f"{shape} ({r0.get('tokens_per_step') or '?'} tokens per step), {r0.get('dtype')}, "
            f"{device}: training loss (EMA 0.9, solid), validation (dashed)",
            fontsize=10,
        )
        by_step.set_xlabel("step")
        by_time.set_xlabel("training time (s, first step excluded)")
        by_step.set_ylabel("cross-entropy (nats / byte)")
        for ax in (by_step, by_time):
            ax.grid(alpha=0.3)
        by_step.legend(fontsize=7)
        paths.append(_save(fig, out_dir, f"loss-curves-{shape}.png"))
    return paths


def make_plots(report: dict, out_dir: Path) -> list[Path]:
    """Every plot the report's rows allow, as PNGs in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report["bench"]
    key = "fwdbwd_ms" if any(r.get("fwdbwd_ms") for r in rows) else "fwd_ms"
    return [
        *runtime_vs_length(rows, out_dir, key),
        *peer_bars(rows, out_dir),
        *memory_vs_chunk(rows, out_dir),
        *roofline_chart(rows, report.get("gpu_spec"), out_dir),
        *loss_curves(rows, out_dir, report.get("machine")),
    ]
