"""scripts/compile_check.py: it compiles recorded launches for a GPU target without a GPU, and
reports what the Triton interpreter lets through (here a loop-carried variable whose type
changes, the mistake that once failed only on the GPU)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
tl = triton.language

ROOT = Path(__file__).resolve().parents[1]


@triton.jit
def _copy_kernel(x, y, N, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < N), mask=o < N)


@triton.jit
def _retyped_kernel(x, y, N, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)  # a block ...
    for i in range(N):
        acc = tl.load(x + i)  # ... then a scalar: its type changes inside the loop
    tl.store(y, acc)


def _compile(tmp_path, name, *extra):
    records = tmp_path / "launches.pkl"
    args = {"x": ("tensor", "torch.float32"), "y": ("tensor", "torch.float32"),
            "N": ("value", 5), "BLOCK": ("value", 16)}  # fmt: skip
    records.write_bytes(pickle.dumps([(__name__, name, args)]))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    cmd = [sys.executable, str(ROOT / "scripts" / "compile_check.py"), "--phase", "compile",
           "--records", str(records), "--only", name, *extra]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_a_sound_kernel_compiles(tmp_path):
    done = _compile(tmp_path, "_copy_kernel")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 specializations compiled, 0 failed" in done.stdout


def test_a_kernel_the_interpreter_accepts_fails_to_compile(tmp_path):
    done = _compile(tmp_path, "_retyped_kernel")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 specializations compiled, 1 failed" in done.stdout
    assert "_retyped_kernel" in done.stdout


def test_resources_with_other_values(tmp_path):
    """--set compiles a record with other values (here a larger block) and --resources prints
    ptxas's registers and spills and the kernel's shared memory; --match picks no record when
    a value differs."""
    done = _compile(tmp_path, "_copy_kernel", "--resources", "--set", "BLOCK=1024",
                    "--match", "x=torch.float32")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("_copy_kernel"))
    assert "'BLOCK': 1024" in line and "registers" in line and "spill stores 0 B" in line, line
    done = _compile(tmp_path, "_copy_kernel", "--match", "x=torch.float16")
    assert "0 specializations compiled, 0 failed" in done.stdout, done.stdout + done.stderr


def test_ptx_written_per_specialization(tmp_path):
    """--ptx DIR holds each compiled kernel's PTX, named by kernel and compile order."""
    out = tmp_path / "ptx"
    done = _compile(tmp_path, "_copy_kernel", "--ptx", str(out), "--set", "BLOCK=64")
    assert done.returncode == 0, done.stdout + done.stderr
    (ptx,) = out.glob("*.ptx")
    assert ptx.name == "_copy_kernel-1.ptx"
    assert ".entry _copy_kernel" in ptx.read_text()


def test_launch_divisibility_hints(tmp_path):
    """Compiles get the hints a GPU launch gives: tensors 16-byte aligned, an int that is a
    multiple of 16 marked so. The copy's masked loads then vectorize (4 fp32 per instruction)
    with N = 1024 and not with N = 1000."""
    texts = {}
    for n in (1024, 1000):
        out = tmp_path / f"ptx{n}"
        done = _compile(tmp_path, "_copy_kernel", "--ptx", str(out), "--set", f"BLOCK=1024,N={n}")
        assert done.returncode == 0, done.stdout + done.stderr
        texts[n] = next(out.glob("*.ptx")).read_text()
    assert "ld.global.v4" in texts[1024]
    assert "ld.global.v4" not in texts[1000]
