#!/usr/bin/env bash
# The Gemma 4 tables of docs/mtp.md (issue 27): ggspec's draft-mtp loop with a gemma4-assistant
# drafter beside llama.cpp's own (--native) and both plain decoders,
#   tiny   the converter-shaped tiny pair of helpers.fixtures.gemma4 (under $GGSPEC_HOME/fixtures),
#          -t 1, 12 prompts: compute-bound on a CPU, so only the two loops' ratio means anything;
#   e2b    the real-shape dummy pair dummy-gemma-4-e2b (Q4_K_M target, Q8_0 assistant), -t 2, the
#          scale tables' code prompt and prose prompt: unchained, chained (--spec-draft-chain) and
#          chained with a reduced draft vocabulary (--spec-draft-vocab).
# The drafters are random, so acceptance is forced to the MTP-like profile on both sides: it
# measures the loops and the drafting cost, not a head.
#
#   scripts/mtp_gemma4_table.sh [tiny] [e2b]      (default: both)
#
# Knobs: N (64 tokens per prompt), REPS (3 tiny, 1 e2b), DEPTHS (1,3,5 tiny; 2,3,5 e2b), VOCAB (32768),
# PROFILE (mtp).
OUT=docs/mtp
source "$(dirname "$0")/bench_common.sh"  # strict mode, the repository root, $OUT, N; bench NAME ARGS...
PROFILE=${PROFILE:-mtp}
VOCAB=${VOCAB:-32768}
PARTS=${*:-tiny e2b}

for part in $PARTS; do
    case $part in
    tiny)
        read -r target drafter < <(PYTHONPATH="$(dirname "$0")/../tests" python -c '
import os
from pathlib import Path
from helpers.fixtures.gemma4 import ensure_gemma4_pair
home = Path(os.environ.get("GGSPEC_HOME", Path.home() / ".cache/ggspec"))
p = ensure_gemma4_pair(home / "fixtures")
print(p.target, p.drafter)')
        THREADS=1 REPS=${REPS:-3} bench "mtp-gemma4-tiny" -m "$target" -md "$drafter" --native --matrix \
            --spec-draft-n-max "${DEPTHS:-1,3,5}" --acceptance-profile "$PROFILE"
        ;;
    e2b)
        ggspec models make dummy-gemma-4-e2b
        common=(--pair dummy-gemma-4-e2b --native --matrix --spec-draft-n-max "${DEPTHS:-2,3,5}"
                --acceptance-profile "$PROFILE" --prompts docs/scale/prompts-code.jsonl)
        export THREADS=2 REPS=${REPS:-1}
        bench "mtp-gemma-4-e2b-unchained" "${common[@]}"
        bench "mtp-gemma-4-e2b-chained" "${common[@]}" --spec-draft-chain
        bench "mtp-gemma-4-e2b-chained-vocab" "${common[@]}" --spec-draft-chain --spec-draft-vocab "$VOCAB"
        ;;
    *) echo "unknown part $part (tiny, e2b)" >&2; exit 2 ;;
    esac
done
