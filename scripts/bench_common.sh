# Sourced by the table scripts (scale, mtp, mtp_gemma4, ngram, types) once they have set OUT:
#     source "$(dirname "$0")/bench_common.sh"
# Strict mode, the repository root as the working folder, $OUT made and N (tokens per prompt, 64
# unless set); THREADS and REPS are the scripts' own.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-64}
mkdir -p "$OUT"

bench() {  # bench NAME ARGS...: one saved benchmark, its markdown next to it
    local name=$1; shift
    echo "== $name: ggspec bench $*" >&2
    ggspec bench "$@" -t "$THREADS" -n "$N" -r "$REPS" --save "$OUT/$name.json" > "$OUT/$name.md"
    # committed documents name no folder of this machine: model paths start at $GGSPEC_HOME
    sed -i "s|${GGSPEC_HOME:-$HOME/.cache/ggspec}|\$GGSPEC_HOME|g" "$OUT/$name.json"
    cat "$OUT/$name.md"
}
