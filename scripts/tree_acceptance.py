#!/usr/bin/env python3
"""Tokens per target call of DDTree token trees against the DFlash chain, on any machine.

    python scripts/tree_acceptance.py --pair tiny-coder                 # budgets 8, 16, 32, 64
    python scripts/tree_acceptance.py -m target.gguf -md dflash.gguf --budgets 16,32 -n 256

For every built-in bench prompt, greedy: the chain (the engine as it runs) and, per budget, the
engine made to commit a DDTree's accepted path at every step (ggspec.bench.trees.TreeCommit): the
tokens committed per target call, the accepted drafts per step, what the chain alone would have
accepted at the same steps, the tree's nodes, and whether every output equals plain greedy. The
trees' verify cost (budget + 1 rows) is not measured here: the tree verify does not exist yet.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from ggspec.bench.prompts import BUILTIN
from ggspec.bench.trees import TreeCommit
from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.loop import decode_one
from ggspec.speculative.models import Models, PairConfig


def measure(models: Models, cfg: PairConfig, prompts, n: int, budget: int | None, k: int) -> dict:
    """The prompts decoded greedily with the chain (budget None) or a tree's commits."""
    wrap = None if budget is None else (lambda p: TreeCommit(p, budget, k, models.target.n_vocab))
    with Engine(models, cfg, wrap_proposer=wrap) as engine:
        steps = committed = 0
        same = True
        tree = engine.proposer if budget is not None else None
        for ids, reference in prompts:
            if tree is not None:
                tree.reference = lambda _seq, r=reference: r
            seq = decode_one(engine, ids, n, ignore_eos=True)
            same &= seq.tokens == list(reference[len(ids):len(ids) + n])
            steps += seq.stats.spec_steps  # the target calls that verified a draft
            committed += seq.stats.committed_spec
        row = {"steps": steps, "per_call": committed / steps, "same": same}
        if tree is not None:
            c = tree.counts
            row.update(accepted=c.accepted / c.steps, chain=c.chain_accepted / c.steps, nodes=c.nodes / c.steps)
        return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None)
    ap.add_argument("-m", "--model", type=Path)
    ap.add_argument("-md", "--model-draft", type=Path)
    ap.add_argument("--budgets", default="8,16,32,64")
    ap.add_argument("--top-k", type=int, default=8, help="candidates per block position")
    ap.add_argument("-n", type=int, default=128, help="tokens per prompt")
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args()
    if args.pair:
        files = resolve(get_entry(args.pair))
        target, draft = files.target, files.draft
    else:
        target, draft = args.model, args.model_draft
    cfg = PairConfig(target, draft, spec_type="draft-dflash", calibrate=False,
                     ctx=ContextParams(n_ctx=4096, n_threads=args.threads))
    console = Console()
    with Models(cfg) as models:
        cfg.n_max = models.plan.max_draft  # the whole block: what a tree is grown from
        with Engine(models, cfg, plain=True) as plain:
            prompts = []
            for p in BUILTIN:
                ids = plain.target_model.tokenize(p.text)
                out = decode_one(plain, ids, args.n + cfg.n_max + 1, speculate=False, ignore_eos=True)
                prompts.append((ids, [*ids.tolist(), *out.tokens]))
        table = Table(title=f"{Path(target).stem} + {Path(draft).stem}: DFlash n_max {cfg.n_max}, top-{args.top_k} "
                            f"per position, {len(prompts)} prompts x {args.n} tokens, greedy")
        for col in ("drafts", "tokens per target call", "accepted per step", "chain at the same steps",
                    "nodes", "steps", "= plain"):
            table.add_column(col, justify="right")
        chain = measure(models, cfg, prompts, args.n, None, args.top_k)
        table.add_row("chain", f"{chain['per_call']:.2f}", f"{chain['per_call'] - 1:.2f}", "", str(cfg.n_max),
                      str(chain["steps"]), "yes" if chain["same"] else "NO")
        for budget in (int(b) for b in args.budgets.split(",")):
            r = measure(models, cfg, prompts, args.n, budget, args.top_k)
            table.add_row(f"tree {budget}", f"{r['per_call']:.2f}", f"{r['accepted']:.2f}", f"{r['chain']:.2f}",
                          f"{r['nodes']:.1f}", str(r["steps"]), "yes" if r["same"] else "NO")
        console.print(table)


if __name__ == "__main__":
    main()
