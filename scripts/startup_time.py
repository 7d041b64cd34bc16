"""Start-up overhead of `ggspec run` beyond llama.cpp's own model load, on a real model.

    python scripts/startup_time.py [-m MODEL.gguf | --pair gemma-3-270m] [-r 5] [--gguf-py]

Each repetition times, in fresh processes, back to back:
- `ggspec run -m MODEL --no-spec -n 1` end to end (interpreter start included);
- a bare ctypes program doing only what llama.cpp must do for the same run: load the bindings and
  the library, load the model, create the context, decode the prompt and one token.
The difference is what ggspec adds (imports, metadata checks, CLI). Medians are reported; on 2
cores run it on a quiet machine. `--gguf-py` also times gguf-py's GGUFReader on the file (what
ggspec used before its own header walk) once.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

BARE = r"""
import ctypes, sys, time
t0 = time.perf_counter()
from ggspec.native.bindings import load
lc = load()
mp = lc.llama_model_default_params()
model = lc.llama_model_load_from_file(sys.argv[1].encode(), mp)
cp = lc.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 4096, 512, 512, 1, 1
ctx = lc.llama_init_from_model(model, cp)
vocab = lc.llama_model_get_vocab(model)
buf = (ctypes.c_int32 * 64)()
n = lc.llama_tokenize(vocab, b"Hello", 5, buf, 64, True, False)
lc.llama_decode(ctx, lc.llama_batch_get_one(buf, n))
tok = (ctypes.c_int32 * 1)(1)
lc.llama_decode(ctx, lc.llama_batch_get_one(tok, 1))
lc.llama_free(ctx)
lc.llama_model_free(model)
"""


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])}… failed: {proc.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path)
    ap.add_argument("--pair", default="gemma-3-270m")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--gguf-py", action="store_true", help="also time gguf-py's GGUFReader once")
    args = ap.parse_args()
    model = args.model
    if model is None:
        from ggspec.catalogue.pairs import get_entry, resolve

        model = resolve(get_entry(args.pair)).target
    ggspec_cmd = [sys.executable, "-m", "ggspec.cli", "run", "-m", str(model), "--no-spec", "-n", "1", "-p", "Hello"]
    bare_cmd = [sys.executable, "-c", BARE, str(model)]
    timed(bare_cmd)  # warm the page cache
    full, bare = [], []
    for _ in range(args.repetitions):
        full.append(timed(ggspec_cmd))
        bare.append(timed(bare_cmd))
    f, b = statistics.median(full), statistics.median(bare)
    print(f"model: {model.name}")
    print(f"ggspec run --no-spec -n 1: {f:.2f} s (median of {args.repetitions}; range {min(full):.2f}-{max(full):.2f})")
    print(f"bare llama.cpp via ctypes:  {b:.2f} s (range {min(bare):.2f}-{max(bare):.2f})")
    print(f"ggspec's overhead:          {f - b:+.2f} s")
    if args.gguf_py:
        from gguf import GGUFReader

        t0 = time.perf_counter()
        GGUFReader(model, "r")
        print(f"gguf-py GGUFReader (the previous metadata read, done twice per run): {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
