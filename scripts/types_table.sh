#!/usr/bin/env bash
# Every speculative type beside llama.cpp's own loop (issue 28): for each type, on the shipped
# tiny-coder pairs (-t 1),
#   parallel 1  `ggspec bench --native`: ggspec's engine and llama-speculative-simple, the same
#               type and sizes, paired with plain greedy (-n N, REPS repetitions, the 12 prompts);
#   parallel 4  scripts/serve_bench.py: `ggspec serve` and llama-server, -np 4, 4 clients.
# Results land in docs/types/ (JSON + markdown); scripts/types_summary.py makes the table of
# docs/measurements/types.md.
#
#   scripts/types_table.sh [TYPE...]      (default: all ten)
#
# Knobs: N (64 tokens), REPS (2), SERVE=0 skips the parallel-4 runs; REAL=1 runs the draft-free
# types on the real Gemma 3 270M instead (the registry pair, -t 2; results named TYPE-gemma-*).
OUT=docs/types
source "$(dirname "$0")/bench_common.sh"  # strict mode, the repository root, $OUT, N; bench NAME ARGS...
REPS=${REPS:-2}
SERVE=${SERVE:-1}
REAL=${REAL:-0}
THREADS=1
TYPES=${*:-draft-simple draft-eagle3 draft-dflash draft-dspark draft-mtp ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache}
SUFFIX=""
if [ "$REAL" = 1 ]; then
    THREADS=2
    SUFFIX=-gemma
    TYPES=${*:-ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache}
fi

# the pair and flags of each type; draft-dspark and draft-mtp have no trained tiny-coder model:
# they run on their tests' fixtures only and are left out here (said in the summary)
args() {
    case $1 in
    draft-simple) echo --pair tiny-coder-simple --spec-draft-n-max 3 ;;
    draft-eagle3) echo --pair tiny-coder-eagle3 --spec-draft-n-max 4 ;;
    draft-dflash) echo --pair tiny-coder --spec-draft-n-max 7 ;;
    ngram-simple) echo -m models/tiny/tiny-coder.gguf --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-draft-n-max 8 ;;
    ngram-map-k|ngram-map-k4v) echo -m models/tiny/tiny-coder.gguf --spec-type "$1" --spec-ngram-map-k-size-n 3 --spec-draft-n-max 8 ;;
    ngram-mod) echo -m models/tiny/tiny-coder.gguf --spec-type ngram-mod --spec-ngram-mod-n-match 4 --spec-ngram-mod-n-min 2 --spec-draft-n-max 8 ;;
    ngram-cache) echo -m models/tiny/tiny-coder.gguf --spec-type ngram-cache --spec-draft-n-max 8 ;;
    *) echo "" ;;
    esac
}

# the same for serve_bench.py (a pair, the type, its sizes, the draft length)
serve_args() {
    case $1 in
    draft-simple) echo --pair tiny-coder-simple --spec-type draft-simple --n-max 3 ;;
    draft-eagle3) echo --pair tiny-coder-eagle3 --spec-type draft-eagle3 --n-max 4 ;;
    draft-dflash) echo --pair tiny-coder --spec-type draft-dflash --n-max 7 ;;
    ngram-simple) echo --pair tiny-coder --spec-type ngram-simple --n-max 8 --spec-args "'--spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8'" ;;
    ngram-map-k|ngram-map-k4v) echo --pair tiny-coder --spec-type "$1" --n-max 8 --spec-args "'--spec-$1-size-n 3 --spec-$1-size-m 8'" ;;
    ngram-mod) echo --pair tiny-coder --spec-type ngram-mod --n-max 8 --spec-args "'--spec-ngram-mod-n-match 4 --spec-ngram-mod-n-min 2 --spec-ngram-mod-n-max 8'" ;;
    ngram-cache) echo --pair tiny-coder --spec-type ngram-cache --n-max 8 ;;
    *) echo "" ;;
    esac
}

for t in $TYPES; do
    a=$(args "$t")
    if [ "$REAL" = 1 ]; then  # the same types and sizes on the real model
        a=${a/-m models\/tiny\/tiny-coder.gguf/--pair gemma-3-270m}
    fi
    if [ -z "$a" ]; then
        echo "== $t: no trained tiny-coder model for this type (see its tests)" >&2
        continue
    fi
    # shellcheck disable=SC2086
    bench "$t$SUFFIX-p1" $a --native
    if [ "$SERVE" = 1 ]; then
        s=$(serve_args "$t")
        if [ "$REAL" = 1 ]; then
            s="${s/--pair tiny-coder/--pair gemma-3-270m} -t 2"
        fi
        echo "== $t: serve_bench.py $s -np 4 --concurrency 4" >&2
        eval python scripts/serve_bench.py $s -np 4 --concurrency 4 --reps "$REPS" \
            --requests-per-client 6 --max-tokens "$N" --json "$OUT/$t$SUFFIX-p4.json" | tee "$OUT/$t$SUFFIX-p4.md" || true  # (llama-server may fail: still a row)
    fi
done
