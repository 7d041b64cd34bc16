#!/usr/bin/env python3
"""What a verify of n rows costs against a one-token decode, per model: the number that decides
whether speculation can pay on a machine (break-even τ >= this ratio at n = n_max + 1).

For each model: a 64-token context is decoded once, then, interleaved over repetitions (this
machine drifts 20-50 % from minute to minute), one-token decodes and n-row batches with logits on
every row (what a verify asks for), each removed again with seq_rm so every call sees the same
context (a hybrid target's recurrent state is saved after the prefix and loaded back, untimed).
Reports the median time of each and the ratio to n = 1, as a markdown table and JSON.

    python scripts/verify_cost.py --pair dummy-qwen3-0.6b --pair dummy-qwen3-1.7b -t 2 -o docs/scale/verify-cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.runtime.batch import Batch
from ggspec.runtime.context import Context
from ggspec.runtime.model import Model

ROWS = (1, 2, 4, 8, 16)
CONTEXT = 64


def measure(path: Path, threads: int, reps: int, sizes: tuple[int, ...] = ROWS) -> dict[int, float]:
    """Median seconds of an n-row decode (all rows' logits) after a CONTEXT-token prefix."""
    model = Model(path)
    ctx = Context(model, ContextParams(n_ctx=1024, n_threads=threads))
    batch = Batch(ctx)
    rng = np.random.default_rng(0)
    prefix = [int(t) for t in rng.integers(0, 256, CONTEXT)]  # byte tokens: in every vocabulary here
    ctx.decode(batch.clear().add_tokens(prefix, 0))
    # restored after every timed call (untimed): a recurrent state cannot simply be cut back
    saved = ctx.save_sequence(0) if model.is_recurrent else None
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(reps + 1):
        for n in (sizes if rep % 2 == 0 else reversed(sizes)):
            rows = [int(t) for t in rng.integers(0, 256, n)]
            batch.clear().add_tokens(rows, CONTEXT, outputs="all")
            t0 = time.perf_counter()
            ctx.decode(batch)
            ctx.logits()  # the rows a verify reads
            dt = time.perf_counter() - t0
            if saved is None:
                ctx.remove(CONTEXT)
            else:
                ctx.drop_sequence(0)
                ctx.load_sequence(saved, 0)
            if rep:  # the first round warms the graphs up
                times[n].append(dt)
    batch.close()
    ctx.close()
    model.close()
    return {n: statistics.median(ts) for n, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", action="append", required=True, help="a pair of models.toml (its target is timed)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=9)
    ap.add_argument("-o", "--output", type=Path, help="save the JSON here (markdown goes to stdout)")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)),
                    help="row counts to time, 1 first (a token tree's verify: its budget + 1)")
    args = ap.parse_args()
    sizes = tuple(int(n) for n in args.rows.split(","))
    results = []
    for name in args.pair:
        target = resolve(get_entry(name)).target
        med = measure(target, args.threads, args.reps, sizes)
        results.append({"pair": name, "target": target.name, "ms": {n: round(1e3 * s, 3) for n, s in med.items()},
                        "ratio": {n: round(med[n] / med[1], 3) for n in sizes}})
    doc = {"what": "n-row decode (logits on every row) vs a one-token decode, median of interleaved repetitions",
           "command": "python scripts/verify_cost.py " + " ".join(f"--pair {p}" for p in args.pair)
                      + f" -t {args.threads} -r {args.reps}",
           "machine": f"{platform.machine()} {platform.processor() or ''} {len(__import__('os').sched_getaffinity(0))} "
                      "cores".strip(),
           "context_tokens": CONTEXT, "threads": args.threads, "results": results}
    print("| pair | 1 row ms | " + " | ".join(f"{n} rows ×" for n in sizes[1:]) + " |")
    print("|---|---|" + "---|" * (len(sizes) - 1))
    for r in results:
        print(f"| {r['pair']} | {r['ms'][1]:.1f} | " + " | ".join(f"{r['ratio'][n]:.2f}" for n in sizes[1:]) + " |")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
