"""Acceptance rules: given the target's rows for a verify span and the draft, what is committed.

A verify span of a sequence is [id_last, d1..dn]; row i of the target predicts the token after
the span's i-th token. Every rule returns the number of drafts accepted (a leading run) and the
committed tokens: those drafts plus one token from the target (the correction or the bonus).
Greedy lives here; the rejection sampler of speculative sampling plugs in beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ggspec.speculative.proposer import Draft
from ggspec.speculative.sequence import Sequence


@dataclass(frozen=True)
class Outcome:
    accepted: int  # leading drafts the target accepted
    tokens: list[int]  # committed: d1..d_accepted, then the target's own token


class Verifier(Protocol):
    def verify(self, logits: np.ndarray, spans: list[tuple[Sequence, Draft, int]]) -> list[Outcome]:
        """logits: (rows, n_vocab), the target's output rows of the whole verify batch;
        spans: (sequence, its draft, its first row) in batch order, each span len(draft) + 1 rows."""


def accept_greedy(draft: np.ndarray, target_argmax: np.ndarray) -> int:
    """Length of the leading run where draft[i] == target_argmax[i]."""
    n = len(draft)
    if n == 0:
        return 0
    mismatch = np.flatnonzero(np.asarray(draft[:n]) != target_argmax[:n])
    return int(mismatch[0]) if len(mismatch) else n


class GreedyVerifier:
    """Temperature 0: accept drafts while they equal the target's argmax; the target's argmax
    after them is committed too. One argmax over every row of the batch."""

    def verify(self, logits: np.ndarray, spans: list[tuple[Sequence, Draft, int]]) -> list[Outcome]:
        argmax = logits.argmax(axis=1).tolist()  # plain ints: the drafts are a few tokens each
        out = []
        for _seq, draft, row0 in spans:
            drafted = draft.tokens.tolist()
            target = argmax[row0:row0 + len(drafted) + 1]
            a = 0
            while a < len(drafted) and drafted[a] == target[a]:
                a += 1
            out.append(Outcome(a, drafted[:a] + [target[a]]))
        return out
