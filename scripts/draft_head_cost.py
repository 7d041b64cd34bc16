"""What a reduced draft vocabulary saves per draft call (patch 0014, `--spec-draft-vocab N`).

One draft model, one context per head size (the full head, then N rows for each N given); each
context decodes the same prompt, then one-row draft calls (decode + the argmax over the row the
proposer reads), interleaved across the contexts in rounds so drift on a noisy machine hits them
alike. Prints the median milliseconds per call and the ratio to the full head.

    python scripts/draft_head_cost.py DRAFT.gguf [--vocab 32768 16384] [--rounds 7] [--calls 16] [-t 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ggspec.runtime import Batch, Context, ContextParams, Model
from ggspec.speculative.types.draft_vocab import draft_vocab_ids

PROMPT = "def quicksort(items):\n    if len(items) <= 1:\n        return items\n    pivot = items[0]\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("draft")
    ap.add_argument("--vocab", type=int, nargs="+", default=[32768, 16384])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    with Model(a.draft) as model:
        params = ContextParams(n_ctx=1024, n_threads=a.threads)
        sizes = [0, *a.vocab]
        ctxs = []
        for n in sizes:
            ctx = Context(model, params)
            if n:  # each context keeps the rows it was given, whatever the model's set becomes
                model.set_draft_vocab(draft_vocab_ids(model, n))
                ctx.set_head_rows(model)
            ctxs.append(ctx)
        prompt = model.tokenize(PROMPT)
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for r in range(a.rounds):
            for n, ctx in zip(sizes, ctxs):
                ctx.clear()
                with Batch(ctx) as batch:
                    batch.add_tokens(prompt, 0, 0, outputs="last")
                    ctx.decode(batch)
                    token, pos = int(ctx.argmax_rows()[0]), len(prompt)
                    t0 = time.perf_counter()
                    for i in range(a.calls):
                        batch.clear()
                        batch.add_tokens([token], pos + i, 0, outputs="all")
                        ctx.decode(batch)
                        token = int(ctx.argmax_rows()[0])
                    if r:  # the first round builds graphs
                        times[n].append((time.perf_counter() - t0) / a.calls)
        full = statistics.median(times[0])
        print(f"{model.path.name}: n_vocab {model.n_vocab}, {a.threads} threads, {a.rounds - 1} rounds of {a.calls} calls")
        for n in sizes:
            ms = statistics.median(times[n]) * 1e3
            label = f"{ctxs[sizes.index(n)].n_logits} rows"
            print(f"  {label:>12}: {ms:7.2f} ms a draft call  ({ms / (full * 1e3):.2f}x the full head's)")
        for ctx in ctxs:
            ctx.close()


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
