"""Capped recurrent planes on the tiny hybrid target: seed 000's table, measured in one run.

    python scripts/bench_planes.py [--profile dflash|mtp|uniform|all] [-n 128] [--prompts 8] [-r 3]

BENCHMARK DEVICE: random-weight drafts are never accepted, so this replays an acceptance
histogram instead. Each step runs the real DFlash draft, then proposes the target's own greedy
continuation corrupted at a position drawn from the profile (ggspec.spec.forced). Every
configuration sees the same sequence of accepted counts; configurations are interleaved per
prompt so machine drift hits all alike. Speeds are ratios against the uncapped run: the median
over repetitions (each one pass over the prompts) with the min..max range. A second, identical
uncapped row ("control") shows the noise floor of those ratios on this machine.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import PROMPTS  # noqa: E402

from ggspec.pairs import get_entry, resolve  # noqa: E402
from ggspec.runtime import ContextParams  # noqa: E402
from ggspec.spec.forced import PROFILES, ForcedAcceptance, profile_lengths  # noqa: E402
from ggspec.spec.loop import generate_greedy, generate_spec  # noqa: E402
from ggspec.spec.pair import PairConfig, SpecPair  # noqa: E402
from ggspec.spec.planes import PlaneOptions  # noqa: E402
from ggspec.spec.stats import RunStats  # noqa: E402

CONTROL = (None, "control")  # the uncapped configuration again: its ratio to uncapped is pure noise
CONFIGS = [(None, "default"), CONTROL] + [(p, lead) for p in (3, 4, 5) for lead in (0, "default", "auto")]
LAYOUT_NAMES = {0: "old (lead 0)", "default": "lead default", "auto": "lead auto"}


@dataclass
class Row:
    sp: SpecPair
    stats: RunStats = field(default_factory=RunStats)  # all repetitions
    rep_tps: list = field(default_factory=list)  # decode t/s of each repetition
    outputs: list = field(default_factory=list)


def ratio_cell(num: "Row", den: "Row") -> str:
    """Median of the per-repetition decode t/s ratios, with their range."""
    r = np.asarray(num.rep_tps) / np.asarray(den.rep_tps)
    return f"{np.median(r):.3f}" + (f" ({r.min():.3f}..{r.max():.3f})" if len(r) > 1 else "")


def run_profile(profile: str, pair, n_predict: int, n_prompts: int, n_max: int, reps: int) -> None:
    ctx = ContextParams(n_ctx=1024)
    rows: dict = {}
    for c in CONFIGS:  # every configuration runs on the same loaded weights (equally warm caches)
        planes = PlaneOptions(c[0], "default" if c == CONTROL else c[1])
        cfg = PairConfig(target=pair.target, draft=pair.draft, n_max=n_max, ctx=ctx, planes=planes)
        rows[c] = Row(SpecPair(cfg, share_models=rows[CONFIGS[0]].sp if rows else None))
    plain_stats = RunStats()
    base = rows[CONFIGS[0]].sp
    for rep in range(reps):
        rep_stats = {c: RunStats() for c in rows}
        for i, text in enumerate(PROMPTS[:n_prompts]):
            prompt = base.target_model.tokenize(text)
            base.reset()
            ref = []
            for step in generate_greedy(base.target, prompt, n_predict, ignore_eos=True):
                plain_stats.add(step)
                ref += step.tokens
            reference = np.concatenate([prompt, ref])
            order = list(rows)
            k = (i + rep) % len(order)  # rotate which configuration goes first: no fixed position in the cycle
            for c in order[k:] + order[:k]:
                row, sp = rows[c], rows[c].sp
                sp.reset()
                forced = ForcedAcceptance(sp.proposer, reference, profile_lengths(profile, n_max, seed=i),
                                          sp.target_model.n_vocab)
                tokens = []
                for step in generate_spec(sp.target, forced, prompt, n_predict, n_max, ignore_eos=True,
                                          on_accept=sp.on_accept):
                    row.stats.add(step)
                    rep_stats[c].add(step)
                    tokens += step.tokens
                if rep == 0:
                    row.outputs.append(tokens)
                elif tokens != row.outputs[i]:
                    row.outputs[i] = None  # a repetition changed the output: flagged in the table
        for c, st in rep_stats.items():
            rows[c].rep_tps.append(st.decode_tps)

    weights = np.asarray(PROFILES[profile], dtype=float)
    print(f"\n### profile `{profile}`: " + ", ".join(f"{a}: {100 * w / weights.sum():.1f}%" for a, w in enumerate(weights)))
    print(f"tiny-hybrid target, n_max {n_max}, {n_prompts} prompts x {n_predict} tokens, {reps} repetitions, "
          f"one thread; plain greedy {plain_stats.decode_tps:.0f} t/s\n")
    print("| planes | layout | kept (accepted counts) | replays | decode t/s | vs uncapped | recurrent state | identical |")
    print("|---|---|---|---|---|---|---|---|")
    uncapped = rows[CONFIGS[0]]
    for (planes, lead), row in rows.items():
        sp = row.sp
        if planes is None:
            kept, layout = "all", "control (same as uncapped)" if lead == "control" else "-"
        else:
            layout = LAYOUT_NAMES[lead]
            if lead == "auto":
                kept = f"lead {sp.auto_lead.lead} at the end, {sp.auto_lead.changes} changes"
            else:
                kept = ", ".join(str(k - 1) for k in sp.target.rs_kept_counts(n_max + 1) if k >= 1)
        same = "yes" if row.outputs == uncapped.outputs else "NO"
        print(f"| {planes or f'{n_max + 1} (uncapped)'} | {layout} | {kept} | {100 * row.stats.replay_share:.0f}% "
              f"| {row.stats.decode_tps:.0f} | {ratio_cell(row, uncapped)} "
              f"| {sp.recurrent_bytes() / 1024:.0f} KiB | {same} |")
    for planes in (3, 4, 5):
        fixed = {lead: rows[(planes, lead)] for lead in (0, "default")}
        best = max(fixed, key=lambda lead: fixed[lead].stats.decode_tps)
        print(f"\n{planes} planes: auto / best fixed ({LAYOUT_NAMES[best]}) = {ratio_cell(rows[(planes, 'auto')], fixed[best])}; "
              f"auto / default = {ratio_cell(rows[(planes, 'auto')], fixed['default'])}", end="")
    print(f"\nnoise floor (control / uncapped): {ratio_cell(rows[CONTROL], uncapped)}")
    for row in reversed(rows.values()):  # the first pair owns the shared models: close it last
        row.sp.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="all", choices=[*PROFILES, "all"])
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-r", "--reps", type=int, default=3, help="passes over the prompts (ratios: median and range)")
    args = ap.parse_args()
    pair = resolve(get_entry("tiny-hybrid"))
    for profile in PROFILES if args.profile == "all" else [args.profile]:
        run_profile(profile, pair, args.n, args.prompts, n_max=7, reps=args.reps)


if __name__ == "__main__":
    main()
