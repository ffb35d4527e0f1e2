#!/usr/bin/env bash
# Tests: install the pinned test requirements and linrnn, lint, then the two tiers of the suite.
# CI runs this through .ci/run.
#
#   bash scripts/test.sh [all|fast|interpreter] [pytest arguments...]
#
#   all          (the default) the fast tier, then the interpreter tier
#   fast         only the fast tier: validation, the ops on the torch path, layers, models, the
#                bench harness (-m "not interpreter and not gpu"; a few minutes on 2 CPU cores)
#   interpreter  only the Triton kernels (-m "interpreter and not gpu"; Triton's interpreter
#                without a GPU)
#
# The tiers are assigned in tests/conftest.py. The GPU tests (tests/gpu/, marker gpu) skip without
# CUDA; on a GPU machine run them with `python3 -m pytest -m gpu`. Extra arguments go to pytest
# (e.g. -k mlstm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tier=all
case "${1:-}" in
  all | fast | interpreter) tier=$1; shift ;;
  -* | "") ;;
  *) echo "usage: bash scripts/test.sh [all|fast|interpreter] [pytest arguments...]" >&2; exit 2 ;;
esac

# torch only where none is installed: the pinned CPU build must not replace a user's (CUDA) one.
if python3 -c "import torch" 2>/dev/null; then
  python3 -m pip install -r <(grep -v '^torch==' requirements-test.txt)
else
  python3 -m pip install -r requirements-test.txt
fi
python3 -m pip install -e . --no-deps
python3 -m ruff check .
python3 -m ruff format --check .

# One pytest-xdist worker per CPU (LINRNN_TEST_WORKERS: a number, or 0 for one process), each
# with one intra-op thread and inductor's C++ compiles run one at a time in the worker: the
# interpreter tier is single-threaded Python, and a second thread pool or compile pool per core
# would only contend (a model's inductor test took 84 s instead of 102 beside a busy core).
# Work stealing: a worker that runs out of tests takes half of another's queue (xdist's default
# load scheduling keeps each worker's queue to itself at the end, and left one worker with the
# fast tier's last four minutes alone).
workers=${LINRNN_TEST_WORKERS:-auto}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-1}
if [[ $tier == all || $tier == fast ]]; then
  python3 -m pytest -q -n "$workers" --dist worksteal --durations=15 -m "not interpreter and not gpu" "$@"
fi
if [[ $tier == all || $tier == interpreter ]]; then
  python3 -m pytest -q -n "$workers" --dist worksteal --durations=15 -m "interpreter and not gpu" "$@"
fi
