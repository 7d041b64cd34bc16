#!/usr/bin/env bash
# The GPU check of issue 17, prepared for a machine with an NVIDIA GPU (H200-class, 16 cores, a
# complete system CUDA toolkit, cmake, python3 >= 3.11 with numpy/typer/rich/pytest/scipy, no
# network, maybe no git). Run from anywhere in the repository:
#
#   scripts/device_check.sh [RESULTS_DIR]      (default: $OUT, else .device/out)
#
# It needs .device-carry/ (scripts/make_device_carry.sh: the trimmed pinned sdist and the gguf
# wheel), builds the CUDA library into .device/home (ggspec's cache for this machine), then runs
#   1. the `gpu`-marked tests (CUDA gated delta-net op == CPU op for every plane count and lead;
#      greedy speculative == plain greedy with the target on the GPU, dense and hybrid; the lead
#      layout's delta-net placed on the GPU),
#   2. the capped-planes table at scale (issue 26): a real-shape dummy hybrid target (Qwen3.5-4B's shape,
#      F16, written by ggspec on this machine while the library compiles) with its DFlash draft,
#      planes x lead under the DFlash acceptance profile, on the GPU, ggspec next to llama.cpp's
#      own loop of the same build (--native, -ngl all for both),
#   2b. the batch-variance probe (scripts/batch_variance.py) on the GPU: how a row differs alone vs batched,
#   3. `ggspec bench`: planes x lead on the tiny hybrid pair with the same profile, on the GPU
#      (-ngl -1) and, as time allows, on the CPU (-ngl 0),
# logging each stage and its wall time into RESULTS_DIR (summary.txt first). Every stage has a
# timeout: the script ends within DEVICE_BUDGET_S seconds (default 450) whatever happens.
#
# The build has llama.cpp's tools (DEVICE_TOOLS=0: library only, no --native rows) and leaves out the flash-attention kernels (`--no-cuda-fa`: GGML_CUDA_FA=OFF, part of the
# build key; ~a third of a full CUDA build's ~6,200 core-seconds); DEVICE_FA=on builds them. Other knobs: DEVICE_ARCH
# (default 90), DEVICE_BENCH_N (tokens per bench run, 64), DEVICE_SCALE_PAIR (dummy-qwen3.5-4b@f16;
# "" skips stage 2), DEVICE_GIT_SHIM=1 (use the git stand-in
# even where git exists), DEVICE_BUILD_ARGS="" (a CPU build: try the script on a machine without GPU).
set -uo pipefail

T0=$(date +%s)
BUDGET=${DEVICE_BUDGET_S:-480}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
RESULTS=${1:-${OUT:-$ROOT/.device/out}}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
SUMMARY=$RESULTS/summary.txt
CARRY=$ROOT/.device-carry
WORK=${TMPDIR:-/tmp}/ggspec-device
: > "$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

# stage NAME MAX_SECONDS COMMAND...: COMMAND's output into NAME.log, its time and status into the
# summary; the limit is MAX_SECONDS or what is left of the budget (minus RESERVE), the smaller
RESERVE=0
stage() {
    local name=$1 max=$2; shift 2
    local avail=$(( $(left) - RESERVE ))
    local limit=$(( max < avail ? max : avail ))
    if (( limit < 10 )); then
        say "$(printf '%-16s skipped: %ss left of the budget' "$name" "$(left)")"
        return 125
    fi
    local start; start=$(now)
    if [ "$(type -t "$1")" = function ]; then  # timeout runs programs: a function goes through bash
        timeout -k 10 "$limit" bash -c "$(declare -f "$1")"'; "$@"' _ "$@" > "$RESULTS/$name.log" 2>&1
    else
        timeout -k 10 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
    fi
    local rc=$?
    local verdict=ok
    (( rc == 124 || rc == 137 )) && verdict="TIMED OUT"
    (( rc != 0 && rc != 124 && rc != 137 )) && verdict=FAILED
    say "$(printf '%-16s %-9s rc=%-3s %7ss (limit %ss)' "$name" "$verdict" "$rc" "$(since "$start")" "$limit")"
    return $rc
}

# --- set-up: carried files, the gguf wheel, a git stand-in ------------------------------------------

