"""benchmarks/tune.py: finding the engine's tile tables, parsing candidates, restoring the tables,
and a tiny run under the interpreter whose candidates agree with the shipped tiles."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tune.py"


@pytest.fixture(scope="module")
def tune():
    spec = importlib.util.spec_from_file_location("linrnn_tune", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tables(tune):
    return tune.tile_tables()


def scalar_table(tables) -> tuple[str, str]:
    """A table name and one of its tuple entries (the scalar engine's tiles)."""
    name = next(n for n in tables if n.split(".")[-1] == "TILES")
    key = next(k for k, v in tables[name].items() if isinstance(v, tuple))
    return name, key


def test_tables_are_the_engines_tile_dicts(tables):
    short = {n.split(".")[-1] for n in tables}
    assert {"TILES", "VEC_TILES"} <= short, short
    assert all(isinstance(t, dict) and t for t in tables.values())


def test_parse_entry_checks_table_key_and_arity(tune, tables):
    name, key = scalar_table(tables)
    value = tables[name][key]
    text = f"{name}[{key}]={tuple(16 for _ in value)!r}"
    assert tune.parse_entry(text, tables) == (name, key, tuple(16 for _ in value))
    assert tune.parse_candidate(f"{text}; {text}", tables) == [(name, key, (16,) * len(value))] * 2
    for bad, words in [
        (f"{name}[{key}]=(16,)", "holds"),
        (f"{name}[nope]=(16,)", "no entry"),
        (f"NOPE_TILES[{key}]=(1,)", "unknown table"),
        (f"{name}[{key}]=tuple(", "literal"),
        (f"{name} {key} 16", "form"),
    ]:
        with pytest.raises(ValueError, match=words):
            tune.parse_entry(bad, tables)


def test_module_constants_parse_set_and_restore(tune, tables):
    from linrnn.engine import scalar

    tables = dict(tables)  # the module's namespace is entered as a table of its own
    before = scalar.GROUP_MIN_HEADS
    entry = tune.parse_entry("scalar.GROUP_MIN_HEADS=3", tables)
    assert entry == ("module:scalar", "GROUP_MIN_HEADS", 3)
    with tune.patched(tables, [entry]):
        assert scalar.GROUP_MIN_HEADS == 3
    assert scalar.GROUP_MIN_HEADS == before
    for bad, words in [
        ("scalar.NOPE=1", "no int, float or bool constant"),
        ("nomodule.GROUP_MIN_HEADS=1", "no module"),
        ("scalar.GROUP_MIN_HEADS=(1,)", "is a int"),
        ("scalar.group_min_heads=1", "form"),
    ]:
        with pytest.raises(ValueError, match=words):
            tune.parse_entry(bad, tables)


def test_patched_sets_and_restores_even_on_error(tune, tables):
    name, key = scalar_table(tables)
    before = tables[name][key]
    new = tuple(x + 1 for x in before)
    with pytest.raises(RuntimeError), tune.patched(tables, [(name, key, new)]):
        assert tables[name][key] == new
        raise RuntimeError
    assert tables[name][key] == before


def test_tiny_run_checks_and_times_candidates(tune, tables, tmp_path, capsys):
    name, _ = scalar_table(tables)
    assert "out_fwd" in tables[name]
    before = dict(tables[name])
    small = f"{name}[out_fwd]=(16, 16, 16, 4, 1)"
    out = tmp_path / "tune.json"
    argv = ["--op", "simple_gla", "--shape", "B1-T40-H1-K16-V16", "--dtype", "fp32",
            "--try", small, "--out", str(out)]  # fmt: skip
    assert tune.main(argv) == 0
    assert tables[name] == before
    rows = json.loads(out.read_text())["rows"]
    assert [r["candidate"] for r in rows] == ["default", small]
    assert all(r["status"] == "ok" for r in rows)
    assert rows[1]["err"] < 1e-5 and rows[1]["fwdbwd_ms"] > 0 and rows[1]["fwd_vs_default"] > 0
    assert small[:40] in capsys.readouterr().out


def test_bad_command_lines_exit_2(tune):
    for argv in (["--entry", "TILES[out_fwd]"], ["--op", "nope"], ["--shape", "B1"]):
        with pytest.raises(SystemExit) as exc:
            tune.main(argv)
        assert exc.value.code == 2
