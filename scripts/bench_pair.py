"""Measure a pair on held-out prompts: τ, acceptance histogram, per-step time split, speedup.

    python scripts/bench_pair.py [--pair tiny-coder] [-n 128] [--prompts 20] [--forced]

Prompts are cut from the stdlib files the tiny pair never saw in training (every 16th file).
Each prompt runs plain greedy and then speculative (alternating, so machine drift hits both);
speed is reported as the ratio of pooled decode t/s from this one run. With --forced, the
draft's tokens are replaced by the target's own continuation corrupted at a cycling position
(acceptance lengths 0..n_max), which shows the loop's cost structure on any pair.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tinypair.corpus import heldout_prompts  # noqa: E402

from ggspec.pairs import get_entry, resolve  # noqa: E402
from ggspec.runtime import ContextParams  # noqa: E402
from ggspec.spec.forced import ForcedAcceptance, cycle_lengths  # noqa: E402
from ggspec.spec.oracle import run_prompts  # noqa: E402
from ggspec.spec.pair import PairConfig, SpecPair  # noqa: E402
from ggspec.spec.stats import merge  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-coder")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--n-max", type=int, default=None)
    ap.add_argument("--forced", action="store_true")
    ap.add_argument("-ctk", default="f16")
    ap.add_argument("-ctv", default="f16")
    ap.add_argument("-fa", default="auto", choices=["auto", "on", "off"])
    args = ap.parse_args()

    entry = get_entry(args.pair)
    files = resolve(entry)
    n_max = args.n_max or entry.settings.get("n_max", 7)
    ctx = ContextParams(n_ctx=1024, type_k=args.ctk, type_v=args.ctv, flash_attn=args.fa)
    prompts = heldout_prompts(args.prompts)
    with SpecPair(PairConfig(target=files.target, draft=files.draft, n_max=n_max, ctx=ctx)) as sp:
        make = None
        if args.forced:
            def make(prompt, plain):
                return ForcedAcceptance(sp.proposer, np.concatenate([prompt, plain]), cycle_lengths(sp.n_max),
                                        sp.target_model.n_vocab)
        runs = list(run_prompts(sp, prompts, args.n, make))
    plain, spec = merge(r.plain_stats for r in runs), merge(r.spec_stats for r in runs)
    exact = sum(r.divergence is None for r in runs)
    print(f"pair {args.pair}, {len(prompts)} held-out prompts x {args.n} tokens, n_max {sp.n_max}, "
          f"-ctk {args.ctk} -ctv {args.ctv} -fa {args.fa}"
          + (", forced acceptance 0..n_max" if args.forced else ", real DFlash draft"))
    print(f"plain greedy : {plain.decode_tps:8.1f} t/s")
    print(f"speculative  : {spec.decode_tps:8.1f} t/s   speedup {spec.decode_tps / plain.decode_tps:.2f}x")
    print(f"tau (pooled) : {spec.tau:.2f}   acceptance {100 * spec.acceptance_rate:.1f}%   steps {spec.spec_steps}")
    print("histogram    : " + " ".join(f"{i}:{c}" for i, c in enumerate(spec.accept_hist)))
    ms = spec.per_step_ms()
    print("per step ms  : " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items()) + f"  total {sum(ms.values()):.3f}")
    print("time shares  : " + "  ".join(f"{k} {100 * v:.1f}%" for k, v in spec.time_shares().items()))
    print(f"lossless     : {exact}/{len(runs)} prompts identical")
    for i, r in enumerate(runs):
        if r.divergence is not None:
            print(f"  prompt {i}: {r.divergence.describe()}")


if __name__ == "__main__":
    main()
