#!/usr/bin/env bash
# GPU checks and timings, one stage per device call (each under 10 minutes), run from the
# checkout root on the GPU machine. Peer wheels (fla-core, mlstm-kernels), where a stage needs
# them, go in .whl/. Results go to $OUT (default results/).
#
#   bash scripts/gpu_runbook.sh <stage> [args]
#
# Results are labelled with LINRNN_COMMIT, else this checkout's HEAD (set it where the copy's
# .git may not be the tree's own commit).
#
# Stages:
#   check [matrix [EXPR]|kernels [FILE...]]
#                pytest tests/gpu (the correctness matrix, offsets beyond 2^31 elements,
#                determinism, gate-gradient precision), the Triton kernel tests and the
#                numerical hardening tests (non-finite inputs, extreme gates) and the Mamba2
#                group kernels' bitwise match with the per-head ones on CUDA; with
#                matrix or kernels, only that part, with the whole call (matrix EXPR: the
#                tests/gpu tests that pytest -k EXPR selects; kernels FILE...: those test
#                files instead of all); both parts spread their work over the visible GPUs
#   paper-rows [OTHER]
#                the paper suite's linrnn rows (every op, mode chunk, the suite's shapes, or
#                those of PAPER_SHAPES, e.g. "B8-T8192-H32-K128-V128 B8-T8192-H64-K64-V64"),
#                fwd+bwd, with `linrnn bench`; with OTHER (a second checkout carried along, e.g.
#                `git worktree add .base <commit>`), the same rows from it, then a table of
#                this tree's times over OTHER's
#   heads [SHAPE...]
#                linrnn bench --suite heads (B=8, T=8192 at four head layouts) at the shapes
#                named, or all four: linrnn's rows, then the engine families' chunk peers, in
#                parts within BUDGET (540) s into $OUT/heads.json; HEADS_JSON=<json> resumes it
#   kernels [OTHER]
#                benchmarks/kernel_times.py: each kernel's GPU time in one forward+backward of
#                the ops KT_OPS at the shapes KT_SHAPES (default: the paper suite's engine ops at
#                B8-T8192 with K = V = 256 and 128) into $OUT/kernels.json; with OTHER, the same
#                for OTHER's linrnn, then the two side by side, kernel by kernel
#   decode       linrnn bench --suite decode (with the peers' step kernels)
#   varlen [JSON]
#                linrnn bench --suite varlen in two parts (linrnn ops, then fla's peer when
#                ≥ 240 s are left) within BUDGET (520) s; every finished case stays in
#                $OUT/varlen.json: run again with that JSON to do the rest
#   delta [JSON] linrnn bench --suite delta the same way (the delta-rule ops, then fla's
#                chunk_delta_rule, chunk_gated_delta_rule and fused_recurrent_gated_delta_rule
#                when ≥ 150 s are left) into $OUT/delta.json, with the ratios and targets
#   delta-decode linrnn bench --suite decode for the delta-rule ops and fla's fused recurrent
#                delta-rule steps ($OUT/delta-decode.json)
#   mamba2 [JSON]
#                linrnn bench --suite mamba2 the same way (linrnn.mamba2, then mamba_ssm's
#                mamba_chunk_scan_combined and fla's chunk_simple_gla on the mapped inputs when
#                ≥ 150 s are left) into $OUT/mamba2.json, with the ratios and targets; mamba_ssm
#                from its unpacked sdist .whl/mamba_ssm-*/ (LINRNN_MAMBA_SSM_SRC; its CUDA
#                extension is not needed), einops and packaging from .whl/*/ when missing
#   train [T] [JSON]
#                linrnn bench --suite train at sequence length T (8192; 2048 the other length
#                it is read at): every mixer's training tokens/s beside softmax attention (SDPA),
#                65,536 tokens per step, TRAIN_SECONDS (20) s of training each, within BUDGET
#                (540) s into $OUT/train-T<T>.json (loss curves in $OUT/train-T<T>/); the
#                mixers it had no time for are left to a second call with that JSON; with
#                TRAIN_GRAPH=1 every step a CUDA-graph replay (--cuda-graph), into
#                $OUT/train-graph-T<T>.json
#   train-profile [T] [MIXER...]
#                benchmarks/train_profile.py: one training step of the train suite's model per
#                mixer (all, or MIXER...) at sequence length T (8192) under torch.profiler, its
#                kernels' time by kind (mixer op, layer glue, GEMMs, optimizer, other PyTorch)
#                and the host's share, into $OUT/train-profile-T<T>.json; with TRAIN_GRAPH=1
#                also the step replayed from a CUDA graph (graph_ms)
#   mode-default [OP...]
#                benchmarks/mode_default.py: chunk against fused_chunk per op (all of the sweep,
#                or OP...), head dims and sequence × head walkers, with the mode mode=None picks
#                (the FUSED_DEFAULT table), two passes (the second in reverse shape order) into
#                $OUT/mode-default-1.json and $OUT/mode-default-2.json
#   tune ARGS    benchmarks/tune.py ARGS (tile candidates against the shipped tables)
#   glue         benchmarks/layer_glue.py: the layers' fused norm and gate and short convolution
#                against their PyTorch forms, per kind, into $OUT/glue.json
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT=${OUT:-results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the paper-rows stage runs from other folders
C=${LINRNN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# Installed once per machine: stages may run side by side and must not race on /tmp/site.
if [ ! -d /tmp/site/fla ] && compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
fi
# mamba_ssm's Python dependencies for its Triton kernels, from the wheels folder when missing.
for mod in einops packaging; do
    if [ ! -d "/tmp/site/$mod" ] && ! python3 -c "import $mod" >/dev/null 2>&1; then
        wheel=$(compgen -G ".whl/*/$mod-*.whl" | head -n 1)
        [ -n "$wheel" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site \
            "$wheel" >/dev/null 2>&1
    fi
done
# mamba_ssm's Triton SSD kernels from its unpacked sdist (linrnn.bench.peers.mamba_ssm_ssd).
if [ -z "${LINRNN_MAMBA_SSM_SRC:-}" ]; then
    for d in .whl/mamba_ssm-*/; do
        [ -f "$d/mamba_ssm/__init__.py" ] && export LINRNN_MAMBA_SSM_SRC="$PWD/${d%/}"
    done
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1

paper_rows() {  # <checkout> <json> <label>: the paper suite's linrnn chunk rows from that checkout
    (cd "$1" && PYTHONPATH=/tmp/site:$PWD timeout 270 python3 -m linrnn.bench --suite paper \
        --ops linrnn --modes chunk --timeout 120 --triton-cache "/tmp/triton-cache-$(basename "$1")" \
        --commit "$3" \
        ${PAPER_SHAPES:+--shapes $PAPER_SHAPES} --out "$2" --quiet)
}

# part <suite> <json> <budget s> <timeout per item s> <--ops arguments...>: one part of a
# suite with --resume --time-budget into the JSON (its log beside it, .log for .json)
part() {
    local suite=$1 J=$2 budget=$3 item=$4
    shift 4
    if [ "$budget" -lt 30 ]; then
        echo "$suite: ${budget} s left for --ops $*: skipped (run again with the JSON)"
        return 0
    fi
    timeout -k 10 $((budget + 30)) python3 -u -m linrnn.bench --suite "$suite" --ops "$@" \
        --resume --out "$J" --time-budget "$budget" --timeout "$item" --commit "$C" 2>&1 |
        tee -a "${J%.json}.log"
    echo "$suite --ops $*: rc=${PIPESTATUS[0]} at ${SECONDS} s" | tee -a "${J%.json}.log"
}

# suite_parts <suite> <json to resume or ""> <linrnn item timeout> <peer item timeout>
#             <seconds the peer part needs>: the suite's linrnn ops, then its peers when enough
# of BUDGET is left, each with --resume --time-budget into $OUT/<suite>.json (log beside it),
# then the plan of what is left (run the stage again with that JSON for the rest).
suite_parts() {
    local suite=$1 previous=$2 lin_item=$3 peer_item=$4 peer_need=$5
    local J="$OUT/$suite.json"
    if [ -n "$previous" ]; then
        cp "$previous" "$J" && chmod u+w "$J" || exit 2
    fi
    BUDGET=${BUDGET:-520}
    part "$suite" "$J" $((BUDGET - SECONDS - 10)) "$lin_item" linrnn
    local left=$((BUDGET - SECONDS - 10))
    if [ "$left" -ge "$peer_need" ]; then
        part "$suite" "$J" "$left" "$peer_item" peers
    else
        echo "$suite: ${left} s left: the peers' part waits for the next call"
    fi
    python3 -m linrnn.bench --suite "$suite" --plan --resume --out "$J"  # what is left
}

stage=${1:?stage: check, paper-rows, heads, kernels, decode, varlen, delta, delta-decode, mamba2, train, train-profile, tune, glue}
case "$stage" in
check)
    # tests/gpu first and alone (its matrix compiles 78 op × mode × dtype tasks in
    # LINRNN_GPU_JOBS worker processes, default three per four CPU cores: compilation is
    # CPU-bound), then the kernel test files in one pytest over LINRNN_TEST_JOBS xdist workers
    # (default the same three per four cores) in what is left of the call. On one GPU with 16
    # cores neither part finishes in its share: `check matrix` and `check kernels` give one
    # part the whole call. There, 18 workers ran 18 matrix tasks in 251 s (one task, an op ×
    # mode × dtype at its shapes, takes 150-250 s), and 15 workers ran 258 of the 263 tests of
    # test_triton_engine.py and test_triton_vector.py in 490 s: give those two files a call
    # each (`check kernels tests/test_triton_engine.py`). With 4 GPUs and 64 cores, 56 workers
    # ran all 78 tasks in 547 s (some failing early). `check matrix EXPR` runs the tests
    # pytest's `-k EXPR` selects (e.g. "linear_attn or retention", "mlstm and matches_fp64"),
    # so the matrix can be split over calls.
    part=${2:-both}
    if [ "$part" != kernels ]; then
        t=$([ "$part" = matrix ] && echo 560 || echo 330)
        jobs=$(( $(nproc) * 3 / 4 > 4 ? $(nproc) * 3 / 4 : 4 ))
        LINRNN_GPU_JOBS=${LINRNN_GPU_JOBS:-$jobs} timeout "$t" python3 -m pytest tests/gpu -q \
            -p no:cacheprovider ${3:+-k "$3"} 2>&1 | tee "$OUT/tests_gpu.txt"
    fi
    if [ "$part" != matrix ]; then
        t=$([ "$part" = kernels ] && echo 540 || echo 220)
        # One pytest over every file, its tests spread over xdist workers (compiling is the
        # work; one GPU serves them all): one process per file left the two largest files
        # (130 tests each) unfinished after 530 s while the others were done in 10-170 s.
        w=$(($(nproc) * 3 / 4 > 2 ? $(nproc) * 3 / 4 : 2))
        log="$OUT/kernel-tests.txt"
        files=(tests/test_triton_*.py tests/test_hardening_numerics.py
            tests/test_mamba2_group_scores.py)
        [ "$part" = kernels ] && [ $# -gt 2 ] && files=("${@:3}")
        # -v: each finished test's id is in the log, so a call cut by its timeout says which
        # tests are left (the ids missing from "PASSED" lines)
        timeout "$t" python3 -m pytest -v -p no:cacheprovider -n "${LINRNN_TEST_JOBS:-$w}" \
            "${files[@]}" >"$log" 2>&1
        echo "rc=$?" >>"$log"
        tail -n 2 "$log"
        echo "$(grep -c " PASSED " "$log") passed, $(grep -c " FAILED " "$log") failed"
        # the failures themselves, here: a call brings back only a few files
        grep -E "^FAILED|^ERROR|^E  " "$log" | cut -c1-240 | head -n 60 || true
    fi
    ;;
paper-rows)
    paper_rows "$PWD" "$OUT/paper-rows.json" "$C"
    if [ -n "${2:-}" ]; then
        paper_rows "$(cd "$2" && pwd)" "$OUT/paper-rows-other.json" \
            "$(cd "$2" && git rev-parse --short HEAD 2>/dev/null || basename "$2")"
        python3 - "$OUT/paper-rows.json" "$OUT/paper-rows-other.json" <<'PY'
import json, sys
new, old = (json.load(open(p)) for p in sys.argv[1:])
key = lambda r: (r["op"], r["shape"], r.get("note"))  # noqa: E731
base = {key(r): r for r in old["bench"]}
print(f"{'op':<26} {'shape':<24} {'this ms':>8} {'other ms':>9} {'ratio':>6}")
ratios = []
for r in new["bench"]:
    b = base.get(key(r), {})
    a, o = r.get("fwdbwd_ms"), b.get("fwdbwd_ms")
    ratio = a / o if a and o else None
    ratios.append(ratio) if ratio else None
    print(f"{r['op']:<26} {r['shape']:<24} {a or float('nan'):8.2f} {o or float('nan'):9.2f} "
          f"{ratio or float('nan'):6.3f}")
if ratios:
    import math
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"fwd+bwd, this / other: geometric mean {geo:.3f}, worst {max(ratios):.3f}, "
          f"{len(ratios)} rows; commits {new['machine']['git_commit']} / {old['machine']['git_commit']}")
PY
    fi
    ;;
kernels)
    KT=(python3 "$PWD/benchmarks/kernel_times.py" --ops ${KT_OPS:-linear_attn "linear_attn[normalize]" retention simple_gla gla "gla[gv]" rwkv6 "mlstm[sigmoid]"}
        --shapes ${KT_SHAPES:-B8-T8192-H16-K256-V256 B8-T8192-H32-K128-V128})
    timeout 270 "${KT[@]}" --out "$OUT/kernels.json" >"$OUT/kernels.txt" 2>&1
    if [ -n "${2:-}" ]; then
        (cd "$2" && PYTHONPATH=/tmp/site:$PWD timeout 270 "${KT[@]}" --out "$OUT/kernels-other.json" \
            >"$OUT/kernels-other.txt" 2>&1)
        python3 benchmarks/kernel_times.py --compare "$OUT/kernels.json" "$OUT/kernels-other.json"
    else
        cat "$OUT/kernels.txt"
    fi
    ;;
