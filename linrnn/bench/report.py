"""Reports: the machine (GPU name, driver, torch/Triton versions, git commit), terminal tables
(rich when installed, else plain text), JSON written atomically after every case, and a
progress bar (tqdm when installed, else one plain line per step on stderr)."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from linrnn.bench import registry
from linrnn.bench.worker import ROOT

SCHEMA_VERSION = 1
ROW_KEYS = (  # every bench row has these keys (None where not measured)
    "op", "library", "family", "mode", "backend", "chunk", "shape", "dtype", "status",
    "fwd_ms", "fwdbwd_ms", "peak_fwd_mib", "peak_fwdbwd_mib", "first_call_s",
    "fwd_flops", "fwdbwd_flops", "fwd_bytes", "min_bytes", "intensity",
    "fwd_tflops", "fwdbwd_tflops", "fwd_gbps", "floor_ms", "x_floor", "x_floor_fwdbwd",
)  # fmt: skip


def info_case(case: dict, item: dict) -> dict:
    """Versions and the device as the worker sees them (the parent need not touch CUDA)."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # CPU machines may lack it
        triton_version = None
    import linrnn

    info = {
        "torch": torch.__version__,
        "triton": triton_version,
        "linrnn": linrnn.__version__,
        "cuda_runtime": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "python": platform.python_version(),
    }
    for dist in ("fla-core", "flash-qla", "mlstm-kernels", "matplotlib"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = None
    from linrnn.bench import peers

    info["mamba-ssm"] = peers.mamba_ssm_version()  # also an sdist's source, not installed
    if torch.cuda.is_available() and case["device"] == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
        )
    return info


def git_commit(override: str | None = None) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the checkout holding linrnn (None outside a git checkout)."""
    if override:
        return override, None

    def git(*cmd):
        try:
            out = subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "HEAD"), None if status is None else bool(status)


def driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


def machine_info(info: dict, device: str, commit: str | None = None) -> dict:
    """The report's ``machine`` block: the worker's :func:`info_case` plus host, driver,
    git commit and date."""
    sha, dirty = git_commit(commit)
    info = {k: v for k, v in info.items() if k != "first_in_process"}
    return {
        **info,
        "device": device,
        "gpu": info.get("gpu") if device == "cuda" else None,
        "driver": driver_version() if device == "cuda" else None,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "git_commit": sha,
        "git_dirty": dirty,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def slug(text: str | None) -> str:
    """A file-name piece for a device name: "NVIDIA H200" -> "h200", None -> "cpu"."""
    text = re.sub(r"^nvidia\s+", "", (text or "cpu").strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def clean_json(x):
    """Non-finite floats as strings ("nan", "inf"): the JSON stays standard."""
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    if isinstance(x, dict):
        return {k: clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_json(v) for v in x]
    return x


def write_json(path: Path, report: dict) -> Path:
    """Write ``report`` to ``path`` through a temporary file and a rename, so a run cut off
    mid-write still leaves the previous complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean_json(report), indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


# --- tables ---------------------------------------------------------------------------------


def format_table(header, rows, numeric, width: int = 100) -> str:
    """Aligned plain text; columns flagged in ``numeric`` are right-aligned; cells are cut at
    ``width`` characters (the JSON keeps the full text)."""
    cut = lambda c: c if len(c) <= width else c[: width - 1] + "…"  # noqa: E731
    rows = [[cut(str(c)) for c in r] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(  # noqa: E731
        c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric)
    ).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def ms(value) -> str:
    if value is None or isinstance(value, str):  # a JSON's "nan" or "inf" (clean_json)
        return value or "—"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _num(value, fmt: str) -> str:
    return value if isinstance(value, str) else "—" if value is None else format(value, fmt)


BENCH_HEADER = (
    "op", "mode", "backend", "L", "shape", "fwd ms", "fwd+bwd ms", "peak MiB", "first s",
    "TFLOP/s", "GB/s", "× floor", "status",
)  # fmt: skip
BENCH_NUMERIC = (0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0)


def bench_cells(r: dict) -> tuple:
    """The table cells of one bench row."""
    peak = (
        r.get("peak_fwdbwd_mib") if r.get("peak_fwdbwd_mib") is not None else r.get("peak_fwd_mib")
    )
    if r.get("first_call_s") is not None:
        first = f"{r['first_call_s']:.2f}" + ("" if r.get("first_in_process", True) else "*")
        first += "c" if r.get("triton_cache") == "shared" else ""
    elif r.get("first_call_s_at_least") is not None:
        first = f">{r['first_call_s_at_least']:.1f}"
    else:
        first = "—"
    return (
        r["op"],
        r.get("mode") or "",
        r.get("backend") or "",
        r.get("chunk") or "",
        r["shape"],
        ms(r.get("fwd_ms")),
        ms(r.get("fwdbwd_ms")),
        _num(peak, ".0f"),
        first,
        _num(r.get("fwd_tflops"), ".3g"),
        _num(r.get("fwd_gbps"), ".3g"),
        _num(r.get("x_floor"), ".1f"),
        r["status"],
    )


