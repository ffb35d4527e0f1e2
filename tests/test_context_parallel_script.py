"""benchmarks/context_parallel.py on CPU (gloo, 2 processes, --quick): the equality check of
two families and the throughput part run, and the JSON is written (the GPU run uses NCCL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_context_parallel_script_quick(tmp_path):
    out = tmp_path / "cp.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    script = str(ROOT / "benchmarks" / "context_parallel.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", script,
           "--device", "cpu", "--quick", "--check-families", "simple_gla", "mlstm",
           "--commit", "abc1234", "--out", str(out)]  # fmt: skip
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and report["versions"]["git_commit"] == "abc1234"
    assert report["check"]["ok"] is True
    assert set(report["check"]["max_rel_err_over_ranks"]) == {"simple_gla", "mlstm"}
    assert report["throughput"] and all("tokens_per_s" in r or "status" in r
                                        for r in report["throughput"])  # fmt: skip
