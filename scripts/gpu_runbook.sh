#!/usr/bin/env bash
# The GPU checks still open, one stage per device call (each well under 10 minutes), run from
# the checkout root on the GPU machine with the peer wheels in .whl/ (see ../shared/GPU.md).
# Results go to $OUT (default results/); the commit is taken from LINRNN_COMMIT, since the
# machine's copy of .git may be stale.
#
#   LINRNN_COMMIT=<hash> bash scripts/gpu_runbook.sh <stage>
#
# Stages (the order of benchmarks/results/2026-11-21-h200-s3-notes.md §5):
#   scalar-check  issue 3: correctness matrix (both chunk modes) and the kernel tests on CUDA,
#                 first: the walking kernels' shared preambles were refactored after the last
#                 GPU check (872a73c, and the recurrent backward after it)
#   big-offsets   issue 3: tensors beyond 2^31 elements (H200: ≈ 100 GB of GPU memory)
#   mlstm-target  issue 3: mLSTM vs mlstm_kernels (+ SDPA) at the target shape, side by side
#   mlstm-shapes  issue 3: the same at the other three shapes of the issue
#   vector-check  issue 4: vector-gate tests on CUDA and the bf16/fp16/fp32 correctness matrix
#   vector-sweep  issue 4: where a GLA / GLA+gv / RWKV6 fwd+bwd spends its time (per kernel,
#                 by launch role and engine step, DIAG_LOOP off and on × SCORES off and on),
#                 then the DIAG_LOOP / SCORES / VEC_TILES / GATED_BO / SCORE_TILES sweep
#                 (benchmarks/vector_sweep.py), ≤ 530 s
#   vector-sweep-fast  issue 4: the tiles of the fast chunks' kernels (SCORE_TILES inter and
#                 fast), GLA and RWKV6, ≤ 560 s
#   vector-bench  issue 4: RWKV6 against fla's chunk and fused-recurrent kernels at the
#                 issue's three shapes, chunk mode at L = 64, ≤ 560 s
#   vector-bench-gla  issue 4: GLA at GLA_SHAPE (default H16-K256) against fla's chunk and
#                 fused-recurrent kernels, L = 64 and 128 (chunk_gla's first call: 270-315 s),
#                 ≤ 585 s
#   compile       issue 9: benchmarks/compile_graphs.py
#   decode        issue 5: linrnn bench --suite decode
#   decode-sweep  issue 5: the decode step's tile (triton_recurrent.STEP_TILE), ≤ 560 s
#   varlen        issue 5: linrnn bench --suite varlen in two parts (linrnn ops, or VARLEN_OPS,
#                 then fla's peer if ≥ 240 s are left), ≤ BUDGET (520) s; every finished case stays in
#                 $OUT/varlen.json. Resume on a later call with the returned JSON (copied into the
#                 checkout, so that it travels): bash scripts/gpu_runbook.sh varlen <varlen.json>
#   train         issue 7: benchmarks/train_throughput.py (8 mixers, ~7 min)
#   cp            issue 8 (nvidia-h200-x2 or -x4): context_parallel.py on 1, 2 (and 4) GPUs,
#                 NCCL; every family's equality check, then 256K and 1M tokens, fwd+bwd
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT=${OUT:-results}
mkdir -p "$OUT"
C=${LINRNN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# Installed once per machine: stages may run side by side and must not race on /tmp/site.
if [ ! -d /tmp/site/fla ] && compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
fi
export PYTHONPATH=/tmp/site:$PWD

TARGET=B8-T8192-H16-K256-V256
OTHERS="B32-T2048-H16-K256-V256 B4-T16384-H16-K256-V256 B8-T8192-H32-K128-V128"
# Explicit names: a library name would also select its step kernels.
MLSTM_OPS=(
    "mlstm[sigmoid]" "mlstm[sigmoid,normalize]" "mlstm[exp]"
    mlstm_kernels:triton_xl_chunk_siging "mlstm_kernels:triton_xl_chunk_siging[normalize]"
    mlstm_kernels:triton_xl_chunk mlstm_kernels:triton_limit_chunk torch:sdpa_causal
)

stage=${1:?stage: scalar-check, big-offsets, mlstm-target, mlstm-shapes, vector-check, vector-sweep, vector-sweep-fast, vector-bench, vector-bench-gla, compile, decode, decode-sweep, varlen, train, cp}
case "$stage" in
scalar-check)
    # Test files in parallel first (compilation is CPU-bound), then the correctness matrix.
    # (test_triton_engine alone took > 240 s on the H200 in session 4: two halves)
    for f in test_triton_recurrent test_triton_recurrent_bwd; do
        (timeout 240 python3 -m pytest -q -p no:cacheprovider "tests/$f.py" >"$OUT/$f.txt" 2>&1
         echo "rc=$?" >>"$OUT/$f.txt") &
    done
    for half in "matches_reference" "not matches_reference"; do
        (timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_engine.py \
            -k "$half" >"$OUT/test_triton_engine-${half// /_}.txt" 2>&1
         echo "rc=$?" >>"$OUT/test_triton_engine-${half// /_}.txt") &
    done
    wait
    tail -qn 2 "$OUT"/test_triton_*.txt
    # Bitwise repeatability and fp32 agreement at T = 65,536 (a race hides at small T)
    timeout 200 python3 benchmarks/diag_determinism.py --stages 3 --repeats 2 \
        >"$OUT/determinism.txt" 2>&1
    grep -v Warn "$OUT/determinism.txt"
    timeout 320 python3 benchmarks/gpu_engine.py --skip-bench --ops linrnn --jobs 6 \
        --commit "$C" --out "$OUT/check_scalar.json"
    ;;
