"""benchmarks/step_host.py on the CPU: every family's eager decode step through linrnn.step
with the kernel launches stubbed (a check of the command, not a timing)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "step_host.py"
OPS = ("linear_attn", "retention", "simple_gla", "gla", "rwkv6", "mlstm", "delta_rule",
       "gated_delta_rule", "mamba2")  # fmt: skip


def test_every_family_steps_with_stubbed_launches():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, str(SCRIPT), "--steps", "3", "--shape", "B2-H2-K8-V8",
                          "--profile", "--ops", "linear_attn", "mlstm", "mamba2"],
                         capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "kernel launches stubbed" in res.stdout
    for op in ("linear_attn", "mlstm", "mamba2"):
        m = re.search(rf"^\s+{op}\s+([0-9.]+) µs per step$", res.stdout, re.M)
        assert m and float(m.group(1)) > 0, res.stdout
    assert "step.py" in res.stdout  # the profile names linrnn.step's frames


def test_step_cases_cover_the_listed_families():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import step_host
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert step_host.OPS == OPS
    for op in OPS:
        fn, inputs, state = step_host.step_case(op, 2, 2, 8, 8, "cpu")
        o, _ = fn(*inputs, initial_state=state, output_final_state=True, backend="torch",
                  mode="recurrent")  # fmt: skip
        assert o.shape == (2, 1, 2, 8) and bool(o.isfinite().all()), op