decode)
    timeout 570 python3 -m linrnn.bench --suite decode --commit "$C" --out-dir "$OUT"
    ;;
varlen)
    suite_parts varlen "${2:-}" 120 220 240
    ;;
heads)
    # One JSON per call ($OUT/heads.json, or HEADS_JSON's copy to resume), the shapes named
    # (default all four): linrnn's chunk and fused_chunk rows where fused_chunk can win (the
    # scalar-gate families and mLSTM), its chunk rows for GLA and RWKV6, then each family's
    # chunk peers (fla's compile and autotune for minutes an op: last), each part with what
    # is left of BUDGET (540) s.
    J="$OUT/heads.json"
    if [ -n "${HEADS_JSON:-}" ]; then
        cp "$HEADS_JSON" "$J" && chmod u+w "$J" || exit 2
    fi
    BUDGET=${BUDGET:-540}
    shapes=(${@:2})
    S=(${shapes[@]:+--shapes "${shapes[@]}"} --triton-cache /tmp/triton-cache-heads)
    part heads "$J" $((BUDGET - SECONDS - 10)) 150 linear_attn retention simple_gla \
        "mlstm[sigmoid]" "mlstm[exp]" --modes chunk fused_chunk "${S[@]}"
    part heads "$J" $((BUDGET - SECONDS - 10)) 150 gla rwkv6 --modes chunk "${S[@]}"
    part heads "$J" $((BUDGET - SECONDS - 10)) 300 mlstm_kernels:triton_xl_chunk_siging \
        mlstm_kernels:triton_xl_chunk mlstm_kernels:triton_limit_chunk fla:chunk_linear_attn \
        "fla:chunk_linear_attn[normalize]" fla:chunk_retention fla:chunk_simple_gla \
        fla:chunk_rwkv6 fla:chunk_gla "${S[@]}"
    python3 -m linrnn.bench --suite heads --plan --resume --out "$J" "${S[@]}"  # what is left
    python3 -m linrnn.bench --report "$J" | tail -n 60
    ;;