setup_python_path() {
    local site=$WORK/site
    rm -rf "$site" && mkdir -p "$site"
    local wheel; wheel=$(ls "$CARRY"/gguf-*.whl 2>/dev/null | head -1)
    [ -n "$wheel" ] || { echo "no gguf wheel in $CARRY (scripts/make_device_carry.sh)"; return 1; }
    if ! python3 -m pip install --quiet --no-index --no-deps --target "$site" "$wheel"; then
        echo "pip failed: unpacking the (pure Python) wheel instead"
        python3 -m zipfile -e "$wheel" "$site" || return 1
    fi
    # gguf imports yaml at the top of gguf/metadata.py; ggspec never reads model cards
    if ! python3 -c "import yaml" 2>/dev/null; then
        echo "no pyyaml: a stand-in yaml module (gguf only imports it here)"
        printf 'def safe_load(*a, **k):\n    raise ImportError("pyyaml is not installed")\n' > "$site/yaml.py"
    fi
    export PYTHONPATH=$site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
    python3 -c "import gguf, numpy, typer, rich, pytest; print('python deps ok: gguf', gguf.__file__)"
}

setup_git() {
    if command -v git > /dev/null && [ -z "${DEVICE_GIT_SHIM:-}" ]; then
        echo "git: $(command -v git)"
        return 0
    fi
    mkdir -p "$WORK/bin"
    printf '#!/bin/sh\nexec python3 "%s/scripts/git_apply_shim.py" "$@"\n' "$ROOT" > "$WORK/bin/git"
    chmod +x "$WORK/bin/git"
    export PATH=$WORK/bin:$PATH
    echo "no git: the apply-only stand-in $WORK/bin/git"
}

# The CUDA image sets CC/CXX/CUDAHOSTCXX to /opt/gcc, whose g++ links libstdc++ statically into
# shared libraries: libggml-cuda then exports its own copy of the C++ runtime, libllama's calls
# bind to it, and loading a model crashes in llama_model::print_info (seen on the H200,
# 2026-11-30). The distribution's gcc links libstdc++ dynamically.
use_system_compilers() {
    if [ -x /usr/bin/g++ ] && [ -x /usr/bin/gcc ]; then
        export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
    fi
    echo "compilers: CC=${CC:-cc} CXX=${CXX:-c++} CUDAHOSTCXX=${CUDAHOSTCXX:-}"
}

setup() {
    mkdir -p "$WORK"
    use_system_compilers
    export GGSPEC_HOME=$ROOT/.device/home
    export GGSPEC_SDIST=$CARRY/llama_cpp_python-0.3.36.tar.gz
    mkdir -p "$GGSPEC_HOME"
    [ -f "$GGSPEC_SDIST" ] || { echo "no sdist at $GGSPEC_SDIST (scripts/make_device_carry.sh)"; return 1; }
    setup_python_path || return 1
    setup_git
}

machine_info() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1 | head -5
    echo "cores: $(nproc)"; python3 --version
    nvcc --version 2>&1 | tail -2; cmake --version | head -1
    command -v ninja patch git ccache | sed 's/^/found: /'
}

# --- the stages ------------------------------------------------------------------------------------

build_cuda() {
    local fa=--no-cuda-fa tools=--tools
    [ "${DEVICE_FA:-off}" = on ] && fa=--cuda-fa
    [ "${DEVICE_TOOLS:-1}" = 0 ] && tools=
    # DEVICE_BUILD_ARGS="" builds the CPU library: the rest of the script can be tried without a GPU
    # shellcheck disable=SC2086
    python3 -m ggspec build $tools ${DEVICE_BUILD_ARGS---cuda --cuda-arch ${DEVICE_ARCH:-90} $fa}
}

# the dummy model needs no build (F16 is written by numpy): it is made while the library compiles
export SCALE_PAIR=${DEVICE_SCALE_PAIR-dummy-qwen3.5-4b@f16}
make_scale() {
    python3 -m ggspec models make "$SCALE_PAIR"
}

# the capped-planes table at scale, on the GPU, with llama.cpp's loop of the same build beside ggspec's
bench_scale() {
    local native=--native
    [ "${DEVICE_TOOLS:-1}" = 0 ] && native=
    python3 -m ggspec bench --pair "$SCALE_PAIR" --prompts "$PROMPTS_FILE" -n "${DEVICE_BENCH_N:-64}" -r 1 \
        --matrix --spec-draft-n-max 7 --spec-draft-rs-planes 3,4,5,uncapped --spec-draft-rs-planes-lead 0,default \
        --acceptance-profile dflash -ngl "${1:--1}" -t 4 $native --save "$RESULTS/bench-scale.json" --no-plot
}

