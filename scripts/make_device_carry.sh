#!/usr/bin/env bash
# Recreate .device-carry/ (ignored through .git/info/exclude): what scripts/device_check.sh needs on
# a GPU machine without network access:
#   llama_cpp_python-0.3.36.tar.gz  the pinned sdist, trimmed to ~12 MB (no llama.cpp models, docs,
#                                   media, benches, gguf-py, .github, nor the sdist's .git: none is
#                                   built or read by ggspec)
#   gguf-0.19.0-py3-none-any.whl    ggspec's one dependency the GPU image lacks
#
# usage: scripts/make_device_carry.sh   (from the repository root)
#   SDIST=path    the full pinned sdist (default: $GGSPEC_SDIST, else the ggspec cache's)
#   GGUF_WHEEL=path  a local gguf wheel (default: fetched once with `pip download`)
set -euo pipefail

root=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
cd "$root"
carry=.device-carry
stem=llama_cpp_python-0.3.36
home=${GGSPEC_HOME:-$HOME/.cache/ggspec}
sdist=${SDIST:-${GGSPEC_SDIST:-$home/sdist/$stem.tar.gz}}
[ -f "$sdist" ] || { echo "no sdist at $sdist: run \`ggspec build\` once, or set SDIST" >&2; exit 1; }

rm -rf "$carry"
mkdir -p "$carry"

# the trimmed sdist: the same tree ggspec extracts, minus what it never builds or reads
python3 - "$sdist" "$carry/$stem.tar.gz" "$stem" <<'EOF'
import sys, tarfile
src, dst, stem = sys.argv[1:]
drop = [f"{stem}/.git"] + [f"{stem}/vendor/llama.cpp/{d}" for d in
                           ("models", "docs", "media", "benches", "gguf-py", ".github")]
def kept(name):
    return not any(name == d or name.startswith(d + "/") for d in drop)
with tarfile.open(src) as tin, tarfile.open(dst, "w:gz", compresslevel=9) as tout:
    for m in tin:
        if kept(m.name):
            tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
EOF

# the gguf wheel: a local copy, else pip's ordinary download (pure Python, any platform)
if [ -n "${GGUF_WHEEL:-}" ]; then
    cp "$GGUF_WHEEL" "$carry/"
else
    python3 -m pip download --quiet --no-deps --only-binary :all: gguf==0.19.0 -d "$carry"
fi

# keep both folders out of git (the device copy carries only what git does not ignore, plus carry=)
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
mkdir -p "$(dirname "$exclude")"
for line in /.device-carry/ /.device/; do
    grep -qxF "$line" "$exclude" 2>/dev/null || echo "$line" >> "$exclude"
done
ls -l "$carry"