big-offsets)
    LINRNN_COMMIT=$C timeout 540 python3 benchmarks/gpu_big_offsets.py --out "$OUT/big_offsets.json"
    ;;
mlstm-target)
    timeout 540 python3 benchmarks/gpu_engine.py --skip-correctness --shapes $TARGET \
        --chunk-sizes 128 --modes chunk --ops "${MLSTM_OPS[@]}" --timeout 120 --commit "$C" \
        --out "$OUT/bench_mlstm_target.json"
    ;;
mlstm-shapes)
    # shellcheck disable=SC2086
    timeout 570 python3 benchmarks/gpu_engine.py --skip-correctness --shapes $OTHERS \
        --chunk-sizes 128 --modes chunk --ops "${MLSTM_OPS[@]}" --timeout 150 --commit "$C" \
        --out "$OUT/bench_mlstm_shapes.json"
    ;;
vector-check)
    # The kernel tests in SHARDS interleaved slices of the collected ids (one process took
    # > 400 s beside the matrix in session 7: compilation is CPU-bound), beside the matrix.
    # (the id lists stay out of $OUT: the device tool returns at most 8 files)
    SHARDS=${SHARDS:-4}
    IDS=$(mktemp -d)
    python3 -m pytest -q -p no:cacheprovider --collect-only tests/test_triton_vector.py \
        tests/test_triton_cumsum.py |
        grep '::' >"$IDS/all.txt"
    for i in $(seq 0 $((SHARDS - 1))); do
        awk -v n="$SHARDS" -v i="$i" 'NR % n == i' "$IDS/all.txt" >"$IDS/ids-$i.txt"
        mapfile -t ids <"$IDS/ids-$i.txt"
        (timeout 420 python3 -m pytest -q -p no:cacheprovider "${ids[@]}" \
            >"$OUT/pytest_vector-$i.txt" 2>&1; echo "rc=$?" >>"$OUT/pytest_vector-$i.txt") &
    done
    timeout 500 python3 benchmarks/gpu_engine.py --skip-bench --vector --ops gla "gla[gv]" rwkv6 \
        --jobs 4 --commit "$C" --out "$OUT/check_vector.json"
    wait
    echo "$(wc -l <"$IDS/all.txt") tests collected"
    tail -qn 2 "$OUT"/pytest_vector-*.txt
    ;;
vector-sweep)
    # The profile first, of both forms of the diagonal block (DIAG_LOOP off and on) × both
    # forms of the scores (SCORES off and on: gla and rwkv6 only), 10 profiles of ~10-20 s; its
    # own process, whose compiled kernels stay in the Triton cache for the sweep. No profile
    # starts after 200 s. Then the sweep with what is left (≥ 290 s); --deadline leaves room
    # for the config in flight.
    timeout 240 python3 benchmarks/vector_sweep.py --profile --profile-diag-loop both \
        --profile-scores both --deadline 200 --skip-sweep --commit "$C" \
        --out "$OUT/vector_profile.json" 2>&1 | tee "$OUT/vector_profile.txt"
    left=$((530 - SECONDS))
    timeout "$left" python3 benchmarks/vector_sweep.py --deadline $((left - 45)) \
        --commit "$C" --out "$OUT/vector_sweep.json" 2>&1 | tee "$OUT/vector_sweep.txt"
    ;;
vector-sweep-fast)
    # The fast chunks' kernels (session 9): apply_kernel's INTER, which finishes dq and dk in
    # fast chunks (inter_tiles), and fast_scores_kernel (fast_tiles), GLA and RWKV6, bf16
    timeout 560 python3 benchmarks/vector_sweep.py --ops gla rwkv6 --chunks 64 \
        --kernels inter_tiles fast_tiles --deadline 520 --commit "$C" \
        --out "$OUT/vector_sweep_fast.json" | tee "$OUT/vector_sweep_fast.txt"
    ;;
vector-bench)
    # RWKV6 at the issue's three shapes against fla's chunk and fused-recurrent kernels (one
    # head dim: fla compiles once; chunk_rwkv6's first call took 140 s in session 6, so 220 s
    # per shape). Explicit op names (a library name would select its step kernels too). A
    # half cut by its outer timeout leaves its worker running: check the JSON's statuses.
    timeout 560 python3 benchmarks/gpu_engine.py --skip-correctness --vector --chunk-sizes 64 \
        --modes chunk \
        --shapes B32-T2048-H64-K64-V64 B8-T8192-H64-K64-V64 B4-T16384-H64-K64-V64 \
        --ops rwkv6 "fla:fused_recurrent_rwkv6[seq]" fla:chunk_rwkv6 --timeout 220 \
        --commit "$C" --out "$OUT/bench_rwkv6_fla.json"
    ;;
