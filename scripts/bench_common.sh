# Sourced by the table scripts (scale_tables.sh, mtp_tables.sh): OUT, THREADS, N and REPS are theirs.

bench() {  # bench NAME ARGS...: one saved benchmark, its markdown next to it
    local name=$1; shift
    echo "== $name: ggspec bench $*" >&2
    ggspec bench "$@" -t "$THREADS" -n "$N" -r "$REPS" --save "$OUT/$name.json" > "$OUT/$name.md"
    # committed documents name no folder of this machine: model paths start at $GGSPEC_HOME
    sed -i "s|${GGSPEC_HOME:-$HOME/.cache/ggspec}|\$GGSPEC_HOME|g" "$OUT/$name.json"
    cat "$OUT/$name.md"
}
