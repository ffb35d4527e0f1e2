#!/usr/bin/env bash
# Issue 6: `linrnn bench --suite paper` (and headdim, chunksize) on the GPU machine, with the
# peers side by side, in numbered parts of one device call each (each part stops itself at
# BUDGET seconds and is killed at 570 s). Run from the checkout root there, with the peer
# wheels in .whl/ (carry .whl; see ../shared/GPU.md and scripts/gpu_runbook.sh):
#
#   LINRNN_COMMIT=<hash> bash scripts/paper_runbook.sh <part>     # 1..12, or its name
#   bash scripts/paper_runbook.sh plan                 # what each part runs / has left (no GPU)
#   FROM=<folder with the parts' JSONs> bash scripts/paper_runbook.sh report    # (no GPU)
#       -> benchmarks/results/<DATE>-<GPU>-{paper,chunksize,headdim}.json, .md and plots/
#
# Each part writes RES/<suite>-<n>-<name>.json (+ .md) and copies both into $OUT when set.
# RES is git-ignored and stays on the machine between calls while it is warm. A part that
# stops at its budget exits 3 (the bench's "run the same command again with --resume"): run
# the same part again and it does only the rest. If the machine was given back in between,
# put the fetched JSON back at RES/<file> here and carry it with the call (carry: ignored
# paths), or the part starts over.
#
# Order: linrnn alone first, then the peers from cheap to dear, then chunksize and headdim.
# Estimates (H200, session 3's figures: linrnn first call 7-10 s per op at K=256 and 2-3 s at
# K=128, fwd+bwd 8-40 ms; worker start ≈ 4 s per case; mlstm_kernels recompiles per shape,
# 4-8 s; fla first calls 72-95 s per head-dim config, chunk_gla / chunk_rwkv6 > 110 s):
#
#   part                 runs                                                  rows  estimate
#   1  linrnn-chunk      paper, every linrnn op, mode chunk                     57   4-7 min
#   2  linrnn-fused      paper, every linrnn op, mode fused_chunk               57   4-7 min
#   3  peers-cheap       paper, torch SDPA + the 4 mlstm_kernels chunkwise      30   3-5 min
#   4  fla-simple        paper, fla chunk_simple_gla, chunk_linear_attn (both)  18   4-7 min
#   5  fla-ret-rwkv6     paper, fla chunk_retention, chunk_rwkv6                 9   5-7 min
#   6  fla-gla           paper, fla chunk_gla                                    6   4-6 min
#   7  chunksize-a       chunksize, linear_attn ×2, retention, simple_gla, mlstm ×3  49  6-9 min
#   8  chunksize-b       chunksize, gla, gla[gv], rwkv6                         21   3-5 min
#   9  headdim-chunk     headdim, every linrnn op, mode chunk                   40   5-8 min
#   10 headdim-fused     headdim, every linrnn op, mode fused_chunk             40   5-8 min
#   11 headdim-peers     headdim, torch SDPA + the 4 mlstm_kernels chunkwise    20   2-4 min
#   12 fla-recurrent     paper, fla fused_recurrent_gla / _rwkv6, whole sequences  9   3-6 min
#   (1-6 and 12: the paper suite, ≈ 30-45 min of device time; 7-11: ≈ 20-35 min more)
#
# Peers known to be slow or to fail, and what the parts do about them:
# - fla chunk_gla and chunk_rwkv6: > 110 s on their first call (compile + autotune), once per
#   head-dim config (gla: 2 configs, rwkv6: 1): each in a part with little else, last among
#   the paper peers, --timeout 300 per shape.
# - fla chunk ops (simple_gla, linear_attn, retention): 72-95 s first calls: --timeout 240,
#   and one shared Triton cache (TC) for every fla part: fla caches its autotuning on disk
#   there, chunk_linear_attn runs on chunk_simple_gla's kernels, and a rerun after a budget
#   stop does not compile again (first s then marked "c": it may exclude compilation).
# - fla chunk_simple_gla: its backward raises on Triton < 3.7.1 on Hopper; the row keeps the
#   forward time, status "error (first backward)".
# - mlstm_kernels triton_xl_chunk may abort the process in Triton's compiler: every case runs
#   in its own worker, a crash is that shape's status, --timeout 120.
# - headdim with fla: not in a part (6 ops × 4 head dims × ≈ 80 s of first calls ≈ 30 min,
#   and K = 512 is likely out of fla's range); `--suite headdim --ops fla:chunk_linear_attn`
#   alone would take ≈ 5 min.
# linrnn parts keep a fresh Triton cache per case: their first s includes compilation (the
# < 30 s target). chunksize shares TC: its chunk size is a runtime argument of the chunk
# kernels, so an op compiles once for its seven sizes.
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
    12 | fla-recurrent) NAME=paper-12-fla-recurrent  # issue 4: fla's whole-sequence recurrence
        ARGS=(--suite paper --ops "fla:fused_recurrent_gla[seq]" "fla:fused_recurrent_rwkv6[seq]"
              --timeout 240 --triton-cache "$TC") ;;
    *) return 1 ;;
    esac
}

part=${1:?part: 1..11 (or its name), plan or report}
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
    STEM=${DEST:-benchmarks/results}/${DATE:-$(date -u +%F)}-${GPU:-h200}
    for suite in paper chunksize headdim; do
        files=("$FROM"/"$suite"-*.json)
        [ -e "${files[0]}" ] || { echo "no $suite parts in $FROM"; continue; }
        python3 -m linrnn.bench --report "${files[@]}" --out "$STEM-$suite.json" --plots
    done
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
