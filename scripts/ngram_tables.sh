#!/usr/bin/env bash
# The n-gram draft types side by side with llama.cpp's own loop (issue 28): for each type ggspec
# runs without a draft model, one `ggspec bench --native` on the shipped tiny-coder target (-t 1,
# the 12 built-in prompts) and one on the real Gemma 3 270M (the registry pair, -t 2), each at
# draft length 8, both loops at the same sizes (each type's m-gram size / n_max = the draft length).
# Each JSON and markdown lands in docs/ngram/.
#
#   scripts/ngram_tables.sh [TYPE...]     TYPE: ngram-simple ngram-map-k ngram-map-k4v ngram-mod (default: all)
#
# Knobs: N (64 tokens per prompt), REPS (3), DEPTH (8); the sizes below (llama.cpp's defaults need
# longer repeats than 64-token answers hold: size 12 / n_match 24 rarely match there).
OUT=docs/ngram
source "$(dirname "$0")/bench_common.sh"  # strict mode, the repository root, $OUT, N; bench NAME ARGS...
REPS=${REPS:-3}
DEPTH=${DEPTH:-8}
TYPES=${*:-ngram-simple ngram-map-k ngram-map-k4v ngram-mod}

sizes() {
    case $1 in
    ngram-simple) echo --spec-ngram-simple-size-n 3 ;;
    ngram-map-k|ngram-map-k4v) echo --spec-ngram-map-k-size-n 3 ;;
    ngram-mod) echo --spec-ngram-mod-n-match 4 --spec-ngram-mod-n-min 2 ;;
    esac
}

for t in $TYPES; do
    # shellcheck disable=SC2046
    THREADS=1 bench "$t-tiny-coder" -m models/tiny/tiny-coder.gguf --spec-type "$t" $(sizes "$t") --native \
        --spec-draft-n-max "$DEPTH"
    # shellcheck disable=SC2046
    THREADS=2 bench "$t-gemma-3-270m" --pair gemma-3-270m --spec-type "$t" $(sizes "$t") --native \
        --spec-draft-n-max "$DEPTH"
done
