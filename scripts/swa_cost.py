#!/usr/bin/env python3
"""What a full-size cache for sliding-window layers costs a decode deep into a context.

    python scripts/swa_cost.py --pair gemma-3-270m --depths 512,2048,4096 --reps 3

ggspec's contexts keep every position's cells on Gemma's sliding-window layers (the C API's
default, llama-server's `--swa-full`); llama-server's default is a window-sized cache. For each
depth, a context of each kind decodes a prompt of that many tokens, then times one-token decodes
after it (ms per token), the two kinds interleaved in every repetition; the ratio is full /
window-sized (above 1: the full cache is slower).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.runtime import Batch, Context, ContextParams
from ggspec.runtime.model import Model


def decode_ms(model: Model, swa_full: bool, depth: int, n: int, threads: int, fa: str) -> float:
    params = ContextParams(n_ctx=depth + n + 256, n_batch=512, n_ubatch=512, n_threads=threads, flash_attn=fa,
                           swa_full=swa_full)
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 20000, depth + n).astype(np.int32)
    with Context(model, params) as ctx:
        batch = Batch(ctx)
        for off in range(0, depth, 512):
            part = prompt[off:min(depth, off + 512)]
            ctx.decode(batch.clear().add_tokens(part, off, 0, outputs="last"))
        t0 = time.perf_counter()
        for i in range(n):
            ctx.decode(batch.clear().add_tokens(prompt[depth + i:depth + i + 1], depth + i, 0, outputs="last"))
        batch.close()
        return (time.perf_counter() - t0) * 1e3 / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="gemma-3-270m")
    ap.add_argument("--depths", default="512,2048,4096")
    ap.add_argument("--tokens", type=int, default=32, help="one-token decodes timed at each depth")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-fa", "--flash-attn", dest="fa", default="off")
    args = ap.parse_args()
    with Model(resolve(get_entry(args.pair)).target) as model:
        for depth in (int(d) for d in args.depths.split(",")):
            runs = {True: [], False: []}
            for rep in range(args.reps):
                for full in (True, False) if rep % 2 == 0 else (False, True):
                    runs[full].append(decode_ms(model, full, depth, args.tokens, args.threads, args.fa))
            ratios = [a / b for a, b in zip(runs[True], runs[False])]
            print(f"depth {depth}: full {statistics.median(runs[True]):.2f} ms/token, window-sized "
                  f"{statistics.median(runs[False]):.2f} ms/token, full / window {statistics.median(ratios):.2f} "
                  f"(runs {', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
