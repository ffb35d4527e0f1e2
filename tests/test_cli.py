"""The main job's command line: the self-check passes on this machine and bad commands exit 2."""

from __future__ import annotations

import pytest

from linrnn.__main__ import main


def test_selfcheck_passes(capsys):
    assert main(["selfcheck", "-T", "17", "-B", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "36/36 passed" in out, out  # 12 variants (every family) × 3 modes


def test_selfcheck_fails_loudly_with_an_impossible_tolerance(capsys):
    """The table's verdict is real: a tolerance of 0 makes fp32 rows fail and exit 1."""
    assert main(["-T", "9", "-B", "1", "--repeats", "1", "--tol", "0"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["bogus"], ["selfcheck", "-T", "0"]])
def test_bad_command_line_exits_2(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
