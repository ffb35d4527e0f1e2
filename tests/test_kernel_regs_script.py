"""benchmarks/kernel_regs.py on CPU: the launches of one RWKV6 forward+backward recorded under
the interpreter and compiled for sm_90 by the installed Triton (no GPU needed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "kernel_regs.py"


def test_kernel_regs_reports_every_launch(tmp_path):
    out = tmp_path / "regs.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(SCRIPT), "--op", "rwkv6", "--T", "32", "--K", "32", "--V", "32",
           "--chunk", "32", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(out.read_text())
    assert rep["arch"] == 90 and rep["op"] == "rwkv6"
    kernels = {r["kernel"].split("[")[0] for r in rep["rows"]}
    assert {"chunk_cumsum_kernel", "states_fwd_kernel", "states_bwd_kernel", "apply_kernel",
            "fast_scores_kernel", "decay_grad_kernel"} <= kernels  # fmt: skip
    for r in rep["rows"]:
        assert "error" not in r, r
        assert 16 <= r["reg"] <= 255 and r["stack"] >= 0 and r["shared"] >= 0, r
