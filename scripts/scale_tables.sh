#!/usr/bin/env bash
# The speed tables of docs/scale.md, measured on real-shape dummy models (issue 26): every figure
# there comes from one of the commands below, saved as JSON (and PNG plots) under docs/scale/.
# Forced acceptance throughout (`--acceptance-profile`): it measures the system, not a draft.
#
#   scripts/scale_tables.sh [TABLE...]      TABLE: make verify pays seed000 cache (default: all)
#
# Knobs: THREADS (2: both cores pay at these sizes), N (64 tokens per prompt), REPS (1), SIZES
# ("0.6b 1.7b 4b"), VERIFY_HYBRID ("0.8b 4b": hybrid shapes in the verify-cost table), HYBRID
# ("0.8b": the capped-planes table, short prompts and the 4.3k-token one on the first size only; the 4B
# hybrid's ten configurations take ~25 minutes here), CACHE_SIZE (1.7b), PARALLEL (1,4).
OUT=docs/scale
source "$(dirname "$0")/bench_common.sh"  # strict mode, the repository root, $OUT, N; bench NAME ARGS...
THREADS=${THREADS:-2}
REPS=${REPS:-1}
SIZES=${SIZES:-"0.6b 1.7b 4b"}
HYBRID=${HYBRID:-"0.8b"}
VERIFY_HYBRID=${VERIFY_HYBRID:-"0.8b 4b"}
PARALLEL=${PARALLEL:-1,4}
TABLES=${*:-make verify pays seed000 cache}
head -n 1 "$OUT/prompts.jsonl" > "$OUT/prompts-code.jsonl"
sed -n 3p "$OUT/prompts.jsonl" >> "$OUT/prompts-code.jsonl"  # one code, one prose prompt

for table in $TABLES; do
    case $table in
    make)
        for s in $SIZES; do ggspec models make "dummy-qwen3-$s"; done
        for s in $VERIFY_HYBRID; do ggspec models make "dummy-qwen3.5-$s"; done ;;
    verify)  # what a verify of n rows costs against one decode
        args=()
        for s in $SIZES; do args+=(--pair "dummy-qwen3-$s"); done
        for s in $VERIFY_HYBRID; do args+=(--pair "dummy-qwen3.5-$s"); done
        python scripts/verify_cost.py "${args[@]}" -t "$THREADS" -o "$OUT/verify-cost.json" | tee "$OUT/verify-cost.md" ;;
    pays)  # when speculation pays: ggspec and llama.cpp's loop at n_max 3 / 7 / 15 per profile and size
        for s in $SIZES; do
            case $s in 0.6b) profiles="dflash mtp uniform" ;; 1.7b) profiles="dflash mtp" ;; *) profiles=dflash ;; esac
            for p in $profiles; do
                bench "pays-qwen3-$s-$p" --pair "dummy-qwen3-$s" --native --matrix --spec-draft-n-max 3,7,15 \
                    --acceptance-profile "$p" --prompts "$OUT/prompts-code.jsonl"
            done
        done ;;
    seed000)  # the capped-planes table: planes x layout on the hybrid target, DFlash profile, n_max 7
        first=1
        for s in $HYBRID; do
            bench "seed000-qwen3.5-$s" --pair "dummy-qwen3.5-$s" --matrix --spec-draft-n-max 7 \
                --spec-draft-rs-planes uncapped,5,4,3 --spec-draft-rs-planes-lead 0,default,auto \
                --acceptance-profile dflash --prompts "$OUT/prompts-code.jsonl"
            if (( first )); then
                bench "seed000-qwen3.5-$s-long" --pair "dummy-qwen3.5-$s" --matrix --spec-draft-n-max 7 \
                    --spec-draft-rs-planes uncapped,5,4,3 --spec-draft-rs-planes-lead 0,default,auto \
                    --acceptance-profile dflash --prompts "$OUT/long-prompt.jsonl" -c 8192
                first=0
            fi
        done ;;
    cache)  # cache types x parallel slots at one size
        s=${CACHE_SIZE:-1.7b}
        for t in f16 q8_0 q4_0; do
            bench "cache-qwen3-$s-$t" --pair "dummy-qwen3-$s" --matrix -ctk "$t" -ctv "$t" --parallel "$PARALLEL" \
                --spec-draft-n-max 7 --acceptance-profile dflash --prompts "$OUT/prompts.jsonl"
        done ;;
    *) echo "unknown table $table (make verify pays seed000 cache)" >&2; exit 2 ;;
    esac
done
