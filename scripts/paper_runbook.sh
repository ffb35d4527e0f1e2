#!/usr/bin/env bash
# `linrnn bench --suite paper` (and chunksize, headdim) on the GPU machine, with the peers side
# by side, in numbered parts of one device call each (each part stops itself at BUDGET seconds
# and is killed at 570 s). Run from the checkout root there, with the peer wheels (fla-core,
# mlstm-kernels) in .whl/:
#
#   bash scripts/paper_runbook.sh <part>              # 1..12, or its name
#   bash scripts/paper_runbook.sh plan                 # what each part runs / has left (no GPU)
#   FROM=<folder with the parts' JSONs> bash scripts/paper_runbook.sh report    # (no GPU)
#       -> benchmarks/results/{paper,chunksize,headdim}.json, .md and plots/
#
# Each part writes RES/<suite>-<n>-<name>.json (+ .md) and copies both into $OUT when set.
# RES is git-ignored and stays on the machine between calls while it is warm. A part that
# stops at its budget exits 3 (the bench's "run the same command again with --resume"): run
# the same part again and it does only the rest. If the machine was given back in between,
# put the fetched JSON back at RES/<file> and carry it with the call, or the part starts over.
#
# Order: linrnn alone first, then the peers from cheap to dear, then chunksize and headdim.
#
#   part                 runs
#   1  linrnn-chunk      paper, every linrnn op, mode chunk
#   2  linrnn-fused      paper, every linrnn op, mode fused_chunk
#   3  peers-cheap       paper, torch SDPA + the 4 mlstm_kernels chunkwise kernels
#   4  fla-simple        paper, fla chunk_simple_gla, chunk_linear_attn (both)
#   5  fla-ret-rwkv6     paper, fla chunk_retention, chunk_rwkv6
#   6  fla-gla           paper, fla chunk_gla
#   7  chunksize-a       chunksize, linear_attn x2, retention, simple_gla, mlstm x3
#   8  chunksize-b       chunksize, gla, gla[gv], rwkv6
#   9  headdim-chunk     headdim, every linrnn op, mode chunk
#   10 headdim-fused     headdim, every linrnn op, mode fused_chunk
#   11 headdim-peers     headdim, torch SDPA + the 4 mlstm_kernels chunkwise kernels
#   12 fla-recurrent     paper, fla fused_recurrent_gla / _rwkv6, whole sequences
#
# Peers that are slow or fail on the first call, and what the parts do about them:
# - fla chunk_gla and chunk_rwkv6 compile and autotune for minutes on their first call, once
#   per head-dim config: each in a part with little else, --timeout 300 per shape.
# - fla's other chunk ops: 1-2 minutes on their first call: --timeout 240, and one shared
#   Triton cache (TC) for every fla part, where fla keeps its autotuning (a rerun after a
#   budget stop does not compile again; first s then marked "c").
# - fla chunk_simple_gla: its backward raises on Triton < 3.7.1 on Hopper; the row keeps the
#   forward time, status "error (first backward)".
# - mlstm_kernels triton_xl_chunk may abort the process in Triton's compiler: every case runs
#   in its own worker, a crash is that shape's status, --timeout 120.
# linrnn parts keep a fresh Triton cache per case: their first s includes compilation.
# chunksize shares TC: the chunk size is a runtime argument of the chunk kernels, so an op
# compiles once for its seven sizes.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