export PROMPTS_FILE=$RESULTS/bench-prompts.jsonl RESULTS
write_prompts() {
    cat > "$PROMPTS_FILE" <<'EOF'
{"prompt": "def fibonacci(n):", "category": "code-gen"}
{"prompt": "class Stack:\n    def __init__(self):\n        self.items = []\n", "category": "code-gen"}
{"prompt": "The quick brown fox", "category": "prose"}
EOF
}

# planes x lead on the tiny hybrid pair, acceptance replayed from a real DFlash pair's histogram
bench_matrix() {
    local ngl=$1 tag=$2
    python3 -m ggspec bench --pair tiny-hybrid --prompts "$PROMPTS_FILE" -n "${DEVICE_BENCH_N:-64}" -r 2 \
        --matrix --spec-draft-rs-planes 3,4,5,uncapped --spec-draft-rs-planes-lead 0,default \
        --acceptance-profile dflash -ngl "$ngl" --save "$RESULTS/bench-$tag.json" --no-plot
}

copy_build_record() {
    local key; key=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['key'])" "$GGSPEC_HOME/current.json" 2>/dev/null)
    [ -n "$key" ] || return 0
    cp "$GGSPEC_HOME/builds/$key/build.json" "$RESULTS/build.json" 2>/dev/null
    cp "$GGSPEC_HOME/builds/$key/build/compile.log" "$RESULTS/compile.log" 2>/dev/null
    say "build record: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['key'], d['seconds'], 's', d['options'])" "$RESULTS/build.json" 2>/dev/null)"
}

main() {
    say "device check $(date -u +%FT%TZ) in $ROOT, budget ${BUDGET}s, results in $RESULTS"
    stage machine 20 machine_info
    setup > "$RESULTS/setup.log" 2>&1 || { say "set-up FAILED: $(tail -1 "$RESULTS/setup.log")"; return 1; }
    say "set-up ok ($(since "$T0.0")s since start)"

    local make_pid=
    if [ -n "$SCALE_PAIR" ]; then  # numpy on a few cores while nvcc has the rest
        ( start=$(now); timeout -k 10 "$(( $(left) - 120 ))" bash -c "$(declare -f make_scale)"'; make_scale' \
              > "$RESULTS/make-scale.log" 2>&1; rc=$?
          echo "$(printf '%-16s rc=%-3s %7ss (in the background, during the build)' make-scale "$rc" "$(since "$start")")" \
              >> "$SUMMARY" ) &
        make_pid=$!
    fi
    RESERVE=60  # the build may take everything but a minute: nothing else runs without it
    stage build-cuda 400 build_cuda
    local build_rc=$?
    RESERVE=0
    copy_build_record
    if (( build_rc != 0 )); then
        say "no CUDA build: $(tr '\r' '\n' < "$RESULTS/build-cuda.log" | grep -v '^[[:space:]]*$' | tail -1)"
        return 1
    fi

    stage pytest-gpu 150 python3 -m pytest -m gpu -v -rA -p no:cacheprovider --continue-on-collection-errors \
        --junitxml="$RESULTS/pytest-gpu.xml" tests
    say "  $(tail -1 "$RESULTS/pytest-gpu.log")"
    # batch variance on the device (issue 55): a token alone vs as row i of k-row batches, CUDA has
    # no invariant path yet (mmvq's bands): the table says where and how much
    stage invariance-gpu 40 python3 scripts/batch_variance.py -m models/tiny/tiny-coder.gguf -ngl -1 \
        --invariant on --fa on --repack on --fills 3,40 --rows 2,4,8,16 -o "$RESULTS/batch-variance.json"
    write_prompts
    if [ -n "$make_pid" ]; then
        wait "$make_pid"
        grep -q "^make-scale *rc=0 " "$SUMMARY" && stage bench-scale 150 bench_scale -1
    fi
    stage bench-gpu 90 bench_matrix -1 gpu
    # token trees on the device: tokens per call and speed per budget against the chain (issue 40)
    stage trees-gpu 60 python3 scripts/tree_acceptance.py --pair tiny-coder --budgets 0,16,32,64,auto --reps 2 \
        -n 64 -ngl -1
    stage bench-cpu 60 bench_matrix 0 cpu
    say "done in $(since "$T0.0")s"
}

# sourced (to try a stage by hand), it only defines the functions
[[ "${BASH_SOURCE[0]}" == "$0" ]] && main
