"""Plots of a bench report (matplotlib, the optional ``plots`` extra): runtime vs sequence
length per family with its peers, memory vs chunk size, and a roofline chart. Each function
takes the report's rows and writes a PNG; :func:`make_plots` writes every plot the rows allow
and returns their paths."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from linrnn.bench import flops, peers, registry


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _ok(rows, key):
    return [r for r in rows if r.get(key) is not None and r.get("status") == "ok"]


def _label(r) -> str:
    if r["library"] == "linrnn":
        return f"linrnn {r['op']} {r['mode']}" + (f" L={r['chunk']}" if r.get("chunk") else "")
    return r["op"]


FIXED_T_SUITES = ("chunksize", "headdim")  # one T per op and head dim: points, not lines


def length_rows(rows: list[dict], key: str) -> list[dict]:
    """The rows :func:`runtime_vs_length` draws: ok rows with ``key``; in a report merged from
    several suites, not those of the suites that hold T fixed (the paper suite's lines stay
    readable)."""
    if len({r.get("suite") for r in rows}) > 1:
        rows = [r for r in rows if r.get("suite") not in FIXED_T_SUITES]
    return _ok(rows, key)


def runtime_vs_length(rows: list[dict], out_dir: Path, key: str = "fwdbwd_ms") -> list[Path]:
    """One PNG per family: ``key`` (ms) against T, one line per op × mode × chunk size and per
    peer sharing that family's inputs, at each (H, K, V) (the rows of :func:`length_rows`)."""
    plt = _pyplot()
    by_family = defaultdict(list)
    for r in length_rows(rows, key):
        by_family[registry.OPS[peers.like_of(r["op"])].family].append(r)
    paths = []
    for family, fam_rows in sorted(by_family.items()):
        lines = defaultdict(list)
        for r in fam_rows:
            s = registry.parse_shape(r["shape"])
            lines[(_label(r), f"H{s['H']}-K{s['K']}-V{s['V']}")].append((s["T"], r[key]))
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (label, heads), pts in sorted(lines.items()):
            pts.sort()
            ax.plot(*zip(*pts), marker="o", label=f"{label} ({heads})")
        ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel=f"{key} (ms)")
        ax.set_title(f"{family}: {'forward+backward' if 'bwd' in key else 'forward'} time")
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
        fig.tight_layout()
        path = Path(out_dir) / f"runtime-vs-T-{family}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")  # legend beside the axes
        plt.close(fig)
        paths.append(path)
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
                t = r.get("fwdbwd_ms") or r.get("fwd_ms")
                lines[(r["op"], r["shape"])].append((r["chunk"], mem, t))
    lines = {k: sorted(v) for k, v in lines.items() if len(v) > 1}
    if not lines:
        return []
    fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(11, 4.5))
    for (op, shape), pts in sorted(lines.items()):
        L = [p[0] for p in pts]
        if any(p[1] is not None for p in pts):
            ax_m.plot(L, [p[1] for p in pts], marker="o", label=f"{op} {shape}")
        ax_t.plot(L, [p[2] for p in pts], marker="o", label=f"{op} {shape}")
    ax_m.set(xscale="log", xlabel="chunk size L", ylabel="peak memory (MiB)")
    ax_m.set_title("peak memory vs chunk size")
    ax_t.set(xscale="log", yscale="log", xlabel="chunk size L", ylabel="time (ms)")
    ax_t.set_title("time vs chunk size (fwd+bwd where measured)")
    for ax in (ax_m, ax_t):
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    path = Path(out_dir) / "memory-vs-chunk.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")  # legend beside the axes
    plt.close(fig)
    return [path]


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
    fig.tight_layout()
    path = Path(out_dir) / "roofline.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")  # legend beside the axes
    plt.close(fig)
    return [path]


def make_plots(report: dict, out_dir: Path) -> list[Path]:
    """Every plot the report's rows allow, as PNGs in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report["bench"]
    key = "fwdbwd_ms" if any(r.get("fwdbwd_ms") for r in rows) else "fwd_ms"
    return [
        *runtime_vs_length(rows, out_dir, key),
        *memory_vs_chunk(rows, out_dir),
        *roofline_chart(rows, report.get("gpu_spec"), out_dir),
    ]
