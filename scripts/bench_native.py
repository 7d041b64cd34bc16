"""ggspec's Python loop against llama.cpp's own C++ DFlash loop, same build, same models, one run.

    ggspec build --tools && python scripts/bench_native.py [--pair tiny-coder] [-r 3] [-n 256]

Five configurations, in a random order per prompt and repetition so drift hits all alike:
  (1) cpp-immediate  llama-speculative-simple --spec-type draft-dflash (upstream injection)
  (2) cpp-deferred   the same with patch 0003's deferral on (LLAMA_ARG_SPEC_DFLASH_DEFER=1)
  (3) ggspec-immediate, (4) ggspec-pruned (the default), (5) plain greedy (ggspec --no-spec)
Reports median decode t/s as ratios to (1), and checks that all five produce the same text.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tinypair.corpus import heldout_prompts  # noqa: E402

from ggspec.bench.native import find_tool, run_cpp  # noqa: E402
from ggspec.pairs import get_entry, resolve  # noqa: E402
from ggspec.runtime import ContextParams  # noqa: E402
from ggspec.spec.loop import generate_greedy, generate_spec  # noqa: E402
from ggspec.spec.pair import PairConfig, SpecPair  # noqa: E402
from ggspec.spec.stats import RunStats  # noqa: E402

CONFIGS = ("cpp-immediate", "cpp-deferred", "ggspec-immediate", "ggspec-pruned", "plain")


def run_native(tool: Path, files, prompt: str, n: int, n_max: int, defer: bool) -> tuple[str, float]:
    res = run_cpp(tool, files.target, files.draft, prompt, n, n_max, defer=defer)
    return res.text, res.tps


def run_ggspec(sp: SpecPair, prompt: str, n: int, speculative: bool) -> tuple[str, float]:
    tokens = sp.target_model.tokenize(prompt)
    sp.reset()
    stats, out = RunStats(), []
    steps = (generate_spec(sp.target, sp.proposer, tokens, n + 1, sp.n_max, ignore_eos=True) if speculative
             else generate_greedy(sp.target, tokens, n + 1, ignore_eos=True))
    for step in steps:
        stats.add(step)
        out += step.tokens
    return prompt + sp.target_model.detokenize(out), stats.decode_tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-coder")
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=4)
    args = ap.parse_args()
    tool = find_tool()
    files = resolve(get_entry(args.pair))
    n_max = 7
    ctx = ContextParams(n_ctx=2048, flash_attn="off")
    pairs = {}
    for mode in ("immediate", "pruned"):
        cfg = PairConfig(target=files.target, draft=files.draft, n_max=n_max, ctx=ctx, inject=mode)
        pairs[mode] = SpecPair(cfg, share_models=pairs.get("immediate"))
    prompts = heldout_prompts(args.prompts)
    speeds = {c: [] for c in CONFIGS}
    texts: dict[tuple[int, str], str] = {}
    rng = np.random.default_rng(0)
    for _ in range(args.r):
        for i, prompt in enumerate(prompts):
            runs = {
                "cpp-immediate": lambda: run_native(tool, files, prompt, args.n, n_max, defer=False),
                "cpp-deferred": lambda: run_native(tool, files, prompt, args.n, n_max, defer=True),
                "ggspec-immediate": lambda: run_ggspec(pairs["immediate"], prompt, args.n, True),
                "ggspec-pruned": lambda: run_ggspec(pairs["pruned"], prompt, args.n, True),
                "plain": lambda: run_ggspec(pairs["pruned"], prompt, args.n, False),
            }
            for name in [CONFIGS[j] for j in rng.permutation(len(CONFIGS))]:  # none always follows a C++ process
                text, tps = runs[name]()
                speeds[name].append(tps)
                texts[(i, name)] = text
    # llama-speculative-simple stops after the step that crosses -n, so it may print up to n_max
    # tokens more: compare every output on the length of the shortest one
    def agree(i: int) -> bool:
        outs = [texts[(i, c)] for c in CONFIGS]
        n = min(len(o) for o in outs)
        return len({o[:n] for o in outs}) == 1

    same = all(agree(i) for i in range(len(prompts)))
    for i in range(len(prompts)):
        if not agree(i):
            outs = {c: texts[(i, c)] for c in CONFIGS}
            n = min(len(o) for o in outs.values())
            first = min(k for k in range(n) if len({o[k] for o in outs.values()}) > 1)
            print(f"prompt {i}: outputs differ from character {first}: "
                  + "; ".join(f"{c}: {o[first:first + 20]!r}" for c, o in outs.items()))
    base = statistics.median(speeds["cpp-immediate"])
    print(f"pair {args.pair}, {len(prompts)} held-out prompts x {args.n} tokens, n_max {n_max}, {args.r} repetitions, "
          f"one thread, flash attention off; median decode t/s\n")
    print("| configuration | decode t/s | ratio to (1) |")
    print("|---|---|---|")
    for k, name in enumerate(CONFIGS, 1):
        med = statistics.median(speeds[name])
        print(f"| ({k}) {name} | {med:.0f} | {med / base:.2f} |")
    print(f"\nsame text in all five (on the common length): {'yes' if same else 'NO'}")
    for sp in reversed(pairs.values()):
        sp.close()


if __name__ == "__main__":
    main()