RES=${RES:-benchmarks/results/tmp/paper}
TC=${TC:-benchmarks/results/tmp/triton-cache}
BUDGET=${BUDGET:-480}
C=${LINRNN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
PARTS=(1 2 3 4 5 6 7 8 9 10 11 12)

part_args() {  # sets NAME (the JSON's name) and ARGS (linrnn bench arguments) of part $1
    case "$1" in
    1 | linrnn-chunk) NAME=paper-1-linrnn-chunk
        ARGS=(--suite paper --ops linrnn --modes chunk --timeout 150) ;;
    2 | linrnn-fused) NAME=paper-2-linrnn-fused
        ARGS=(--suite paper --ops linrnn --modes fused_chunk --timeout 150) ;;
    3 | peers-cheap) NAME=paper-3-peers-cheap
        ARGS=(--suite paper --ops torch mlstm_kernels --timeout 120) ;;
    4 | fla-simple) NAME=paper-4-fla-simple
        ARGS=(--suite paper --ops fla:chunk_simple_gla fla:chunk_linear_attn
              "fla:chunk_linear_attn[normalize]" --timeout 240 --triton-cache "$TC") ;;
    5 | fla-ret-rwkv6) NAME=paper-5-fla-ret-rwkv6
        ARGS=(--suite paper --ops fla:chunk_retention fla:chunk_rwkv6 --timeout 300
              --triton-cache "$TC") ;;
    6 | fla-gla) NAME=paper-6-fla-gla
        ARGS=(--suite paper --ops fla:chunk_gla --timeout 300 --triton-cache "$TC") ;;
    7 | chunksize-a) NAME=chunksize-7-a
        ARGS=(--suite chunksize --ops linear_attn retention simple_gla mlstm --timeout 150
              --triton-cache "$TC") ;;
    8 | chunksize-b) NAME=chunksize-8-b
        ARGS=(--suite chunksize --ops gla rwkv6 --timeout 150 --triton-cache "$TC") ;;
    9 | headdim-chunk) NAME=headdim-9-linrnn-chunk
        ARGS=(--suite headdim --ops linrnn --modes chunk --timeout 150) ;;
    10 | headdim-fused) NAME=headdim-10-linrnn-fused
        ARGS=(--suite headdim --ops linrnn --modes fused_chunk --timeout 150) ;;
    11 | headdim-peers) NAME=headdim-11-peers-cheap
        ARGS=(--suite headdim --ops torch mlstm_kernels --timeout 120) ;;
    12 | fla-recurrent) NAME=paper-12-fla-recurrent  # fla's whole-sequence recurrence
        ARGS=(--suite paper --ops "fla:fused_recurrent_gla[seq]" "fla:fused_recurrent_rwkv6[seq]"
              --timeout 240 --triton-cache "$TC") ;;
    *) return 1 ;;
    esac
}

part=${1:?part: 1..12 (or its name), plan or report}
case "$part" in
plan)  # no GPU: each part's cases and shapes, less what its JSON in RES already holds
    for p in "${PARTS[@]}"; do
        part_args "$p"
        echo "== part $p: $NAME"
        python3 -m linrnn.bench "${ARGS[@]}" --plan --resume --out "$RES/$NAME.json"
    done
    ;;
report)  # no GPU: merge the parts of each suite into benchmarks/results/, with .md and plots
    FROM=${FROM:-$RES}
    DEST=${DEST:-benchmarks/results}
    for suite in paper chunksize headdim; do
        files=("$FROM"/"$suite"-*.json)
        [ -e "${files[0]}" ] || { echo "no $suite parts in $FROM"; continue; }
        python3 -m linrnn.bench --report "${files[@]}" --out "$DEST/$suite.json"
    done
    PYTHONPATH=$PWD python3 -c "import json, sys; from linrnn.bench import plots; \
[plots.make_plots(json.load(open(f'$DEST/{s}.json')), '$DEST/plots') \
 for s in ('paper', 'chunksize') if __import__('os').path.exists(f'$DEST/{s}.json')]"
    ;;
*)
    part_args "$part" || { echo "unknown part: $part (1..11, plan, report)" >&2; exit 2; }
    mkdir -p "$RES"
    # Installed once per machine (as in scripts/gpu_runbook.sh).
    if [ ! -d /tmp/site/fla ] && compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
    fi
    export PYTHONPATH=/tmp/site:$PWD
    timeout 570 python3 -m linrnn.bench "${ARGS[@]}" --commit "$C" --out "$RES/$NAME.json" \
        --resume --time-budget "$BUDGET"
    rc=$?
    if [ -n "${OUT:-}" ]; then
        cp "$RES/$NAME.json" "$RES/$NAME.md" "$OUT"/ 2>/dev/null
    fi
    case $rc in
    3) echo "part $part ($NAME): stopped at its ${BUDGET} s budget; run part $part again" ;;
    124) echo "part $part ($NAME): killed at 570 s; run part $part again (it resumes)" ;;
    esac
    exit $rc
    ;;
esac
