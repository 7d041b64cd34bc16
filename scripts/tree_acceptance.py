#!/usr/bin/env python3
"""Token trees against the DFlash chain: tokens per target call and speed, verified for real.

    python scripts/tree_acceptance.py --pair tiny-coder                 # budgets 0, 8, 16, 32, 64, auto
    python scripts/tree_acceptance.py -m target.gguf -md dflash.gguf --budgets 0,16,auto -n 256 --reps 5
    python scripts/tree_acceptance.py --pair qwen2.5-coder-1.5b --spec-type draft-simple -n 64 --prompts 4 \
        --budgets 8,16,32 --simulate-only --spec-draft-n-max 7

For every built-in bench prompt, greedy, at each `--spec-tree-budget` (0: the chain): the engine
verifying real trees (one target decode per step, tree_verify.py), interleaved repetitions of
the whole set. Reported per budget: committed tokens per target call, accepted drafts per step,
nodes verified per step, the steps that verified a tree, the decode speed (the median of the
repetitions' pooled t/s, and the median of the per-repetition ratios to the chain's), and whether
every output equals plain greedy. With `auto`, also what it chose. `--simulate` adds what
TreeCommit's simulation (bench/trees.py) says each budget accepts (`--simulate-only`: only that,
for machines where the tree's verify rows are too dear to run). `--spec-type`: draft-dflash (the
default; the draft length is the block's), draft-simple or draft-eagle3 (`--spec-draft-n-max`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from ggspec.bench.prompts import BUILTIN
from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.driver import decode_one, generate_greedy
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.lossless import compare
from ggspec.speculative.rules.tree_budget import parse_tree_budget


def run_once(models: Models, cfg: PairConfig, prompts, n: int) -> dict:
    """The prompts decoded greedily by one engine: totals, what an auto rule chose, and each
    output against plain greedy ("yes", or its first difference's kind by the target's margin)."""
    with Engine(models, cfg) as engine:
        steps = committed = nodes = trees = tokens = 0
        same, seconds = [], 0.0
        for ids, reference, margins in prompts:
            t0 = time.perf_counter()
            seq = decode_one(engine, ids, n, ignore_eos=True)
            seconds += time.perf_counter() - t0
            same.append(compare(list(reference[len(ids):len(ids) + n]), margins, seq.tokens))
            st = seq.stats
            steps += st.spec_steps
            committed += st.committed_spec
            nodes += st.nodes
            trees += st.tree_steps
            tokens += len(seq.tokens)
        rule = engine.tree_rule
        return {"steps": steps, "per_call": committed / max(steps, 1), "nodes": nodes / max(steps, 1),
                "trees": trees, "tps": tokens / seconds, "same": same,
                "chose": None if rule is None else rule.budget,
                "hopeless": None if rule is None else rule.hopeless(1),
                "scored": None if rule is None else dict(rule.stats.accepted)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None)
    ap.add_argument("-m", "--model", type=Path)
    ap.add_argument("-md", "--model-draft", type=Path)
    ap.add_argument("--budgets", default="0,8,16,32,64,auto")
    ap.add_argument("-n", type=int, default=128, help="tokens per prompt")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="target and draft layers on the GPU (-1: all)")
    ap.add_argument("--simulate", action="store_true", help="also TreeCommit's simulated acceptance per budget")
    ap.add_argument("--simulate-only", action="store_true", help="only the simulated acceptance (and the chain)")
    ap.add_argument("--spec-type", default="draft-dflash")
    ap.add_argument("--spec-draft-n-max", type=int, default=None, help="the draft length (DFlash: its block's)")
    ap.add_argument("--prompts", type=int, default=None, help="the first N built-in prompts only")
    args = ap.parse_args()
    if args.pair:
        files = resolve(get_entry(args.pair))
        target, draft = files.target, args.model_draft or files.draft  # (-md: another draft for the pair's target)
    else:
        target, draft = args.model, args.model_draft
    ctx = ContextParams(n_ctx=4096, n_threads=args.threads)
    gpu = {"n_gpu_layers": args.n_gpu_layers, "n_gpu_layers_draft": args.n_gpu_layers}
    base = PairConfig(target, draft, spec_type=args.spec_type, ctx=ctx, **gpu)
    budgets = [b.strip() for b in args.budgets.split(",")]
    console = Console()
    with Models(base) as models:
        # DFlash: the whole block (what a tree is grown from)
        base.n_max = args.spec_draft_n_max or models.plan.max_draft or 7
        with Engine(models, base, plain=True) as plain:
            prompts = []
            for p in BUILTIN[:args.prompts]:
                ids = plain.target_model.tokenize(p.text)
                steps = list(generate_greedy(plain, ids, args.n + base.n_max + 1, record_margins=True,
                                             ignore_eos=True))
                tokens = [t for st in steps for t in st.tokens]
                margins = [m for st in steps for m in st.margins]
                prompts.append((ids, [*ids.tolist(), *tokens], margins))
        configs = {}
        for b in budgets:
            budget, auto = parse_tree_budget(b)
            # a fixed draft length (the block), so every budget verifies the same chain; auto's costs
            # come from its own measurements of the steps
            configs[b] = PairConfig(target, draft, spec_type=args.spec_type, ctx=ctx, n_max=base.n_max,
                                    calibrate=False, tree_budget=budget, tree_auto=auto, **gpu)
        if args.simulate_only:
            chain = run_once(models, configs.get("0") or PairConfig(**{**configs[budgets[0]].__dict__, "tree_budget": 0,
                                                                       "tree_auto": False}), prompts, args.n)
            console.print(f"chain: {chain['per_call']:.2f} tokens per target call, outputs = plain: "
                          f"{_verdict([chain])}")
            simulate(models, base, prompts, args.n, [int(b) for b in budgets if b.isdigit() and int(b)], console)
            return
        runs: dict[str, list[dict]] = {b: [] for b in budgets}
        for _ in range(args.reps):  # interleaved: every budget once per repetition
            for b in budgets:
                runs[b].append(run_once(models, configs[b], prompts, args.n))
        table = Table(title=f"{Path(target).stem} + {Path(draft).stem}: {args.spec_type} n_max {base.n_max}, "
                            f"{len(prompts)} prompts x {args.n} tokens, greedy, {args.reps} interleaved reps, "
                            f"{args.threads} thread(s)")
        for col in ("budget", "tokens per target call", "nodes per step", "tree steps", "t/s (median)",
                    "vs chain (median ratio)", "= plain", "auto chose"):
            table.add_column(col, justify="right")
        chain = runs.get("0")
        for b in budgets:
            rs = runs[b]
            r = rs[-1]
            ratio = "" if chain is None else f"{statistics.median(x['tps'] / c['tps'] for x, c in zip(rs, chain)):.2f}"
            chose = "" if r["chose"] is None or not parse_tree_budget(b)[1] else \
                f"{r['chose']} (hopeless: {r['hopeless']})"
            table.add_row(b, f"{r['per_call']:.2f}", f"{r['nodes']:.1f}", f"{r['trees']}/{r['steps']}",
                          f"{statistics.median(x['tps'] for x in rs):.0f}", ratio, _verdict(rs), chose)
        console.print(table)
        for b in budgets:
            if runs[b][-1]["scored"]:
                scored = ", ".join(f"{k}: {v:.2f}" for k, v in sorted(runs[b][-1]["scored"].items()))
                console.print(f"{b}: mean accepted per budget from the trees it scored: {scored}")
        if args.simulate:
            simulate(models, base, prompts, args.n, [int(b) for b in budgets if b.isdigit() and int(b)], console)


def _verdict(runs: list[dict]) -> str:
    """Outputs against plain greedy over every run: yes, or the count of near-ties (a flip where the
    target's own top-2 margin is below the 0.2-nat gate: benign) and of REAL divergences."""
    found = [d for r in runs for d in r["same"] if d is not None]
    if not found:
        return "yes"
    ties = sum(d.benign for d in found)
    return ", ".join(part for part in (f"{ties} near-tie" if ties else "",
                                       f"{len(found) - ties} REAL" if len(found) > ties else "") if part)


def simulate(models: Models, cfg: PairConfig, prompts, n: int, budgets: list[int], console: Console) -> None:
    """TreeCommit's simulated tokens per target call at each budget (bench/trees.py)."""
    from ggspec.bench.trees import TreeCommit

    for budget in budgets:
        wrap = lambda p, b=budget: TreeCommit(p, b, 8, models.target.n_vocab)  # noqa: E731
        with Engine(models, PairConfig(**{**cfg.__dict__, "tree_budget": 0, "tree_auto": False, "calibrate": False}),
                    wrap_proposer=wrap) as engine:
            steps = committed = 0
            same = []
            for ids, reference, margins in prompts:
                engine.proposer.reference = lambda _seq, r=reference: r
                seq = decode_one(engine, ids, n, ignore_eos=True)
                same.append(compare(list(reference[len(ids):len(ids) + n]), margins, seq.tokens))
                steps += seq.stats.spec_steps
                committed += seq.stats.committed_spec
            c = engine.proposer.counts
            k = max(c.steps, 1)
            console.print(f"simulated tree {budget}: {committed / steps:.2f} tokens per target call; at the {c.steps} "
                          f"steps with a tree, {c.accepted / k:.2f} accepted (the chain alone {c.chain_accepted / k:.2f}), "
                          f"{c.nodes / k:.1f} nodes; outputs = plain: {_verdict([{'same': same}])}")


if __name__ == "__main__":
    main()
