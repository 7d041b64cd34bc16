"""Greedy acceptance: the method-agnostic core of every verify step."""

from __future__ import annotations

import numpy as np


def accept_greedy(draft: np.ndarray, target_argmax: np.ndarray) -> int:
    """Number of leading draft tokens the target agrees with.

    `target_argmax[i]` is the target's greedy token after the verify row i, i.e. its prediction
    for the position of `draft[i]`. The step then commits `draft[:a]` plus the target's own
    `target_argmax[a]` (the bonus), so it always makes 1..len(draft)+1 tokens of progress.
    """
    n = len(draft)
    mismatch = np.flatnonzero(draft != target_argmax[:n])
    return int(mismatch[0]) if len(mismatch) else n
