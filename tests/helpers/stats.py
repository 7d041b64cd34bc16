"""Sampled output against plain sampling: the first tokens of many seeds, and a two-sample test."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
from scipy.stats import chi2_contingency

from ggspec.speculative.engine import Engine
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.request import Request

SEEDS = 1500


def draws(eng: Engine, prompt, speculate: bool, n: int = 2) -> Counter:
    """The first n committed tokens of every seed, as a histogram of tuples. Plain and speculative
    runs take different seeds: the samples must be independent for the two-sample test."""
    counts: Counter = Counter()
    pending = list(range(SEEDS)) if speculate else list(range(10**6, 10**6 + SEEDS))
    while pending or eng.active:
        while pending and eng.can_add(prompt, n):
            eng.add(Request(prompt, n, ignore_eos=True, seed=pending.pop(), speculate=speculate, tag="x"))
        for seq in {seq: None for seq, _ in eng.step() if seq.done}:  # a joining sequence has two steps
            counts[tuple(seq.tokens[:n])] += 1
    return counts


def plain_and_spec_draws(models: Models, cfg: PairConfig, prompt, n: int = 2,
                         check: Callable[[Engine], None] | None = None) -> tuple[Counter, Counter]:
    """`draws` of plain sampling, then of speculative decoding, each on its own engine over `models`;
    `check(engine)` looks at the speculative engine before it closes (that it drafted)."""
    with Engine(models, cfg, plain=True) as eng:
        plain = draws(eng, prompt, speculate=False, n=n)
    with Engine(models, cfg) as eng:
        spec = draws(eng, prompt, speculate=True, n=n)
        if check is not None:
            check(eng)
    return plain, spec


def draft_model_decoded(eng: Engine) -> None:
    """A `check` for `plain_and_spec_draws`: the draft model's context decoded (it drafted)."""
    assert eng.draft_ctx.n_decodes > 0


def p_value(a: Counter, b: Counter) -> float:
    """Two-sample chi-square: outcomes seen at least 10 times in all, the rest pooled."""
    total = a + b
    common = [k for k, c in total.items() if c >= 10]
    rows = [[a[k] for k in common] + [sum(a.values()) - sum(a[k] for k in common)],
            [b[k] for k in common] + [sum(b.values()) - sum(b[k] for k in common)]]
    if rows[0][-1] + rows[1][-1] == 0:
        rows = [r[:-1] for r in rows]
    return chi2_contingency(np.array(rows)).pvalue
