"""Repository hygiene: what the repository's own text files must not contain.

- Triton's block-pointer API (the block-pointer constructor and its advance call), removed in
  Triton 3.9; kernels use plain pointer arithmetic with masks.
- Work logistics: references to work sessions and their notes, issue numbers, work-log and dated
  result folders, and paths outside the repository. The code, the README and the docs describe the
  product; its history lives in git.

The patterns are assembled at run time so that this file does not match itself. Run
``python3 tests/test_hygiene.py`` for the list of hits per file.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".whl", "build", "dist", ".venv", "__pycache__", ".pytest_cache", "data"}
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".cfg", ".ini", ".yml", ".yaml"}

BANNED_TRITON = ("make_block" + "_ptr", "tl." + "advance(")

_D = r"\d"
LOGISTICS = {
    "work session": re.compile(r"\b" + "session" + r"\s+#?" + _D, re.I),
    "session notes": re.compile(r"\bs" + _D + r"+[ -]" + "notes" + r"\b", re.I),
    "issue number": re.compile(r"\b" + "issue" + r"\s*#?\s*" + _D + "+", re.I),
    "work-log folder": re.compile("results/" + "s" + _D + r"+\b"),
    "numbered call folder": re.compile(r"\b" + "call" + _D + "+-"),
    "dated session folder": re.compile(_D + "{4}-" + _D + "{2}-" + _D + "{2}-[a-z]+" + _D + "+-s"),
    "dated result folder": re.compile("results/" + _D + "{4}-" + _D + "{2}-" + _D + "{2}"),
    "path outside the repository": re.compile(re.escape(".." + "/shared") + "|" + "/" + "work/"),
}


def repo_files() -> list[Path]:
    """The files git tracks or would add (``git ls-files``: tracked plus untracked, not ignored),
    or without git every file outside .git, wheel, build and cache folders."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True, text=True,
        ).stdout  # fmt: skip
        files = [ROOT / name for name in out.split("\0") if name]
        if files:
            return [f for f in files if f.is_file()]
    except (OSError, subprocess.CalledProcessError):
        pass
    return [
        p
        for p in ROOT.rglob("*")
        if p.is_file()
        and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
        and not any(part.endswith(".egg-info") for part in p.parts)
    ]


def python_files() -> list[Path]:
    return [p for p in repo_files() if p.suffix == ".py"]


def text_files() -> list[Path]:
    """Source and documentation: Python, markdown, shell, toml and config files, the pinned
    requirements, and scripts without a suffix that start with ``#!``."""
    found = []
    for path in repo_files():
        rel = path.relative_to(ROOT)
        if SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        if path.suffix in TEXT_SUFFIXES or (path.suffix == ".txt" and rel.name.startswith("req")):
            found.append(path)
        elif not path.suffix:
            with path.open("rb") as f:
                if f.read(2) == b"#!":
                    found.append(path)
    return found


def logistics_hits() -> dict[str, list[str]]:
    """``{file: ["line: what: text", ...]}`` for every match in the paths of the repository's
    files and in the text of its source and documentation files."""
    hits: dict[str, list[str]] = {}
    for path in repo_files():
        rel = path.relative_to(ROOT).as_posix()
        for what, pattern in LOGISTICS.items():
            if pattern.search(rel):
                hits.setdefault(rel, []).append(f"path: {what}")
    for path in text_files():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), start=1):
            for what, pattern in LOGISTICS.items():
                if pattern.search(line):
                    hits.setdefault(rel, []).append(f"{lineno}: {what}: {line.strip()[:120]}")
    return hits


def format_hits(hits: dict[str, list[str]], lines_per_file: int | None = None) -> str:
    out = [f"{sum(map(len, hits.values()))} hits in {len(hits)} files"]
    for rel in sorted(hits):
        out.append(f"{rel}: {len(hits[rel])}")
        shown = hits[rel] if lines_per_file is None else hits[rel][:lines_per_file]
        out.extend(f"    {h}" for h in shown)
    return "\n".join(out)


def test_file_lists_are_not_empty():
    names = {p.relative_to(ROOT).as_posix() for p in text_files()}
    assert {"tests/test_hygiene.py", "linrnn/__init__.py", "pyproject.toml"} <= names
    assert "scripts/test.sh" in names and ".ci/run" in names


def test_patterns_catch_what_they_are_for():
    """Each pattern matches an example of its kind and leaves ordinary text alone."""
    examples = {
        "work session": "as measured in sess" + "ion 4",
        "session notes": "see the s" + "9 notes",
        "issue number": "fixes iss" + "ue #12",
        "work-log folder": "benchmarks/res" + "ults/s8/x.md",
        "numbered call folder": "cal" + "l3-0679b31/paper.md",
        "dated session folder": "2026-11-" + "21-h200-s3.md",
        "dated result folder": "benchmarks/res" + "ults/2026-11-22.md",
        "path outside the repository": "see .." + "/shared/DESIGN.md",
    }
    for what, example in examples.items():
        assert LOGISTICS[what].search(example), (what, example)
    ordinary = "a sessions table, issues with tiles, call(x) - y, results/summary.md, docs/"
    assert not [w for w, p in LOGISTICS.items() if p.search(ordinary)]


def test_no_banned_triton_apis():
    hits = []
    for path in python_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), start=1):
            for pattern in BANNED_TRITON:
                if pattern in line:
                    hits.append(f"{path.relative_to(ROOT)}:{lineno}: {pattern}: {line.strip()}")
    assert not hits, "banned Triton APIs (removed in Triton 3.9):\n" + "\n".join(hits)


def test_no_work_logistics():
    hits = logistics_hits()
    assert not hits, "work logistics in the repository:\n" + format_hits(hits, lines_per_file=5)


if __name__ == "__main__":
    found = logistics_hits()
    print(format_hits(found) if found else "no work logistics found")
    sys.exit(1 if found else 0)
