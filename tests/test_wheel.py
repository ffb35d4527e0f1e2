"""A wheel built from the checkout works installed: built (no network, no build isolation) from
a copy of the sources, installed into an empty target folder, it imports from there, ships the
training corpus, and ``python -m linrnn.train`` runs two steps from an unrelated directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args, cwd, env=None, timeout=120):
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")  # a copy, so the build leaves the checkout clean
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "linrnn", src / "linrnn",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "-w", str(dist), str(src)], cwd=src)  # fmt: skip
    (found,) = dist.glob("linrnn-*.whl")
    return found


def test_wheel_ships_the_corpus(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "linrnn/data/shakespeare.txt" in names and "linrnn/data/README.md" in names
    assert "linrnn/hf/modeling.py" in names and not any(n.startswith("tests/") for n in names)


def test_installed_wheel_trains_from_another_directory(wheel, tmp_path):
    target = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
          str(target), str(wheel)], cwd=tmp_path)  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}  # only the installed copy of linrnn
    out = _run([sys.executable, "-c", "import linrnn, linrnn.train as t; "
                "print(linrnn.__file__); print(t.DEFAULT_DATA.is_file())"],
               cwd=elsewhere, env=env)  # fmt: skip
    path, corpus = out.stdout.split()
    assert Path(path).is_relative_to(target) and corpus == "True"
    _run([sys.executable, "-m", "linrnn.train", "--steps", "2", "--eval-every", "2",
          "--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--seq-len", "16",
          "--batch-size", "2", "--eval-batches", "1", "--sample-tokens", "4", "--no-plot",
          "--no-progress", "--out", "run"], cwd=elsewhere, env=env)  # fmt: skip
    history = json.loads((elsewhere / "run" / "history.json").read_text())
    assert len(history["train_step_loss"]) == 2