def bench_table(rows: list[dict], use_rich: bool | None = None) -> str:
    """The rows as a table: rich's when rich imports (and ``use_rich`` is not False), else
    plain text. Returned as a string."""
    body = [bench_cells(r) for r in rows]
    if use_rich is None:
        use_rich = importlib.util.find_spec("rich") is not None
    if use_rich:
        import io

        from rich.console import Console
        from rich.table import Table

        table = Table(show_edge=False, pad_edge=False)
        for name, numeric in zip(BENCH_HEADER, BENCH_NUMERIC):
            table.add_column(name, justify="right" if numeric else "left")
        for cells in body:
            table.add_row(*map(str, cells))
        buf = io.StringIO()
        Console(file=buf, width=220, force_terminal=False).print(table)
        return buf.getvalue().rstrip()
    return format_table(BENCH_HEADER, body, BENCH_NUMERIC)


# --- progress -------------------------------------------------------------------------------


class Progress:
    """A progress bar over ``total`` steps: tqdm's when tqdm imports and stderr is a
    terminal, else one plain line per step on stderr (a captured log, e.g. a GPU call's
    output, keeps every case's statuses)."""

    def __init__(self, total: int, desc: str = "bench", enabled: bool = True):
        self.total, self.n, self.enabled = total, 0, enabled
        self.bar = None
        tty = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        if enabled and tty and importlib.util.find_spec("tqdm") is not None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False)

    def step(self, text: str) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text[:60])
            self.bar.update(1)
        elif self.enabled:
            print(f"  [{self.n}/{self.total}] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --- keys, merging and Markdown (parts of one suite, and --report) --------------------------


def key_of(suite, op, mode, backend, chunk, dtype, shape, layout=None) -> str:
    """The identity of one measurement: two rows with the same key measured the same thing
    (``chunk`` is the chunk size asked for, None for the op's default)."""
    return json.dumps([suite, op, mode, backend, chunk, dtype, shape, layout])


def row_key(row: dict) -> str:
    """:func:`key_of` a report row (rows before ``chunk_requested`` existed: their chunk)."""
    chunk = row["chunk_requested"] if "chunk_requested" in row else row.get("chunk")
    return key_of(row.get("suite"), row["op"], row.get("mode"), row.get("backend"), chunk,
                  row.get("dtype"), row["shape"], row.get("layout"))  # fmt: skip


def ok_status(status: str) -> bool:
    """ok, or not implemented yet (not a failure)."""
    return status == "ok" or status.startswith("not implemented")


def load_json(path: Path) -> dict:
    """A ``linrnn bench`` report; ``ValueError`` for another kind of file."""
    rep = json.loads(Path(path).read_text())
    if not isinstance(rep, dict) or rep.get("benchmark") != "linrnn bench":
        raise ValueError(f"{path} is not a linrnn bench report")
    return rep


def runs_of(rep: dict) -> list[dict]:
    """The runs a report was made in (a report without ``runs``: its one run)."""
    if rep.get("runs"):
        return rep["runs"]
    return [{k: rep.get(k) for k in ("command", "machine", "complete")}]


def merge_reports(reports: list[dict]) -> dict:
    """One report from several (parts of a suite, or several suites): every run kept in
    ``runs`` (each row's ``run`` points into it), one row per :func:`row_key` — an ok row wins
    over a failed one, otherwise the later report's row."""
    runs: list[dict] = []
    rows: dict[str, dict] = {}
    for rep in reports:
        offset = len(runs)
        runs.extend(runs_of(rep))
        for r in rep.get("bench", []):
            r = dict(r, run=offset + (r.get("run") or 0))
            old = rows.get(row_key(r))
            if old is None or ok_status(r["status"]) or not ok_status(old["status"]):
                rows[row_key(r)] = r
    suites = list(dict.fromkeys(rep.get("suite") for rep in reports))
    merged = list(rows.values())
    return {
        "benchmark": "linrnn bench",
        "schema": SCHEMA_VERSION,
        "complete": all(rep.get("complete") for rep in reports),
        "suite": "+".join(map(str, suites)),
        "machine": runs[-1].get("machine") if runs else None,
        "command": runs[-1].get("command") if runs else None,
        "runs": runs,
        "gpu_spec": next((rep["gpu_spec"] for rep in reports if rep.get("gpu_spec")), None),
        "notes": [n for rep in reports for n in rep.get("notes", [])],
        "bench": merged,
        "failures": {
            "linrnn_bench": sum(
                r["library"] == "linrnn" and not ok_status(r["status"]) for r in merged
            )
        },
    }


def _md(cell) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


def md_table(header, body) -> list[str]:
    lines = ["| " + " | ".join(map(_md, header)) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(map(_md, cells)) + " |" for cells in body]


def _short_status(status: str) -> str:
    """A table cell's word for a row that is not ok: timeout, aborted, error (stage)."""
    for word in ("timeout", "aborted", "not implemented"):
        if status.startswith(word):
            return word
    m = re.match(r"error \(([^)]*)\)", status)
    return f"error ({m.group(1)})" if m else "error"


def _run_line(i: int, run: dict) -> str:
    m = run.get("machine") or {}
    versions = ", ".join(
        f"{name} {m[key]}"
        for name, key in (("torch", "torch"), ("Triton", "triton"), ("fla-core", "fla-core"),
                          ("mlstm-kernels", "mlstm-kernels"), ("mamba-ssm", "mamba-ssm"))
        if m.get(key)
    )  # fmt: skip
    commit = (m.get("git_commit") or "?")[:12]
    return (
        f"- run {i}: {m.get('gpu') or m.get('device') or '?'}, {versions}, commit `{commit}`, "
        f"{m.get('date') or '?'}: `{run.get('command') or '?'}`"
    )


def markdown(rep: dict) -> str:
    """The report as Markdown: the runs it came from, then per family a table of fwd+bwd / fwd
    ms (one line per linrnn op × mode and per peer, one column per shape), then every row in
    detail (decode and varlen reports: the detail table only; the train suite's rows: their
    own table, :func:`linrnn.bench.training.markdown_lines`)."""
    rows = rep.get("bench", [])
    trained = [r for r in rows if r.get("suite") == "train"]
    runs = runs_of(rep)
    used = sorted({r.get("run") or 0 for r in rows}) or [len(runs) - 1]
    lines = [f"## linrnn bench: {rep.get('suite')}", ""]
    lines += [_run_line(i, runs[i]) for i in used if i < len(runs)]
    gpus = {(runs[i].get("machine") or {}).get("gpu") for i in used if i < len(runs)}
    commits = {(runs[i].get("machine") or {}).get("git_commit") for i in used if i < len(runs)}
    if len(used) > 1:
        lines.append(
            f"\nRows from {len(used)} runs ({len(gpus)} GPU name(s), {len(commits)} commit(s)): "
            "rows of different runs were not measured side by side (column `run` below)."
        )
    if not rep.get("complete", True):
        lines.append("\nIncomplete: the last run stopped before its plan was done.")
    if trained:
        from linrnn.bench import training

        lines += training.markdown_lines(trained)
        rows = [r for r in rows if r.get("suite") != "train"]
        if not rows:
            return "\n".join([*lines, ""])
    if rows and not any("layout" in r or "step_ms" in r for r in rows):  # not decode, varlen
        lines += ["", PIVOT_NOTE]
        for family in dict.fromkeys(r["family"] for r in rows):
            lines += ["", f"### {family}", ""]
            lines += _pivot([r for r in rows if r["family"] == family])
    from linrnn.bench import compare

    lines += compare.markdown_lines(rows)
    lines += ["", "<details><summary>every row</summary>", ""]
    header = (*BENCH_HEADER[:-1], "run", "status")
    body = [(*bench_cells(r)[:-1], r.get("run", 0), r["status"][:120]) for r in rows]
    lines += md_table(header, body)
    lines += ["", "</details>", ""]
    return "\n".join(lines)


PIVOT_NOTE = (
    "Cells: forward+backward / forward ms (medians: `triton.testing.do_bench` on CUDA, "
    "`time.perf_counter` on CPU); a word where a row did not finish (its status is in the "
    "detail table); L = chunk size."
)


def _pivot(rows: list[dict]) -> list[str]:
    """One family's rows: a line per op × mode × requested chunk size, a column per shape
    (largest head dim first, then by T)."""
    dims = lambda s: (-registry.parse_shape(s)["K"], registry.parse_shape(s)["T"])  # noqa: E731
    shapes = sorted(dict.fromkeys(r["shape"] for r in rows), key=dims)
    series: dict = {}
    for r in rows:
        label = r["op"] if r["library"] != "linrnn" else f"linrnn {r['op']}"
        series.setdefault((label, r.get("mode") or "", r.get("chunk_requested")), {})[
            r["shape"]
        ] = r
    body = []
    for (label, mode, _), by_shape in series.items():
        chunks = sorted({r["chunk"] for r in by_shape.values() if r.get("chunk")})
        cells = []
        for shape in shapes:
            r = by_shape.get(shape)
            if r is None:
                cells.append("")
            elif r.get("fwd_ms") is None:
                cells.append(_short_status(r["status"]))
            elif r.get("fwdbwd_ms") is None:
                cells.append(f"— / {ms(r['fwd_ms'])}" + (
                    "" if ok_status(r["status"]) else f" ({_short_status(r['status'])})"
                ))  # fmt: skip
            else:
                cells.append(f"{ms(r['fwdbwd_ms'])} / {ms(r['fwd_ms'])}")
        body.append((label, mode, "/".join(map(str, chunks)), *cells))
    return md_table(("op", "mode", "L", *shapes), body)