vector-bench-gla)
    # GLA against fla at one shape per call (GLA_SHAPE: B8-T8192-H16-K256-V256, the default,
    # or B8-T8192-H32-K128-V128), L = 64 and 128: chunk_gla's first fwd+bwd compiles for
    # 270-315 s per head dim (session 10), so one shape fills a call. The README's GLA table.
    GLA_SHAPE=${GLA_SHAPE:-B8-T8192-H16-K256-V256}
    timeout 585 python3 benchmarks/gpu_engine.py --skip-correctness --vector \
        --chunk-sizes 64 128 --modes chunk --shapes "$GLA_SHAPE" \
        --ops gla fla:chunk_gla "fla:fused_recurrent_gla[seq]" --timeout 470 --commit "$C" \
        --out "$OUT/bench_gla_fla.json"
    ;;
compile)
    timeout 570 python3 benchmarks/compile_graphs.py --commit "$C" \
        --out "$OUT/compile_graphs.json"
    ;;
train)
    timeout 560 python3 benchmarks/train_throughput.py --commit "$C" \
        --out "$OUT/train-throughput.json"
    ;;
cp)
    gpus=$(nvidia-smi -L | wc -l)
    for g in 1 2 4; do
        [ "$g" -le "$gpus" ] || continue
        timeout 185 python3 -m torch.distributed.run --nproc_per_node "$g" \
            benchmarks/context_parallel.py --commit "$C" --out "$OUT/cp-${g}gpu.json" \
            >"$OUT/cp-${g}gpu.log" 2>&1
        echo "gpus=$g rc=$?"; grep -E "^check |tokens_per_s" "$OUT/cp-${g}gpu.log"
    done
    ;;
decode)
    timeout 570 python3 -m linrnn.bench --suite decode --commit "$C" --out-dir "$OUT"
    ;;
decode-sweep)
    # The decode step's value tile and warps (benchmarks/decode_sweep.py), in CUDA graphs;
    # no case starts after 480 s. The full 16-tile grid took ~70 s per op and shape in
    # session 8 (14 of them): these five candidates (tiles of ≤ 128 state entries a thread at
    # K = 256, where more spilled) covered 12 of them in under a minute.
    timeout 560 python3 -u benchmarks/decode_sweep.py --deadline 480 --commit "$C" \
        --candidates 16,1 32,2 64,2 64,4 128,8 \
        --out "$OUT/decode_sweep.json" 2>&1 | tee "$OUT/decode_sweep.txt"
    ;;
varlen)
    # Session 6 (H200): the 10 linrnn ops took ~330 s (each a worker: ~6 s start, 5-15 s first
    # call per layout with compilation, timing), then fla's peer compiled its chunk kernels
    # (70-140 s per layout: varlen and padded are two specializations) until the call's limit
    # cut it. So: the linrnn ops first, the peer only with ≥ 240 s left, each bounded by
    # --time-budget (a worker cut there is killed; the cases finished stay in the JSON) and by
    # --timeout per item (120 s linrnn, 220 s the peer); --resume adds to one JSON, so the
    # next call (given that JSON) runs only what is missing. Log: $OUT/varlen.log (unbuffered).
    J="$OUT/varlen.json"
    if [ -n "${2:-}" ]; then
        cp "$2" "$J" && chmod u+w "$J" || exit 2
    fi
    BUDGET=${BUDGET:-520}
    varlen_part() {  # <budget s> <timeout per item s> <ops...>
        local budget=$1 item=$2
        shift 2
        if [ "$budget" -lt 30 ]; then
            echo "varlen: ${budget} s left for --ops $*: skipped (run again with the JSON)"
            return 0
        fi
        timeout -k 10 $((budget + 30)) python3 -u -m linrnn.bench --suite varlen --ops "$@" \
            --resume --out "$J" --time-budget "$budget" --timeout "$item" --commit "$C" 2>&1 |
            tee -a "$OUT/varlen.log"
        echo "varlen --ops $*: rc=${PIPESTATUS[0]} at ${SECONDS} s" | tee -a "$OUT/varlen.log"
    }
    # shellcheck disable=SC2086
    varlen_part $((BUDGET - SECONDS - 10)) 120 ${VARLEN_OPS:-linrnn}
    left=$((BUDGET - SECONDS - 10))
    if [ "$left" -ge 240 ]; then
        varlen_part "$left" 220 peers
    else
        echo "varlen: ${left} s left: fla's peer (2 x 70-140 s of compile) waits for the next call"
    fi
    python3 -m linrnn.bench --suite varlen --plan --resume --out "$J"  # what is left
    ;;
*)
    echo "unknown stage: $stage" >&2
    exit 2
    ;;
esac
