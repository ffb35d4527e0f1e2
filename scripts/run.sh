#!/usr/bin/env bash
# Main job: install the runtime requirements and linrnn, run the self-check (every family and
# mode against the fp64 reference; exits 1 on any failure), then the benchmark suite
# (`linrnn bench`: the quick suite; on a CPU-only machine on the torch path, a few seconds).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# torch only where none is installed: the pinned CPU build must not replace a user's (CUDA) one.
if python3 -c "import torch" 2>/dev/null; then
  python3 -m pip install -r <(grep -v '^torch==' requirements.txt)
else
  python3 -m pip install -r requirements.txt
fi
python3 -m pip install -e . --no-deps
python3 -m linrnn "$@"
python3 -m linrnn bench
