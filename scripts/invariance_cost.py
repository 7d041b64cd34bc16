#!/usr/bin/env python3
"""What the CPU backend's batch invariance (patches 0021, 0022) costs: decode, prompt chunks,
verifies and several sequences' rows in one batch, with it on and off in one process, interleaved
(this machine drifts 20-50 % from minute to minute).

For each model and setting (attention, repack), after a cached context of --context tokens: a
one-token decode; a verify of n rows (logits on every row) for each --rows; a prompt chunk of n rows
(logits on its last row) for each --chunks; --seqs sequences of 4 rows each in one batch (each
sequence after its own copy of the context, logits on every row). Each is removed again with
seq_rm; the invariance is switched on (every row count) and off between the repetitions in
alternating order. Prints the medians and the on/off ratio as markdown; -o saves the JSON.

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

SEQ_ROWS = 4  # rows per sequence in the several-sequences batch


def _operations(rows: tuple[int, ...], chunks: tuple[int, ...], seqs: int) -> dict[str, tuple[str, int]]:
    """Each timed operation: (kind, rows)."""
    ops = {"decode": ("verify", 1)}
    ops.update({f"verify{n}": ("verify", n) for n in rows})
    ops.update({f"chunk{n}": ("chunk", n) for n in chunks})
    if seqs > 1:
        ops[f"seqs{seqs}x{SEQ_ROWS}"] = ("seqs", seqs)
    return ops


def measure(path: Path, fa: str, repack: bool, threads: int, reps: int, ops: dict[str, tuple[str, int]],
            context: int) -> dict[str, dict[str, float]]:
    """Median seconds of each operation, by invariance ("on"/"off")."""
    seqs = max([n for kind, n in ops.values() if kind == "seqs"] + [1])
    longest = max(n for _kind, n in ops.values())
    model = Model(path, repack=repack)
    ctx = Context(model, ContextParams(n_ctx=seqs * (context + longest + 8), n_threads=threads, flash_attn=fa,
                                       n_seq_max=seqs, n_batch=max(512, context, longest, seqs * SEQ_ROWS),
                                       n_ubatch=max(512, context, longest, seqs * SEQ_ROWS)))
    batch = Batch(ctx)
    rng = np.random.default_rng(0)
    vocab = model.n_vocab
    tokens = lambda n: [int(t) for t in rng.integers(1000, vocab - 1, n)]  # noqa: E731
    times: dict[str, dict[str, list[float]]] = {inv: {op: [] for op in ops} for inv in ("on", "off")}
    prefix = tokens(context)
    for rep in range(reps + 1):
        for inv in (("on", "off") if rep % 2 else ("off", "on")):
            set_batch_invariant(inv == "on", 1 << 62)
            for seq in range(seqs):
                ctx.drop_sequence(seq)
                ctx.decode(batch.clear().add_tokens(prefix, 0, seq_id=seq, outputs="none"))
            for op, (kind, n) in ops.items():
                batch.clear()
                if kind == "seqs":
                    for seq in range(n):
                        batch.add_tokens(tokens(SEQ_ROWS), context, seq_id=seq, outputs="all")
                else:
                    batch.add_tokens(tokens(n), context, outputs="all" if kind == "verify" else "last")
                t0 = time.perf_counter()
                ctx.decode(batch)
                ctx.logits()
                dt = time.perf_counter() - t0
                for seq in range(seqs):
                    ctx.remove(context, seq)
                if rep:  # the first round warms the graphs up
                    times[inv][op].append(dt)
    batch.close()
    ctx.close()
    model.close()
    return {inv: {op: statistics.median(ts) for op, ts in by_op.items()} for inv, by_op in times.items()}


def _counts(ap, flag: str, text: str) -> tuple[int, ...]:
    """A comma list of row counts, or the parser's one-line error."""
    try:
        counts = tuple(int(n) for n in text.split(",") if n)
    except ValueError:
        ap.error(f"{flag} {text!r}: a comma list of row counts, e.g. 2,4,8")
    if any(n < 1 for n in counts):
        ap.error(f"{flag} {text!r}: row counts are at least 1")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap, "timed", "on")
    ap.add_argument("--rows", default="2,4,8,16,32", help="verify rows to time")
    ap.add_argument("--chunks", default="32,64,128,512,2048", help="prompt chunk rows to time")
    ap.add_argument("--seqs", type=int, default=4, help=f"sequences of {SEQ_ROWS} rows in one batch (1: none)")
    ap.add_argument("--context", type=int, default=64, help="cached tokens before each operation")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("-o", "--output", type=Path, help="save the JSON here")
    args = ap.parse_args()
    paths = model_paths(ap, args)
    if args.seqs < 1 or args.context < 1 or args.reps < 1 or args.threads < 1:
        ap.error("--seqs, --context, -r and -t take a positive count")
    ops = _operations(_counts(ap, "--rows", args.rows), _counts(ap, "--chunks", args.chunks), args.seqs)
    initial = batch_invariant()
    results = []
    print("| model | fa | repack | " + " | ".join(f"{op} ms off → on (×)" for op in ops) + " |")
    print("|---|---|---|" + "---|" * len(ops))
    try:
        for path in paths:
            for fa in args.fa or ("on",):
                for repack in args.repack or ("on",):
                    med = measure(path, fa, repack == "on", args.threads, args.reps, ops, args.context)
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
            "what": "median ms with the CPU backend's batch invariance off and on (every row count), "
                    "interleaved in one process",
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "threads": args.threads,
            "reps": args.reps, "context_tokens": args.context, "seq_rows": SEQ_ROWS,
            "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