delta)
    suite_parts delta "${2:-}" 150 220 150
    ;;
delta-decode)
    timeout 570 python3 -m linrnn.bench --suite decode --ops delta_rule gated_delta_rule \
        fla:fused_recurrent_delta_rule fla:fused_recurrent_gated_delta_rule --commit "$C" \
        --out "$OUT/delta-decode.json"
    ;;
mamba2)
    # mamba_ssm autotunes each kernel's configurations on its first call: up to minutes
    suite_parts mamba2 "${2:-}" 150 400 150
    ;;
train)
    # One shared Triton cache: a second call (or the other length) compiles nothing again, so
    # its first steps are marked c in the table.
    T=${2:-8192}
    NAME=train; GRAPH=()
    if [ "${TRAIN_GRAPH:-0}" = 1 ]; then
        NAME=train-graph; GRAPH=(--cuda-graph)
    fi
    J="$OUT/$NAME-T$T.json"
    if [ -n "${3:-}" ]; then
        cp "$3" "$J" && chmod u+w "$J" || exit 2
    fi
    BUDGET=${BUDGET:-540}
    left=$((BUDGET - SECONDS - 20))
    timeout -k 10 $((left + 30)) python3 -u -m linrnn.bench --suite train --seq-len "$T" \
        --train-seconds "${TRAIN_SECONDS:-20}" --timeout $((${TRAIN_SECONDS:-20} + 240)) \
        --resume --out "$J" --time-budget "$left" "${GRAPH[@]}" \
        --triton-cache /tmp/triton-cache-train --commit "$C" 2>&1 | tee -a "$OUT/$NAME-T$T.log"
    echo "$NAME T=$T: rc=${PIPESTATUS[0]} at ${SECONDS} s" | tee -a "$OUT/$NAME-T$T.log"
    python3 -m linrnn.bench --suite train --seq-len "$T" --plan --resume --out "$J" \
        "${GRAPH[@]}"  # what is left
    ;;
