"""Repository hygiene: banned Triton APIs never appear in the repository's Python files.

Triton's block-pointer API (the block-pointer constructor and its advance call) was removed in
Triton 3.9; CONVENTIONS.md allows plain pointer arithmetic with masks only. The patterns are
assembled at run time so that this file does not match itself.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BANNED = ("make_block" + "_ptr", "tl." + "advance(")
SKIP_DIRS = {".git", ".whl", "build", "dist", ".venv", "__pycache__", ".pytest_cache"}


def python_files() -> list[Path]:
    """*.py files git tracks or would add (``git ls-files``: tracked plus untracked, not
    ignored), or without git every *.py outside .git, wheel, build and cache folders."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.py"],
            cwd=ROOT, capture_output=True, check=True, text=True,
        ).stdout  # fmt: skip
        files = [ROOT / name for name in out.split("\0") if name]
        if files:
            return [f for f in files if f.is_file()]
    except (OSError, subprocess.CalledProcessError):
        pass
    return [
        p
        for p in ROOT.rglob("*.py")
        if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
        and not any(part.endswith(".egg-info") for part in p.parts)
    ]


def test_file_list_is_not_empty():
    names = {p.relative_to(ROOT).as_posix() for p in python_files()}
    assert "tests/test_hygiene.py" in names
    assert "linrnn/__init__.py" in names


def test_no_banned_triton_apis():
    hits = []
    for path in python_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), start=1):
            for pattern in BANNED:
                if pattern in line:
                    hits.append(f"{path.relative_to(ROOT)}:{lineno}: {pattern}: {line.strip()}")
    assert not hits, "banned Triton APIs (removed in Triton 3.9):\n" + "\n".join(hits)
