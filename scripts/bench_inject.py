"""DFlash feature injection modes at fixed acceptance levels: pruned deferral vs seed 004's
deferral vs upstream's immediate injection, in ggspec's loop.

    python scripts/bench_inject.py [--pair tiny-coder] [-r 5] [-n 128] [--prompts 4]

BENCHMARK DEVICE: each step runs the real DFlash draft and then proposes the target's own
greedy continuation corrupted so that exactly round(level x n_max) drafts are accepted
(ggspec.spec.forced). Modes are interleaved per repetition; the table gives the median decode
t/s over repetitions and the ratio of each mode to immediate injection, from this one run.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import PROMPTS  # noqa: E402

from ggspec.pairs import get_entry, resolve  # noqa: E402
from ggspec.runtime import ContextParams  # noqa: E402
from ggspec.spec.dflash import INJECT_MODES  # noqa: E402
from ggspec.spec.forced import ForcedAcceptance  # noqa: E402
from ggspec.spec.loop import generate_greedy, generate_spec  # noqa: E402
from ggspec.spec.pair import PairConfig, SpecPair  # noqa: E402
from ggspec.spec.stats import RunStats  # noqa: E402

LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-coder")
    ap.add_argument("-r", type=int, default=5, help="repetitions")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4)
    args = ap.parse_args()
    files = resolve(get_entry(args.pair))
    n_max = 7
    pairs: dict[str, SpecPair] = {}
    for mode in INJECT_MODES:  # all modes on the same loaded weights
        cfg = PairConfig(target=files.target, draft=files.draft, n_max=n_max, ctx=ContextParams(n_ctx=1024),
                         inject=mode)
        pairs[mode] = SpecPair(cfg, share_models=pairs.get(INJECT_MODES[0]))
    base = pairs[INJECT_MODES[0]]
    texts = PROMPTS[:args.prompts]
    refs = []
    for text in texts:
        prompt = base.target_model.tokenize(text)
        base.reset()
        plain = [t for s in generate_greedy(base.target, prompt, args.n, ignore_eos=True) for t in s.tokens]
        refs.append((prompt, np.concatenate([prompt, plain])))

    tps = {(level, mode): [] for level in LEVELS for mode in INJECT_MODES}
    for _ in range(args.r):
        for level in LEVELS:
            accept = round(level * n_max)
            for mode, sp in pairs.items():
                stats = RunStats()
                for prompt, reference in refs:
                    sp.reset()
                    forced = ForcedAcceptance(sp.proposer, reference, itertools.repeat(accept), sp.target_model.n_vocab)
                    for step in generate_spec(sp.target, forced, prompt, args.n, n_max, ignore_eos=True):
                        stats.add(step)
                tps[(level, mode)].append(stats.decode_tps)
    print(f"pair {args.pair}, n_max {n_max}, {len(texts)} prompts x {args.n} tokens, {args.r} repetitions "
          f"(median decode t/s), one thread\n")
    print("| accepted | " + " | ".join(INJECT_MODES) + " | pruned / immediate | deferred / immediate |")
    print("|---|" + "---|" * (len(INJECT_MODES) + 2))
    for level in LEVELS:
        med = {m: statistics.median(tps[(level, m)]) for m in INJECT_MODES}
        print(f"| {100 * level:.0f} % | " + " | ".join(f"{med[m]:.0f}" for m in INJECT_MODES)
              + f" | {med['pruned'] / med['immediate']:.3f} | {med['deferred'] / med['immediate']:.3f} |")
    for sp in reversed(pairs.values()):
        sp.close()


if __name__ == "__main__":
    main()
