"""Several speculative types at once: llama.cpp's comma list (`--spec-type ngram-mod,draft-dflash`).

llama.cpp's rule at the pin (`common_speculative_draft`, the pinned common/speculative.cpp:2787-2870):
the types are tried in a fixed order of preference (models.PRIORITY: the n-gram types first, then
the model drafters); each drafts for the sequences no type before it drafted for, up to its own
length, and the first non-empty draft wins. After the verify, the type whose draft was a sequence's
last non-empty one hears the accepted count; every other type hears it as someone else's (`other`:
the n-gram types' statistics skip it, SP:1838-1845 and 1996-2000). As llama.cpp's `impl_last`, a
step where no type drafts leaves the last drafter as it was.

Every type follows every target decode, drafting or not (begin, observe, flush, commit, release
go to all of them): a draft model's cache and a DFlash draft's features must stay current, and
the n-gram types learn from the whole text.
"""

from __future__ import annotations

import numpy as np

from ggspec.speculative.proposer import Draft, Proposer

_EMPTY = np.empty(0, dtype=np.int32)


class SeveralProposer:
    """Tries its proposers in order for each sequence; the first non-empty draft wins."""

    def __init__(self, proposers: list[Proposer], caps: list[int]) -> None:
        """`caps`: each proposer's own draft length (llama.cpp's n_max of its type)."""
        self.proposers = proposers
        self.caps = caps
        self.name = ",".join(p.name for p in proposers)
        limits = [p.max_draft for p in proposers if p.max_draft is not None]
        self.max_draft: int | None = max(limits) if len(limits) == len(proposers) else None
        self.last: dict[int, int] = {}  # seq_id -> index of the proposer of its last non-empty draft
        self.wins = [0] * len(proposers)  # drafts each proposer made that were verified

    def begin(self, seq, cached: int = 0) -> None:
        self.last.pop(seq.seq_id, None)
        for p in self.proposers:
            p.begin(seq, cached)

    def observe(self, spans) -> None:
        for p in self.proposers:
            p.observe(spans)

    def flush(self) -> None:
        for p in self.proposers:
            p.flush()

    def propose(self, seqs, n: int) -> list[Draft]:
        out: dict[int, Draft] = {}
        waiting = list(seqs)
        for i, (p, cap) in enumerate(zip(self.proposers, self.caps)):
            if not waiting:
                break
            still = []
            for seq, d in zip(waiting, p.propose(waiting, min(n, cap))):
                if len(d):
                    out[seq.seq_id] = d
                    self.last[seq.seq_id] = i
                    self.wins[i] += 1
                else:
                    still.append(seq)
            waiting = still
        empty = Draft(_EMPTY)
        return [out.get(seq.seq_id, empty) for seq in seqs]

    def commit(self, seq, pos0: int, n_committed: int, other: bool = False) -> None:
        last = self.last.get(seq.seq_id)
        for i, p in enumerate(self.proposers):
            p.commit(seq, pos0, n_committed, other=other or i != last)

    def release(self, seq, keep: int = 0) -> int:
        self.last.pop(seq.seq_id, None)
        for p in self.proposers:
            keep = min(keep, p.release(seq, keep))
        return keep

    def reset(self) -> None:
        self.last.clear()
        for p in self.proposers:
            if hasattr(p, "reset"):
                p.reset()

    def close(self) -> None:
        for p in self.proposers:
            p.close()
