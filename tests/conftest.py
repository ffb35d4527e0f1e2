"""Test-wide fixtures: a fresh, reported seed per run, and NaN-poisoned allocations."""

from __future__ import annotations

import os
import random
import zlib

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter (it must be chosen before triton
# is first imported, which linrnn does).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Fresh randomness each run, reproducible from the header: LINRNN_TEST_SEED=<n> pytest ...
SESSION_SEED = int(os.environ.get("LINRNN_TEST_SEED", random.SystemRandom().randrange(2**31)))


def pytest_report_header(config):
    return f"linrnn test seed: {SESSION_SEED} (rerun with LINRNN_TEST_SEED={SESSION_SEED})"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # Also at the end, where -q output (and CI logs) keep it.
    terminalreporter.write_line(f"linrnn test seed: {SESSION_SEED} (LINRNN_TEST_SEED to rerun)")


@pytest.fixture(autouse=True)
def _seed(request):
    """Seed torch per test from the session seed and the test id."""
    torch.manual_seed(SESSION_SEED ^ zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _poison_empty(monkeypatch):
    """Fill every uninitialized floating-point allocation with NaN (fla's trick), so an output
    element that a code path forgets to write shows up as NaN instead of stale memory."""
    real_empty, real_empty_like, real_new_empty = (
        torch.empty,
        torch.empty_like,
        torch.Tensor.new_empty,
    )

    def poison(t):
        if t.dtype.is_floating_point or t.dtype.is_complex:
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(real_empty_like(*a, **k)))
    monkeypatch.setattr(
        torch.Tensor, "new_empty", lambda self, *a, **k: poison(real_new_empty(self, *a, **k))
    )
