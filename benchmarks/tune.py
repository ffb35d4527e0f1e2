"""Tile tuning for the Triton engine: time one op with candidate entries of the engine's tile
tables (every module-level dict of ``linrnn.engine`` whose name ends in ``TILE`` or ``TILES``,
e.g. ``TILES``, ``VEC_TILES``, ``SCORE_TILES``, ``STEP_TILE``) against the shipped tables.

    python3 benchmarks/tune.py --list                                  # tables and entries
    python3 benchmarks/tune.py --op gla --shape B8-T8192-H16-K256-V256 \\
        --try "VEC_TILES[states]=(64, 64, 256, 4, 2)" \\
              "VEC_TILES[states]=(64, 32, 128, 4, 2); VEC_TILES[cols]=(16, 64, 32, 64, 4, 2)"
    python3 benchmarks/tune.py --op mlstm --entry "TILES[out_fwd]" \\
        --values "(64, 32, 256, 4, 2)" "(64, 64, 128, 8, 3)"          # one entry, several values
    python3 benchmarks/tune.py --op mamba2 --shape B8-T8192-H8-HV32-K128-V64 \\
        --try "scalar.GROUP_MIN_HEADS=4"                       # an engine module's constant

Each candidate sets its entries in place (the engine reads its tables at launch; a tile is a
``tl.constexpr``, so a candidate compiles its own kernels), runs one forward+backward and
compares the output and every gradient with the shipped tables' (RMS-relative error at most
``--tol``, else the candidate is "wrong" and not timed), then takes ``triton.testing.do_bench``
medians of the forward (no autograd) and of forward+backward; the tables are restored after
every candidate. A candidate that fails to compile or run gets the error as its status. The
inputs are those of ``linrnn bench`` (:func:`linrnn.bench.registry.build_linrnn`). Without a
GPU it runs under ``TRITON_INTERPRET=1`` (small shapes only: a check of the command, not a
timing). ``--out`` writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import os
import pkgutil
import re
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before Triton is imported (linrnn imports it)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from linrnn.bench import registry, report, timing

ENTRY = re.compile(r"\s*([A-Za-z_][\w.]*)\[([^\]]+)\]\s*=\s*(.+?)\s*")
# A module constant of the engine (a threshold such as scalar.GROUP_MIN_PROGRAMS): MODULE.NAME=value
CONSTANT = re.compile(r"\s*([a-z_]\w*)\.([A-Z][A-Z0-9_]*)\s*=\s*(.+?)\s*")


def tile_tables(package: str = "linrnn.engine") -> dict[str, dict]:
    """Every module-level dict of ``package``'s modules whose name ends in TILE or TILES, by
    name (and by ``module.NAME``); one dict imported into several modules counts once."""
    pkg = importlib.import_module(package)
    found: dict[str, dict] = {}
    seen: dict[int, str] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        try:
            module = importlib.import_module(f"{package}.{info.name}")
        except ImportError:  # e.g. a Triton module on a machine without Triton
            continue
        for name, value in vars(module).items():
            if not (isinstance(value, dict) and re.fullmatch(r"([A-Z][A-Z0-9_]*_)?TILES?", name)):
                continue
            if id(value) in seen:
                continue
            seen[id(value)] = name
            found[f"{info.name}.{name}"] = value
            found.setdefault(name, value)
    return found


def module_constant(text: str, tables: dict[str, dict]) -> tuple[str, str, str] | None:
    """``"MODULE.NAME=value"`` naming an int, float or bool constant of a ``linrnn.engine``
    module -> ``(table, NAME, value text)``, the module's namespace entered in ``tables`` as
    table ``module:MODULE`` (so that :func:`patched` sets and restores it like a tile entry).
    It takes effect where that module's code reads the name at call time; a module that
    imported the constant by name keeps its own binding, so name the module that uses it.
    None when ``text`` is not of that form; ``ValueError`` for a module or constant that does
    not exist."""
    m = CONSTANT.fullmatch(text)
    if not m:
        return None
    module, name, raw = m.groups()
    try:
        namespace = vars(importlib.import_module(f"linrnn.engine.{module}"))
    except ImportError as exc:
        raise ValueError(f"linrnn.engine has no module {module!r}") from exc
    if not isinstance(namespace.get(name), (int, float)):
        raise ValueError(f"linrnn.engine.{module} has no int, float or bool constant {name!r}")
    tables.setdefault(f"module:{module}", namespace)
    return f"module:{module}", name, raw


def parse_entry(text: str, tables: dict[str, dict]) -> tuple[str, str, object]:
    """``"TABLE[key]=value"`` -> ``(table, key, value)``; the value is a Python literal whose
    type matches the current entry's (a tuple of ints for tile tuples, an int for
    ``STEP_TILE`` entries). ``"MODULE.NAME=value"`` sets an engine module's constant
    (:func:`module_constant`). ``ValueError`` names what is wrong."""
    m = ENTRY.fullmatch(text)
    constant = None if m else module_constant(text, tables)
    if not m and not constant:
        raise ValueError(f"{text!r} is not of the form TABLE[key]=value or MODULE.NAME=value")
    table, key, raw = m.groups() if m else constant
    key = key.strip().strip("'\"")
    if table not in tables:
        raise ValueError(f"unknown table {table!r}; choose from {sorted(tables)}")
    if key not in tables[table]:
        raise ValueError(f"{table} has no entry {key!r}; its entries: {sorted(tables[table])}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"{raw!r} is not a Python literal") from exc
    current = tables[table][key]
    if isinstance(current, tuple):
        if not isinstance(value, tuple) or len(value) != len(current):
            raise ValueError(f"{table}[{key}] holds {len(current)} values, got {raw!r}")
    elif type(value) is not type(current):
        raise ValueError(f"{table}[{key}] is a {type(current).__name__}, got {raw!r}")
    return table, key, value


def parse_candidate(text: str, tables: dict[str, dict]) -> list[tuple[str, str, object]]:
    """A candidate: entries separated by ``;``."""
    return [parse_entry(part, tables) for part in text.split(";") if part.strip()]


@contextlib.contextmanager
def patched(tables: dict[str, dict], entries):
    """Within the block, the tables hold ``entries``; their old values come back after it."""
    old = [(tables[t], k, tables[t][k]) for t, k, _ in entries]
    try:
        for t, k, v in entries:
            tables[t][k] = v
        yield
    finally:
        for table, k, v in reversed(old):
            table[k] = v


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    ref = torch.linalg.vector_norm(b).item()
    diff = torch.linalg.vector_norm(a - b).item()
    return diff / ref if ref > 0 else diff


def measure(case: dict, shape: dict, reference=None, tol: float = 1e-2, time_it=True) -> dict:
    """One candidate (the tables as they are now): output and gradients, their worst error
    against ``reference`` (the outputs of an earlier call), and the times."""
    device = torch.device(case["device"])
    leaves, fwd = registry.build_linrnn(case, shape)
    o = fwd()
    gen = torch.Generator(o.device).manual_seed(1)
    do = torch.randn(o.shape, generator=gen, device=o.device, dtype=o.dtype)
    outputs = [o.detach(), *torch.autograd.grad(o, leaves, do)]
    row: dict = {"status": "ok", "outputs": outputs}
    if reference is not None:
        row["err"] = max(rel_err(a, b) for a, b in zip(outputs, reference))
        if not row["err"] <= tol:  # NaN too
            row["status"] = "wrong"
            return row
    if time_it:

        def fwd_nograd():
            with torch.no_grad():
                fwd()

        row["fwd_ms"] = timing.median_ms(fwd_nograd, case, device)
        row["fwdbwd_ms"] = timing.median_ms(lambda: torch.autograd.grad(fwd(), leaves, do),
                                            case, device)  # fmt: skip
    return row


def run(args, tables: dict[str, dict], candidates: list[tuple[str, list]]) -> list[dict]:
    """Rows of the shipped tables ("default") and of every candidate, in order."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    op = registry.resolve_op(args.op).name
    shape = registry.parse_shape(args.shape)
    case = dict(op=op, seed=args.seed, device=device, dtype=args.dtype, mode=args.mode,
                backend="triton", chunk=args.chunk, warmup_ms=args.warmup_ms,
                rep_ms=args.rep_ms, cpu_repeats=1)  # fmt: skip
    time_it = not args.no_timing
    base = measure(case, shape, time_it=time_it)
    reference = base.pop("outputs")
    rows = [dict(candidate="default", **base)]
    print(format_row(rows[0]), flush=True)
    for label, entries in candidates:
        t0 = time.perf_counter()
        try:
            with patched(tables, entries):
                row = measure(case, shape, reference, args.tol, time_it)
            row.pop("outputs", None)
        except Exception as exc:  # compile errors, out of resources, out of memory
            row = {"status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        row = dict(candidate=label, seconds=round(time.perf_counter() - t0, 1), **row)
        for key in ("fwd_ms", "fwdbwd_ms"):
            if row.get(key) and rows[0].get(key):
                row[key.replace("_ms", "_vs_default")] = row[key] / rows[0][key]
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    fig = lambda k, f: format(row[k], f) if row.get(k) is not None else "-"  # noqa: E731
    return (f"{row['candidate'][:70]:<70} {row['status'][:30]:<12} fwd {fig('fwd_ms', '.3f')} ms"
            f" ({fig('fwd_vs_default', '.3f')}x)  fwd+bwd {fig('fwdbwd_ms', '.3f')} ms "
            f"({fig('fwdbwd_vs_default', '.3f')}x)  err {fig('err', '.1e')}")  # fmt: skip


def build_candidates(args, tables) -> list[tuple[str, list]]:
    candidates = [(text.strip(), parse_candidate(text, tables)) for text in args.try_ or ()]
    for value in args.values or ():
        text = f"{args.entry}={value}"
        candidates.append((text, [parse_entry(text, tables)]))
    return candidates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    p.add_argument("--list", action="store_true", help="print the tile tables and exit")
    p.add_argument("--op", default="gla", help="linrnn op or family name (linrnn bench --list)")
    p.add_argument("--shape", default="B8-T8192-H16-K256-V256")
    p.add_argument("--mode", choices=registry.TRITON_MODES, default="chunk")
    p.add_argument("--chunk", type=int, help="chunk size (default: the op's)")
    p.add_argument("--dtype", choices=sorted(registry.DTYPES), default="bf16")
    p.add_argument("--try", dest="try_", nargs="+", metavar="CANDIDATE",
                   help='"TABLE[key]=value; MODULE.NAME=value" per candidate')  # fmt: skip
    p.add_argument("--entry", metavar="TABLE[key]", help="with --values: one entry's candidates")
    p.add_argument("--values", nargs="+", metavar="VALUE", help="values of --entry")
    p.add_argument("--tol", type=float, default=1e-2, help="RMS-relative error vs default")
    p.add_argument("--no-timing", action="store_true", help="check the candidates only")
    p.add_argument("--warmup-ms", type=float, default=25)
    p.add_argument("--rep-ms", type=float, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="JSON report")
    args = p.parse_args(argv)
    tables = tile_tables()
    if args.list:
        for name, table in tables.items():
            if "." in name:
                print(f"{name}:")
                print("\n".join(f"  {k!r}: {v!r}" for k, v in table.items()))
        return 0
    if bool(args.entry) != bool(args.values):
        p.error("--entry and --values go together")
    try:
        registry.resolve_op(args.op)
        registry.parse_shape(args.shape)
        candidates = build_candidates(args, tables)
    except ValueError as exc:
        p.error(str(exc))
    rows = run(args, tables, candidates)
    if args.out:
        info = report.info_case({"device": "cuda" if torch.cuda.is_available() else "cpu"}, {})
        machine = report.machine_info(info, "cuda" if info.get("gpu") else "cpu")
        out = dict(tool="benchmarks/tune.py", argv=sys.argv[1:] if argv is None else argv,
                   machine=machine, op=args.op, shape=args.shape, mode=args.mode,
                   dtype=args.dtype, rows=rows)  # fmt: skip
        report.write_json(args.out, out)
        print(f"wrote {args.out}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
