"""The prepared-plan pool (patch 0012) before and after, in both loops, interleaved.

For each draft length: ggspec's engine without the pool and with it, and llama.cpp's
llama-speculative-simple without LLAMA_SCHED_POOL and with it, one prompt after the other for
each of the four (so the machine's drift hits all alike); greedy, the bench prompts. Prints a
markdown table: t/s, the ratio pool ÷ no pool, and each context's graph reuse (reused ÷ calls for
ggspec; llama.cpp prints only the reuse count, so its rate is over ggspec's call count of the
same row and is marked ~).

    python scripts/plan_pool_table.py --pair tiny-coder --n-max 3,7 [--pool 8] [-n 64] [-r 2] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

from ggspec.bench.native import TOOL, find_tool, run_cpp
from ggspec.bench.prompts import load_prompts
from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.driver import generate_spec
from ggspec.speculative.models import PairConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="tiny-coder")
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--n-max", default="3,7")
    ap.add_argument("--pool", type=int, default=8)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("-t", type=int, default=1)
    ap.add_argument("--spec-type", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    files = resolve(get_entry(args.pair), args.models_dir)
    ctx = ContextParams(n_ctx=2048, n_threads=args.t, flash_attn="off")
    prompts = [p.text for p in load_prompts(None)]
    tool = find_tool(TOOL)
    spec_type = args.spec_type or "draft-dflash"
    rows = []
    for n_max in (int(x) for x in args.n_max.split(",")):
        base = PairConfig(target=files.target, draft=files.draft, n_max=n_max, ctx=ctx, spec_type=args.spec_type)
        engines = {pool: Engine.open(replace(base, plan_pool=pool)) for pool in (0, args.pool)}
        t = {k: 0.0 for k in ("g0", "gP", "c0", "cP")}
        tok = dict.fromkeys(t, 0)
        cpp_reused = {"c0": [0, 0], "cP": [0, 0]}
        for _ in range(args.r):
            for text in prompts:
                for pool, key in ((0, "g0"), (args.pool, "gP")):
                    eng = engines[pool]
                    prompt = eng.target_model.tokenize(text)
                    steps = list(generate_spec(eng, prompt, args.n, ignore_eos=True))
                    t[key] += sum(s.t_total for s in steps[1:])
                    tok[key] += sum(len(s.tokens) for s in steps[1:])
                for pool, key in ((0, "c0"), (args.pool, "cP")):
                    if pool:
                        os.environ["LLAMA_SCHED_POOL"] = str(pool)
                    else:
                        os.environ.pop("LLAMA_SCHED_POOL", None)
                    res = run_cpp(tool, files.target, files.draft, text, args.n, n_max, defer=False,
                                  spec_type=spec_type, threads=args.t, n_ctx=2048)
                    t[key] += res.seconds
                    tok[key] += res.n_decoded
                    for i, r in enumerate(res.graphs_reused[:2]):
                        cpp_reused[key][i] += r
        os.environ.pop("LLAMA_SCHED_POOL", None)
        row = {"n_max": n_max, "pool": args.pool}
        for key in t:
            row[f"tps_{key}"] = round(tok[key] / t[key], 1) if t[key] else None
        for pool, key in ((0, "g0"), (args.pool, "gP")):
            eng = engines[pool]
            for name, c in (("target", eng.target), ("draft", eng.draft_ctx)):
                if c is not None:
                    reused, hits, built = c.plan_stats()
                    row[f"{key}_{name}_reuse"] = round(reused / max(1, c.n_decodes), 3)
                    row[f"{key}_{name}_calls"] = c.n_decodes
            eng.close()
        for key in ("c0", "cP"):
            row[f"{key}_reused"] = cpp_reused[key]
        rows.append(row)
    print("| n_max | ggspec t/s (no pool → pool) | × | llama.cpp t/s (no pool → pool) | × | ggspec target / draft reuse (no pool → pool) | llama.cpp target / draft graphs reused (no pool → pool) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        g, c = (r["tps_g0"], r["tps_gP"]), (r["tps_c0"], r["tps_cP"])
        reuse = (f"{r['g0_target_reuse']:.0%} / {r.get('g0_draft_reuse', 0):.0%} → "
                 f"{r['gP_target_reuse']:.0%} / {r.get('gP_draft_reuse', 0):.0%}")
        cr = f"{r['c0_reused'][0]} / {r['c0_reused'][1]} → {r['cP_reused'][0]} / {r['cP_reused'][1]}"
        print(f"| {r['n_max']} | {g[0]} → {g[1]} | {g[1] / g[0]:.2f} | {c[0]} → {c[1]} | {c[1] / c[0]:.2f} | {reuse} | {cr} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"pair": args.pair, "n": args.n, "reps": args.r, "threads": args.t, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