train-profile)
    T=${2:-8192}
    GRAPH=()
    [ "${TRAIN_GRAPH:-0}" = 1 ] && GRAPH=(--cuda-graph)
    timeout 570 python3 benchmarks/train_profile.py --seq-len "$T" ${3:+--mixers "${@:3}"} \
        "${GRAPH[@]}" --out "$OUT/train-profile-T$T.json" 2>&1 | tee "$OUT/train-profile-T$T.log"
    ;;
mode-default)
    shift
    OPS=(${1:+--ops "$@"})
    timeout 120 python3 benchmarks/mode_default.py --warm "${OPS[@]}"
    timeout 220 python3 benchmarks/mode_default.py "${OPS[@]}" --commit "$C" \
        --out "$OUT/mode-default-1.json" 2>&1 | tee "$OUT/mode-default-1.log"
    timeout 220 python3 benchmarks/mode_default.py "${OPS[@]}" --reverse --commit "$C" \
        --out "$OUT/mode-default-2.json" 2>&1 | tee "$OUT/mode-default-2.log"
    ;;
tune)
    shift
    timeout 570 python3 benchmarks/tune.py "$@" --out "$OUT/tune.json"
    ;;
glue)
    timeout 570 python3 benchmarks/layer_glue.py --out "$OUT/glue.json" \
        2>&1 | tee "$OUT/glue.log"
    ;;
*)
    echo "unknown stage: $stage" >&2
    exit 2
    ;;
esac
