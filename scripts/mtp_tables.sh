#!/usr/bin/env bash
# The draft-mtp tables of docs/mtp.md (issue 27), measured on the real-shape dummy Qwen3.5 models:
# ggspec unchained, chained (--spec-draft-chain) and chained with a reduced draft vocabulary
# (--spec-draft-vocab), each bench with llama.cpp's own draft-mtp loop (--native) and both plain
# decoders in the same run, at draft depths 2, 3 and 5. The dummies' MTP blocks are random, so
# acceptance is forced to the MTP-like profile on both sides (`--acceptance-profile mtp`): it
# measures the loop and the drafting cost, not a head. Each JSON and markdown lands in docs/mtp/.
#
#   scripts/mtp_tables.sh [SIZE...]      SIZE: 0.8b 2b 4b (default: 0.8b 4b)
#
# Knobs: THREADS (2), N (64 tokens per prompt), REPS (1), DEPTHS (2,3,5), VOCAB (32768), PROFILE (mtp).
OUT=docs/mtp
source "$(dirname "$0")/bench_common.sh"  # strict mode, the repository root, $OUT, N; bench NAME ARGS...
THREADS=${THREADS:-2}
REPS=${REPS:-1}
DEPTHS=${DEPTHS:-2,3,5}
VOCAB=${VOCAB:-32768}
PROFILE=${PROFILE:-mtp}
SIZES=${*:-0.8b 4b}

for s in $SIZES; do
    ggspec models make "dummy-qwen3.5-$s"
    common=(--pair "dummy-qwen3.5-$s" --spec-type draft-mtp --native --matrix --spec-draft-n-max "$DEPTHS"
            --acceptance-profile "$PROFILE" --prompts docs/scale/prompts-code.jsonl)
    bench "mtp-qwen3.5-$s-unchained" "${common[@]}"
    bench "mtp-qwen3.5-$s-chained" "${common[@]}" --spec-draft-chain
    bench "mtp-qwen3.5-$s-chained-vocab" "${common[@]}" --spec-draft-chain --spec-draft-vocab "$VOCAB"
done
python scripts/mtp_summary.py "$OUT"/mtp-*.json | tee "$OUT/summary.md"
