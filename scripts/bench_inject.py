"""DFlash feature injection modes at fixed acceptance levels: pruned deferral vs seed 004's
deferral vs upstream's immediate injection, in ggspec's loop and (--native) in llama.cpp's.

    python scripts/bench_inject.py [--pair tiny-coder] [-r 5] [-n 128] [--prompts 4] [--native]

BENCHMARK DEVICE: each step runs the real DFlash draft and then proposes the target's own
greedy continuation corrupted so that exactly round(level x n_max) drafts are accepted
(ggspec.spec.forced). With --native the same is done inside llama-speculative-simple from the
same patched build (patch 0005, GGSPEC_BENCH_FORCED) with upstream's immediate injection and
with patch 0003's deferral; it needs `ggspec build --tools`.

Every configuration runs each prompt once per repetition, interleaved in a random order (a fixed
cycle would always put the same configuration right after a C++ process, on cold caches). Ratios
are per repetition (all prompts pooled), then the median over repetitions with the range in
brackets. Every run's text is checked against plain greedy decoding.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tinypair.corpus import heldout_prompts  # noqa: E402

from ggspec.bench.native import CppResult, find_tool, run_cpp  # noqa: E402
from ggspec.pairs import get_entry, resolve  # noqa: E402
from ggspec.runtime import ContextParams  # noqa: E402
from ggspec.spec.dflash import INJECT_MODES  # noqa: E402
from ggspec.spec.forced import ForcedAcceptance  # noqa: E402
from ggspec.spec.loop import generate_greedy, generate_spec  # noqa: E402
from ggspec.spec.pair import PairConfig, SpecPair  # noqa: E402
from ggspec.spec.stats import RunStats  # noqa: E402

LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
N_MAX = 7
# (numerator, denominator) of the reported ratios
RATIOS = (("pruned", "immediate"), ("deferred", "immediate"), ("cpp-deferred", "cpp-immediate"))


def ratio_cell(num: list[float], den: list[float]) -> str:
    r = np.asarray(num) / np.asarray(den)
    return f"{np.median(r):.3f} ({r.min():.3f}..{r.max():.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-coder")
    ap.add_argument("-r", type=int, default=5, help="repetitions")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--native", action="store_true", help="add llama.cpp's C++ loop (needs `ggspec build --tools`)")
    args = ap.parse_args()
    files = resolve(get_entry(args.pair))
    tool = find_tool() if args.native else None
    ctx = ContextParams(n_ctx=2048, flash_attn="off")  # as the C++ tool runs (-fa off)
    pairs: dict[str, SpecPair] = {}
    for mode in INJECT_MODES:  # all modes on the same loaded weights
        cfg = PairConfig(target=files.target, draft=files.draft, n_max=N_MAX, ctx=ctx, inject=mode)
        pairs[mode] = SpecPair(cfg, share_models=pairs.get(INJECT_MODES[0]))
    base = pairs[INJECT_MODES[0]]
    texts = heldout_prompts(args.prompts)
    refs = []  # (prompt tokens, prompt + greedy continuation); the C++ tool may run n_max tokens past -n
    for text in texts:
        prompt = base.target_model.tokenize(text)
        base.reset()
        plain = [t for s in generate_greedy(base.target, prompt, args.n + N_MAX + 1, ignore_eos=True) for t in s.tokens]
        refs.append((prompt, np.concatenate([prompt, plain])))

    configs = list(INJECT_MODES) + (["cpp-immediate", "cpp-deferred"] if tool else [])
    tps: dict[tuple[float, str], list[float]] = {(lv, c): [] for lv in LEVELS for c in configs}
    mismatches = 0
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.r):
            for level in LEVELS:
                accept = round(level * N_MAX)
                stats = {c: RunStats() for c in INJECT_MODES}
                cpp = {c: CppResult() for c in configs if c.startswith("cpp")}
                for i, ((prompt, reference), text) in enumerate(zip(refs, texts)):
                    forced_file = Path(tmp) / f"forced-{i}.txt"
                    forced_file.write_text(" ".join(map(str, reference)) + f"\n{accept}\n")
                    for c in [configs[j] for j in rng.permutation(len(configs))]:  # none always follows a C++ process
                        if c.startswith("cpp"):
                            res = run_cpp(tool, files.target, files.draft, text, args.n, N_MAX,
                                          defer=c == "cpp-deferred", forced=forced_file)
                            cpp[c].add(res)
                            want = text + base.target_model.detokenize(reference[len(prompt):])
                            m = min(len(res.text), len(want))  # the tool may stop a few tokens later
                            mismatches += int(res.text[:m] != want[:m])
                            continue
                        sp = pairs[c]
                        sp.reset()
                        forced = ForcedAcceptance(sp.proposer, reference, itertools.repeat(accept), sp.target_model.n_vocab)
                        got = []
                        for step in generate_spec(sp.target, forced, prompt, args.n, N_MAX, ignore_eos=True):
                            stats[c].add(step)
                            got += step.tokens
                        mismatches += int(not np.array_equal(got, reference[len(prompt):len(prompt) + args.n]))
                for c in INJECT_MODES:
                    tps[(level, c)].append(stats[c].decode_tps)
                for c, res in cpp.items():
                    tps[(level, c)].append(res.tps)

    print(f"pair {args.pair}, n_max {N_MAX}, {len(texts)} held-out prompts x {args.n} tokens, {args.r} repetitions, "
          "one thread, flash attention off\n")
    ratios = [(a, b) for a, b in RATIOS if a in configs]
    print("| accepted | " + " | ".join(f"{c} t/s" for c in configs) + " | "
          + " | ".join(f"{a} / {b}" for a, b in ratios) + " |")
    print("|---|" + "---|" * (len(configs) + len(ratios)))
    for level in LEVELS:
        cells = [f"{statistics.median(tps[(level, c)]):.0f}" for c in configs]
        cells += [ratio_cell(tps[(level, a)], tps[(level, b)]) for a, b in ratios]
        print(f"| {100 * level:.0f} % ({round(level * N_MAX)}/{N_MAX}) | " + " | ".join(cells) + " |")
    print(f"\noutputs equal to plain greedy: {'all' if not mismatches else f'NO ({mismatches} runs differ)'}")
    for sp in reversed(pairs.values()):
        sp.close()


if __name__ == "__main__":
    main()
