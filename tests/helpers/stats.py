"""Sampled output against plain sampling: the first tokens of many seeds, and a two-sample test."""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy.stats import chi2_contingency

from ggspec.speculative.engine import Engine

SEEDS = 1500


def draws(eng: Engine, prompt, speculate: bool, n: int = 2) -> Counter:
    """The first n committed tokens of every seed, as a histogram of tuples. Plain and speculative
    runs take different seeds: the samples must be independent for the two-sample test."""
    counts: Counter = Counter()
    pending = list(range(SEEDS)) if speculate else list(range(10**6, 10**6 + SEEDS))
    while pending or eng.active:
        while pending and eng.can_add(prompt, n):
            eng.add(prompt, n, ignore_eos=True, seed=pending.pop(), speculate=speculate, tag="x")
        for seq in {seq: None for seq, _ in eng.step() if seq.done}:  # a joining sequence has two steps
            counts[tuple(seq.tokens[:n])] += 1
    return counts


def p_value(a: Counter, b: Counter) -> float:
    """Two-sample chi-square: outcomes seen at least 10 times in all, the rest pooled."""
    total = a + b
    common = [k for k, c in total.items() if c >= 10]
    rows = [[a[k] for k in common] + [sum(a.values()) - sum(a[k] for k in common)],
            [b[k] for k in common] + [sum(b.values()) - sum(b[k] for k in common)]]
    if rows[0][-1] + rows[1][-1] == 0:
        rows = [r[:-1] for r in rows]
    return chi2_contingency(np.array(rows)).pvalue
