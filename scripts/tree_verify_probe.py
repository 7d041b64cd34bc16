#!/usr/bin/env python3
"""Can llama.cpp verify a token tree in one decode with its own sequence machinery, and what does
it cost? A probe for issue 40's choice of mechanism, on the real build.

    python scripts/tree_verify_probe.py --pair tiny-coder --budget 32

Each leaf of a DDTree becomes a sequence id; the prefix's cells are shared into every one of them
(llama_memory_seq_cp on a unified cache: the cells gain sequence ids, nothing is copied); the
verify batch holds the root (the last committed token) and every node, each row tagged with the
sequences of every branch through it, at position prefix + depth. llama.cpp's mask takes a row's
first sequence id and lets it see the cells holding that id at earlier positions, which are exactly
the row's ancestors. The probe checks every node's logits against a chain decode of its own path
(argmax equal, largest difference), then times the tree decode against a chain decode of as many
rows, interleaved, and the sharing and clearing of the branch sequences around it.
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
from ggspec.runtime import Batch, Context, ContextParams, Model
from ggspec.speculative.tree import branch_sequences, ddtree, top_k

PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"


def probe_tree(model: Model, threads: int, k: int, budget: int):
    """The prompt's tokens, a reference context that decoded them all (its batch) and a DDTree from
    the target's own distributions at the prompt's last 8 rows (any tree would do for the checks)."""
    ids = model.tokenize(PROMPT).tolist()
    ref = Context(model, ContextParams(n_ctx=1024, n_threads=threads))
    batch = Batch(ref)
    ref.decode(batch.clear().add_tokens(ids, 0, outputs="all"))
    cols, lp = top_k(ref.logits()[-8:], k)
    return ids, ref, batch, ddtree(cols, lp, budget)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-coder")
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-r", "--reps", type=int, default=9)
    args = ap.parse_args()
    target = resolve(get_entry(args.pair)).target
    model = Model(target)
    lc = model.lc
    ids, ref, batch, tree = probe_tree(model, args.threads, args.top_k, args.budget)
    prefix, root = ids[:-1], ids[-1]
    pos = len(prefix)
    rows = ref.logits()[-8:]
    branches, n_leaves = branch_sequences(tree, first=1)

    ctx = Context(model, ContextParams(n_ctx=1024, n_threads=args.threads, n_seq_max=1 + n_leaves, kv_unified=True))
    mem = lc.llama_get_memory(ctx.ptr)
    b0 = Batch(ctx)
    ctx.decode(b0.clear().add_tokens(prefix, 0, outputs="last"))

    def share() -> None:
        for s in range(1, 1 + n_leaves):
            lc.llama_memory_seq_cp(mem, 0, s, 0, pos)

    def clear() -> None:
        for s in range(1, 1 + n_leaves):
            lc.llama_memory_seq_rm(mem, s, 0, -1)

    tb = Batch(ctx)
    tb.add_shared(root, pos, branches[0])
    for i in range(len(tree)):
        tb.add_shared(int(tree.tokens[i]), pos + int(tree.depths[i]), branches[i + 1])
    share()
    ctx.decode(tb)
    tree_logits = ctx.logits()
    clear()

    # each node's row against a chain decode of its path (on the reference context, the prompt's cells kept)
    worst, same = 0.0, 0
    for i in range(len(tree)):
        path = tree.path(i)
        ref.remove(len(ids))
        ref.decode(batch.clear().add_tokens(path, len(ids), outputs="last"))
        want = ref.logits()[-1]
        got = tree_logits[1 + i]
        worst = max(worst, float(np.abs(want - got).max()))
        same += int(want.argmax() == got.argmax())
    ref.remove(len(ids))
    root_ok = int(np.argmax(tree_logits[0]) == np.argmax(rows[-1]))
    print(f"tree: {len(tree)} nodes ({n_leaves} leaves, depth {int(tree.depths.max())}), top-{args.top_k}, "
          f"{1 + len(tree)} rows")
    print(f"nodes whose argmax equals their path's chain decode: {same}/{len(tree)} (root {root_ok}/1); "
          f"largest logit difference {worst:.2e}")

    chain_tokens = [root] + [int(t) for t in np.resize(tree.tokens, len(tree))]
    t_tree, t_chain, t_share = [], [], []
    for rep in range(args.reps + 1):
        for kind in (("tree", "chain") if rep % 2 == 0 else ("chain", "tree")):
            if kind == "tree":
                t0 = time.perf_counter()
                share()
                t1 = time.perf_counter()
                ctx.decode(tb)
                ctx.logits_view()
                t2 = time.perf_counter()
                clear()
                t3 = time.perf_counter()
                if rep:
                    t_tree.append(t2 - t1)
                    t_share.append((t1 - t0) + (t3 - t2))
            else:
                t0 = time.perf_counter()
                ctx.decode(b0.clear().add_tokens(chain_tokens, pos, outputs="all"))
                ctx.logits_view()
                if rep:
                    t_chain.append(time.perf_counter() - t0)
                ctx.remove(pos)
    med = statistics.median
    print(f"decode of {1 + len(tree)} rows: tree {1e3 * med(t_tree):.2f} ms, chain {1e3 * med(t_chain):.2f} ms "
          f"(x{med(t_tree) / med(t_chain):.2f}); sharing + clearing {n_leaves} branch sequences "
          f"{1e3 * med(t_share):.3f} ms")
    tb.close()
    b0.close()
    batch.close()
    ctx.close()
    ref.close()
    model.close()


if __name__ == "__main__":
    main()
