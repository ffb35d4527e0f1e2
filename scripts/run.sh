#!/usr/bin/env bash
# Main job: install the runtime requirements and linrnn, run the self-check (every family and
# mode against the fp64 reference; exits 1 on any failure), then the benchmark suite
# (`linrnn bench`: the quick suite; on a CPU-only machine on the torch path, a few seconds).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python3 -m pip install -r requirements.txt
python3 -m pip install -e . --no-deps
python3 -m linrnn "$@"
python3 -m linrnn bench
