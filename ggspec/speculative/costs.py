"""Running estimates the cost-aware rules read: how far drafts survive, and what llama.cpp calls cost.

Both rules that choose from measurements — which type's draft to verify (`--spec-select cost`,
several.py) and how many drafted tokens to verify (`--spec-draft-n-max auto`, draft_length.py) —
weigh expected committed tokens against the seconds a step takes. `Acceptance` is the first
half (per draft position, decaying counts), `ShapeCosts` the second (one kind of llama.cpp call,
by its size).
"""

from __future__ import annotations

import numpy as np

DECAY = 0.99  # per scored draft: the acceptance counts follow the text's current kind
EMA = 0.1  # the measured costs' smoothing


def ema(old: float | None, new: float) -> float:
    return new if old is None else old + EMA * (new - old)


class Acceptance:
    """Per draft position: how often a draft reached it, and how often it was right there."""

    def __init__(self, n: int) -> None:
        self.tried = np.zeros(n)
        self.accepted = np.zeros(n)

    def add(self, length: int, matched: int, known: int) -> None:
        """A draft of `length` tokens whose first `matched` were right, of which the first `known`
        positions could be checked (a verify checks matched + 1, the committed tokens as many)."""
        self.tried *= DECAY
        self.accepted *= DECAY
        reached = min(length, matched + 1, known, len(self.tried))
        self.tried[:reached] += 1
        self.accepted[:min(matched, reached)] += 1

    def gains(self, length: int) -> np.ndarray:
        """Expected committed tokens each drafted position adds (the chance that it and every one
        before it survive; half a right and half a wrong draft as the prior, so a few drafts seen
        already decide). Never increasing."""
        rates = (self.accepted[:length] + 0.5) / (self.tried[:length] + 1)
        return np.cumprod(rates)

    def expected(self, length: int) -> float:
        """Expected committed tokens of a draft this long: the target's own token plus each
        drafted one that survives."""
        return 1.0 + float(self.gains(length).sum())


class ShapeCosts:
    """Seconds of one kind of call by its size (rows of a verify, tokens of a draft), measured as
    the calls happen: each size's smoothed time, from its second call on (a size's first call also
    builds and allocates its graph: 4x the time on the tiny pair); a size not seen yet is read off the line through
    the nearest sizes seen (past either end, the line of the two nearest, never below zero). With
    one size seen, `proportional` calls (a draft of n sequential steps) scale with the size, the
    others cost the same at every size."""

    def __init__(self, proportional: bool = False) -> None:
        self.proportional = proportional
        self.seconds: dict[int, float] = {}
        self._first: set[int] = set()  # sizes whose one measurement so far was their first call
        self._curve: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, size: int, seconds: float) -> None:
        if size in self._first:  # the second call replaces the first
            self._first.discard(size)
            self.seconds[size] = seconds
        elif size in self.seconds:
            self.seconds[size] = ema(self.seconds[size], seconds)
        else:
            self._first.add(size)
            self.seconds[size] = seconds
        self._curve = None

    def __contains__(self, size: int) -> bool:
        return size in self.seconds

    def __bool__(self) -> bool:
        return bool(self.seconds)

    def at(self, sizes) -> np.ndarray:
        """Estimated seconds at each size (nothing measured: zeros)."""
        sizes = np.asarray(sizes, dtype=np.float64)
        if not self.seconds:
            return np.zeros_like(sizes)
        if self._curve is None:
            xs = np.array(sorted(self.seconds), dtype=np.float64)
            self._curve = xs, np.array([self.seconds[int(x)] for x in xs])
        xs, ys = self._curve
        if len(xs) == 1:
            return ys[0] * sizes / xs[0] if self.proportional else np.full_like(sizes, ys[0])
        out = np.interp(sizes, xs, ys)
        lo, hi = sizes < xs[0], sizes > xs[-1]
        out[lo] = ys[0] + (sizes[lo] - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0])
        out[hi] = ys[-1] + (sizes[hi] - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return np.maximum(out, 0.0)
