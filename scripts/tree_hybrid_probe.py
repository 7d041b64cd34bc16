#!/usr/bin/env python3
"""What would a token tree cost on a hybrid target (recurrent layers) with llama.cpp's sequences?
A probe for issue 40's question 3, on the real build.

    python scripts/tree_hybrid_probe.py -m ~/.cache/ggspec/scale/qwen3.5-0.8b-s0-v2/q4_k_m.gguf --budget 16

The dense mechanism (tree_verify.py) tags each node's row with every branch through it. On a
hybrid target every branch is a recurrent sequence of its own: sharing the prefix into a branch
copies the sequence's recurrent state (llama_memory_seq_cp), and llama.cpp splits a batch for
recurrent memory into ubatches of non-overlapping sequence sets with as many tokens each, so rows
whose branch sets overlap (the root, a node and its children) cannot share a ubatch. The probe
times, interleaved: the tree's decode (B + 1 rows) after sharing the prefix into its branches,
against a chain decode of as many rows, and the state copies; and checks every node's argmax
against a decode of its own path.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggspec.runtime import Batch, Context, ContextParams, Model
from ggspec.speculative.tree import branch_sequences
from tree_verify_probe import probe_tree  # (this script's folder is on the path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=5)
    args = ap.parse_args()
    model = Model(args.model)
    lc = model.lc
    ids, ref, batch, tree = probe_tree(model, args.threads, args.top_k, args.budget)
    prefix, root = ids[:-1], ids[-1]
    pos = len(prefix)
    branches, n_leaves = branch_sequences(tree, first=1)
    spare = 1 + n_leaves  # a sequence id for the chain's timing
    ctx = Context(model, ContextParams(n_ctx=1024, n_threads=args.threads, n_seq_max=2 + n_leaves, kv_unified=True))
    mem = lc.llama_get_memory(ctx.ptr)
    b0 = Batch(ctx)
    ctx.decode(b0.clear().add_tokens(prefix, 0, outputs="last"))
    state = ctx.recurrent_state_bytes(0) if model.is_recurrent else 0

    def share(ids_: range) -> float:
        t0 = time.perf_counter()
        for s in ids_:
            lc.llama_memory_seq_cp(mem, 0, s, 0, pos)
        return time.perf_counter() - t0

    def clear(ids_: range) -> None:
        for s in ids_:
            lc.llama_memory_seq_rm(mem, s, -1, -1)

    tb = Batch(ctx)
    tb.add_shared(root, pos, branches[0])
    for i in range(len(tree)):
        tb.add_shared(int(tree.tokens[i]), pos + int(tree.depths[i]), branches[i + 1])
    share(range(1, 1 + n_leaves))
    ok = ctx.decode(tb) is None
    tree_logits = ctx.logits()
    clear(range(1, 1 + n_leaves))
    same = 0
    for i in range(len(tree)):
        path = tree.path(i)
        check = Context(model, ContextParams(n_ctx=1024, n_threads=args.threads))
        cb = Batch(check)
        check.decode(cb.add_tokens([*ids, *path], 0, outputs="last"))
        same += int(check.logits()[-1].argmax() == tree_logits[1 + i].argmax())
        cb.close()
        check.close()
    print(f"{args.model.name}: recurrent {model.is_recurrent}, one recurrent state {state / 2**20:.2f} MiB")
    print(f"tree: {len(tree)} nodes, {n_leaves} leaves, {1 + len(tree)} rows; decoded: {ok}; "
          f"nodes whose argmax equals their path's decode: {same}/{len(tree)}")
    chain_tokens = [root] + [int(t) for t in np.resize(tree.tokens, len(tree))]
    t_tree, t_chain, t_share = [], [], []
    for rep in range(args.reps + 1):
        for kind in (("tree", "chain") if rep % 2 == 0 else ("chain", "tree")):
            if kind == "tree":
                t_s = share(range(1, 1 + n_leaves))
                t0 = time.perf_counter()
                ctx.decode(tb)
                ctx.logits_view()
                t1 = time.perf_counter()
                clear(range(1, 1 + n_leaves))
                if rep:
                    t_tree.append(t1 - t0)
                    t_share.append(t_s)
            else:
                share(range(spare, spare + 1))
                t0 = time.perf_counter()
                ctx.decode(b0.clear().add_tokens(chain_tokens, pos, spare, outputs="all"))
                ctx.logits_view()
                if rep:
                    t_chain.append(time.perf_counter() - t0)
                clear(range(spare, spare + 1))
    med = statistics.median
    print(f"decode of {1 + len(tree)} rows: tree {1e3 * med(t_tree):.1f} ms, chain {1e3 * med(t_chain):.1f} ms "
          f"(x{med(t_tree) / med(t_chain):.2f}); sharing the prefix into {n_leaves} branches "
          f"{1e3 * med(t_share):.2f} ms ({n_leaves} x {state / 2**20:.2f} MiB of state copied)")
    for obj in (tb, b0, batch, ctx, ref):
        obj.close()
    model.close()


if __name__ == "__main__":
    main()
