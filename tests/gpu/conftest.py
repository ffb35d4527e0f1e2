"""GPU checks: the tests marked ``gpu`` skip without CUDA; the others run a check's machinery
at a tiny shape on any machine (under the Triton interpreter without a GPU).
``pytest tests/gpu -q`` ends with the worst errors the checks recorded."""

from __future__ import annotations

import pytest

# (check, case) -> {error name: value}, filled by the tests through the ``worst_errors`` fixture
RECORDED: dict[tuple[str, str], dict[str, float]] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


def worse(a: float, b: float) -> float:
    """The worse of two errors; NaN is worst."""
    return a if a != a or (b == b and a > b) else b


@pytest.fixture
def worst_errors():
    """``worst_errors(check, case, errors)`` records a case's errors for the summary; cases of
    the same name keep the worst of each error (e.g. one line per op × mode × dtype over the
    shapes)."""

    def record(check: str, case: str, errors: dict[str, float]) -> None:
        merged = RECORDED.setdefault((check, case), {})
        for name, value in errors.items():
            merged[name] = worse(value, merged[name]) if name in merged else value

    return record


def summary_lines(recorded: dict) -> list[str]:
    """One line per recorded case: its worst error and which tensor it was."""
    lines = []
    for (check, case), errors in sorted(recorded.items()):
        if not errors:
            continue
        name, value = max(errors.items(), key=lambda kv: (kv[1] != kv[1], kv[1]))  # NaN first
        lines.append(f"{check:<14} {case:<58} worst {value:9.2e} ({name})")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = summary_lines(RECORDED)
    if lines:
        terminalreporter.section("worst errors (RMS-relative unless stated)")
        for line in lines:
            terminalreporter.write_line(line)
