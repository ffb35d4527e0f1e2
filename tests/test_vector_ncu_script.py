"""benchmarks/vector_ncu.py is a GPU-only driver for Nsight Compute: on a machine without CUDA
it says so and exits with 2 (its real run is a device call, s11 notes)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_vector_ncu_refuses_without_cuda():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vector_ncu.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stderr
