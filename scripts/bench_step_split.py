"""Per-step time split (draft / verify / inject / Python overhead) on a tiny built-in pair.

    python scripts/bench_step_split.py [--kind dense|hybrid] [-n 128] [--forced]

Runs the same prompts with plain greedy and with DFlash speculation (optionally with forced
acceptance lengths cycling 0..n_max, since random-weight drafts are never accepted) and prints
the split and the decode speed ratio from this one run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import PROMPTS  # noqa: E402

from ggspec.fixtures.tiny import ensure_tiny_pair  # noqa: E402
from ggspec.native.paths import fixtures_dir  # noqa: E402
from ggspec.runtime import ContextParams  # noqa: E402
from ggspec.spec.forced import ForcedAcceptance, cycle_lengths  # noqa: E402
from ggspec.spec.loop import generate_greedy, generate_spec  # noqa: E402
from ggspec.spec.pair import PairConfig, SpecPair  # noqa: E402
from ggspec.spec.stats import RunStats  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="dense")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--forced", action="store_true")
    ap.add_argument("-fa", default="auto", choices=["auto", "on", "off"])
    args = ap.parse_args()
    pair = ensure_tiny_pair(fixtures_dir(), args.kind)
    cfg = PairConfig(target=pair.target, draft=pair.draft, n_max=7, ctx=ContextParams(n_ctx=1024, flash_attn=args.fa))
    plain, spec = RunStats(), RunStats()
    with SpecPair(cfg) as sp:
        for text in PROMPTS:
            prompt = sp.target_model.tokenize(text)
            sp.reset()
            ref = []
            for step in generate_greedy(sp.target, prompt, args.n, ignore_eos=True):
                plain.add(step)
                ref += step.tokens
            sp.reset()
            proposer = sp.proposer
            if args.forced:
                proposer = ForcedAcceptance(sp.proposer, np.concatenate([prompt, ref]),
                                            cycle_lengths(sp.n_max), sp.target_model.n_vocab)
            for step in generate_spec(sp.target, proposer, prompt, args.n, sp.n_max, ignore_eos=True):
                spec.add(step)
    ms = spec.per_step_ms()
    print(f"pair tiny-{args.kind}, {len(PROMPTS)} prompts x {args.n} tokens, n_max {cfg.n_max}, "
          f"{'forced acceptance 0..n_max' if args.forced else 'real DFlash draft'}")
    print(f"plain greedy : {plain.decode_tps:8.1f} t/s")
    print(f"speculative  : {spec.decode_tps:8.1f} t/s  ratio {spec.decode_tps / plain.decode_tps:.2f}  "
          f"tau {spec.tau:.2f} (pooled)  steps {spec.spec_steps}")
    print("per step (ms): " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items())
          + f"  total {sum(ms.values()):.3f}")
    print("shares       : " + "  ".join(f"{k} {100 * v:.1f}%" for k, v in spec.time_shares().items()))


if __name__ == "__main__":
    main()
