"""Running estimates the cost-aware rules read: how far drafts survive, and what llama.cpp calls cost.

Both rules that choose from measurements — which type's draft to verify (`--spec-select cost`,
several.py) and how many drafted tokens to verify (`--spec-draft-n-max auto`, draft_length.py) —
weigh expected committed tokens against the seconds a step takes. `Acceptance` is the first
half (per draft position, decaying counts), `ShapeCosts` the second (one kind of llama.cpp call,
by its size).
"""

from __future__ import annotations

from collections import deque

import numpy as np

DECAY = 0.99  # per scored draft: the acceptance counts follow the text's current kind
EMA = 0.1  # the smoothing of costs measured as one number
RECENT = 16  # calls of each size whose times a cost estimate reads


def draft_match(tokens, history, pos0: int, start: int = 0, limit: int | None = None) -> tuple[int, int]:
    """A draft made after position pos0 against the committed text: how many of its first tokens
    are right, and how many committed tokens follow pos0 to judge it by (at most `limit`). The
    first `start` tokens are known to be right already."""
    reach = len(history) - pos0 - 1 if limit is None else min(len(history) - pos0 - 1, limit)
    k = min(len(tokens), reach)
    if k <= start:
        return start, reach
    wrong = np.flatnonzero(np.asarray(tokens[start:k]) != np.asarray(history[pos0 + 1 + start:pos0 + 1 + k]))
    return start + (int(wrong[0]) if len(wrong) else k - start), reach


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

    def gains(self, length: int, prior: np.ndarray | None = None) -> np.ndarray:
        """Expected committed tokens each drafted position adds (the chance that it and every one
        before it survive). Never increasing.

        Each position's rate (its drafts that were right, of those that reached it) has one draft's
        worth of prior: half right at the first position, and at every later one the rate of the
        position before. Few drafts reach the deep positions, so a fixed prior there (one half)
        would make every long draft look hopeless: n-gram drafts that are right 98 % of the time
        were verified at k 1-8 of 15 on Gemma 3 270M, where the full length paid more.
        `prior`: the drafter's own estimate for each position of this draft (Draft.confidence),
        the one draft's worth of prior instead."""
        rates = np.empty(length)
        last = 0.5
        for i in range(length):
            p = last if prior is None or i >= len(prior) else float(prior[i])
            last = rates[i] = (self.accepted[i] + p) / (self.tried[i] + 1)
        return np.cumprod(rates)

    def expected(self, length: int) -> float:
        """Expected committed tokens of a draft this long: the target's own token plus each
        drafted one that survives."""
        return 1.0 + float(self.gains(length).sum())


class ShapeCosts:
    """Seconds of one kind of call by its size (rows of a verify, tokens of a draft), measured as
    the calls happen: for each size, the lower quartile of its last RECENT calls (robust to the
    slow ones: a size's first calls also build and allocate graphs, 2-4x the time on the tiny
    pair, and the machine's other work only ever adds time); a size not seen yet is read off the
    line through the nearest sizes seen (past either end, the line of the two nearest, never below
    zero). `proportional` calls (a draft of n sequential steps) read sizes below those seen off the
    line to nothing at size 0 (the line of two close sizes would say a short draft costs as much
    as a long one); the others cost, with one size seen, the same at every size."""

    def __init__(self, proportional: bool = False) -> None:
        self.proportional = proportional
        self.samples: dict[int, deque] = {}
        self._curve: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, size: int, seconds: float) -> None:
        recent = self.samples.get(size)
        if recent is None:
            recent = self.samples[size] = deque(maxlen=RECENT)
        recent.append(seconds)
        self._curve = None

    @property
    def seconds(self) -> dict[int, float]:
        """Each measured size's estimate."""
        return {size: sorted(v)[len(v) // 4] for size, v in self.samples.items()}

    def to_json(self) -> dict[str, list[float]]:
        """The recent calls of each size (what `seeded` makes a ShapeCosts of again)."""
        return {str(size): list(v) for size, v in self.samples.items()}

    @classmethod
    def seeded(cls, samples: dict[str, list[float]], proportional: bool = False) -> "ShapeCosts":
        """A ShapeCosts holding these calls (to_json's), which the calls measured next replace."""
        costs = cls(proportional)
        for size, seconds in samples.items():
            for s in seconds:
                costs.add(int(size), float(s))
        return costs

    def __contains__(self, size: int) -> bool:
        return size in self.samples

    def __bool__(self) -> bool:
        return bool(self.samples)

    def at(self, sizes, extra: dict[int, float] | None = None) -> np.ndarray:
        """Estimated seconds at each size (nothing measured: zeros); `extra`: more (size, seconds)
        points for the line, where no size was measured."""
        sizes = np.asarray(sizes, dtype=np.float64)
        if self.proportional and self.samples:  # below the sizes seen: towards nothing at size 0
            extra = {0: 0.0, **(extra or {})}
        if extra:
            points = {**extra, **self.seconds}
            xs = np.array(sorted(points), dtype=np.float64)
            return _read(xs, np.array([points[int(x)] for x in xs]), sizes, self.proportional)
        if not self.samples:
            return np.zeros_like(sizes)
        if self._curve is None:
            points = self.seconds
            xs = np.array(sorted(points), dtype=np.float64)
            self._curve = xs, np.array([points[int(x)] for x in xs])
        return _read(*self._curve, sizes, self.proportional)


def _read(xs: np.ndarray, ys: np.ndarray, sizes: np.ndarray, proportional: bool) -> np.ndarray:
    """The piecewise line through (xs, ys) at `sizes` (ShapeCosts.at). A larger call never costs
    less: a size measured dearer than a larger one (a few slow calls) takes the larger one's cost."""
    ys = np.minimum.accumulate(ys[::-1])[::-1]
    if len(xs) == 1:
        return ys[0] * sizes / xs[0] if proportional else np.full_like(sizes, ys[0])
    out = np.interp(sizes, xs, ys)
    lo, hi = sizes < xs[0], sizes > xs[-1]
    out[lo] = ys[0] + (sizes[lo] - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0])
    out[hi] = ys[-1] + (sizes[hi] - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.maximum(out, 0.0)
