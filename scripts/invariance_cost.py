#!/usr/bin/env python3
"""What the CPU backend's batch invariance (patch 0021) costs: decode, prefill and verify, with it
on and off in one process, interleaved (this machine drifts 20-50 % from minute to minute).

For each model and setting (attention, repack): a one-token decode after a 64-token context, an
n-row decode with logits on every row (a verify of n - 1 drafts) and a prefill of P tokens (no
logits but the last), each removed again with seq_rm; the invariance switched on and off between
the repetitions in alternating order. Prints the medians and the on/off ratio as markdown; -o
saves the JSON.

    python scripts/invariance_cost.py --pair qwen2.5-coder-1.5b -t 2 --fa on --fa off
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from ggspec.bench.invariance import model_arguments, model_paths
from ggspec.native.bindings import batch_invariant, set_batch_invariant
from ggspec.runtime import ContextParams
from ggspec.runtime.batch import Batch
from ggspec.runtime.context import Context
from ggspec.runtime.model import Model

CONTEXT = 64


def measure(path: Path, fa: str, repack: bool, threads: int, reps: int, rows: tuple[int, ...],
            prefill: int) -> dict[str, dict[str, float]]:
    """Median seconds of each operation, by invariance ("on"/"off")."""
    model = Model(path, repack=repack)
    ctx = Context(model, ContextParams(n_ctx=2048, n_threads=threads, flash_attn=fa))
    batch = Batch(ctx)
    rng = np.random.default_rng(0)
    vocab = model.n_vocab
    tokens = lambda n: [int(t) for t in rng.integers(1000, vocab - 1, n)]  # noqa: E731
    ops = {"decode": 1, **{f"verify{n}": n for n in rows}}
    times: dict[str, dict[str, list[float]]] = {inv: {op: [] for op in [*ops, "prefill"]} for inv in ("on", "off")}
    prefix = tokens(CONTEXT)
    for rep in range(reps + 1):
        for inv in (("on", "off") if rep % 2 else ("off", "on")):
            set_batch_invariant(inv == "on")
            ctx.drop_sequence(0)
            ctx.decode(batch.clear().add_tokens(prefix, 0, outputs="none"))
            for op, n in ops.items():
                batch.clear().add_tokens(tokens(n), CONTEXT, outputs="all")
                t0 = time.perf_counter()
                ctx.decode(batch)
                ctx.logits()
                dt = time.perf_counter() - t0
                ctx.remove(CONTEXT)
                if rep:  # the first round warms the graphs up
                    times[inv][op].append(dt)
            ctx.drop_sequence(0)
            batch.clear().add_tokens(tokens(prefill), 0)
            t0 = time.perf_counter()
            ctx.decode(batch)
            dt = time.perf_counter() - t0
            if rep:
                times[inv]["prefill"].append(dt)
    batch.close()
    ctx.close()
    model.close()
    return {inv: {op: statistics.median(ts) for op, ts in by_op.items()} for inv, by_op in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap, "timed", "on")
    ap.add_argument("--rows", default="4,8,16", help="verify rows to time")
    ap.add_argument("--prefill", type=int, default=512, help="prompt tokens of the timed prefill")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=7)
    ap.add_argument("-o", "--output", type=Path, help="save the JSON here")
    args = ap.parse_args()
    paths = model_paths(ap, args)
    rows = tuple(int(n) for n in args.rows.split(","))
    initial = batch_invariant()
    results = []
    ops = ["decode", *[f"verify{n}" for n in rows], "prefill"]
    print("| model | fa | repack | " + " | ".join(f"{op} ms off → on (×)" for op in ops) + " |")
    print("|---|---|---|" + "---|" * len(ops))
    try:
        for path in paths:
            for fa in args.fa or ("on",):
                for repack in args.repack or ("on",):
                    med = measure(path, fa, repack == "on", args.threads, args.reps, rows, args.prefill)
                    results.append({"model": path.name, "fa": fa, "repack": repack,
                                    "ms": {inv: {op: round(1e3 * s, 3) for op, s in m.items()} for inv, m in med.items()}})
                    cells = [f"{1e3 * med['off'][op]:.1f} → {1e3 * med['on'][op]:.1f} ({med['on'][op] / med['off'][op]:.2f})"
                             for op in ops]
                    print(f"| {path.name} | {fa} | {repack} | " + " | ".join(cells) + " |", flush=True)
    finally:
        set_batch_invariant(initial > 0, initial or None)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({
            "what": "median ms with the CPU backend's batch invariance off and on, interleaved in one process",
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "threads": args.threads,
            "reps": args.reps, "prefill_tokens": args.prefill, "context_tokens": CONTEXT, "results": results},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
