#!/usr/bin/env bash
# The Gemma 4 row of docs/mtp.md (issue 27): ggspec's draft-mtp loop with a gemma4-assistant drafter
# beside llama.cpp's own (--native) and both plain decoders, on the tiny converter-shaped pair of
# ggspec.fixtures.gemma4 (written under $GGSPEC_HOME/fixtures). The drafter is random, so acceptance
# is forced to the MTP-like profile on both sides: it measures the loops, not a head. The tiny pair
# is compute-bound on a CPU (see the README): the ratio of the two loops is the number to read.
#
#   scripts/mtp_gemma4_table.sh
#
# Knobs: THREADS (1: a tiny model), N (64 tokens per prompt), REPS (3), DEPTHS (1,3,5), PROFILE (mtp).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=docs/mtp
THREADS=${THREADS:-1}
N=${N:-64}
REPS=${REPS:-3}
DEPTHS=${DEPTHS:-1,3,5}
PROFILE=${PROFILE:-mtp}
mkdir -p "$OUT"

source scripts/bench_common.sh  # bench NAME ARGS...

read -r target drafter < <(python -c '
import os
from pathlib import Path
from ggspec.fixtures.gemma4 import ensure_gemma4_pair
home = Path(os.environ.get("GGSPEC_HOME", Path.home() / ".cache/ggspec"))
p = ensure_gemma4_pair(home / "fixtures")
print(p.target, p.drafter)')
bench "mtp-gemma4-tiny" -m "$target" -md "$drafter" --native --matrix --spec-draft-n-max "$DEPTHS" \
    --acceptance-profile "$PROFILE"
