#!/usr/bin/env bash
# Tests: install the pinned test requirements and linrnn, lint, then the whole test suite.
# CI runs this through .ci/run. Extra arguments go to pytest (e.g. -k mlstm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python3 -m pip install -r requirements-test.txt
python3 -m pip install -e . --no-deps
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m pytest -q "$@"
