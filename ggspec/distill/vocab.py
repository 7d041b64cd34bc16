"""A reduced draft vocabulary: the N target tokens the data's labels use most, and the maps.

llama.cpp's dflash graph reads a `d2t` tensor (int64, draft row -> target token id) and scatters
the draft's N logits into the target's vocabulary (-inf elsewhere), so a reduced draft ships its own
N-row head. A label outside the N tokens cannot be drafted: its share is the acceptance it costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE = -100  # torch cross_entropy's ignore_index


@dataclass(frozen=True)
class DraftVocab:
    d2t: np.ndarray  # int64 [N]: target id of each draft row, ascending
    t2d: np.ndarray  # int64 [V]: draft row of each target id, IGNORE when absent
    coverage: float  # share of the counted labels inside the draft vocabulary

    @property
    def size(self) -> int:
        return len(self.d2t)


def choose(labels: np.ndarray, extra: np.ndarray, n: int, n_vocab: int) -> DraftVocab:
    """The n most frequent label tokens (ties: lower id first), topped up from `extra` (other tokens
    of the data, by frequency) and then by id, so the size is always n."""
    counts = np.bincount(labels, minlength=n_vocab)
    order = np.lexsort((np.arange(n_vocab), -counts))  # by count descending, then id
    chosen = [int(i) for i in order[:n] if counts[i] > 0]
    if len(chosen) < n:
        extra_counts = np.bincount(extra, minlength=n_vocab)
        extra_counts[chosen] = 0
        more = np.lexsort((np.arange(n_vocab), -extra_counts))
        taken = set(chosen)
        for i in more:
            if len(chosen) == n:
                break
            if int(i) not in taken:
                chosen.append(int(i))
                taken.add(int(i))
    d2t = np.sort(np.asarray(chosen, np.int64))
    t2d = np.full(n_vocab, IGNORE, np.int64)
    t2d[d2t] = np.arange(len(d2t))
    coverage = float(counts[d2t].sum() / max(1, counts.sum()))
    return DraftVocab(d2t=d2t, t2d=t2d, coverage=coverage)


def full(n_vocab: int) -> DraftVocab:
    ids = np.arange(n_vocab, dtype=np.int64)
    return DraftVocab(d2t=ids, t2d=ids, coverage=1.0)
