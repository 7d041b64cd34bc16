"""Several speculative types at once: llama.cpp's comma list (`--spec-type ngram-mod,draft-dflash`).

Two rules choose, per step and sequence, whose draft is verified:

`first`, llama.cpp's rule at the pin (`common_speculative_draft`, the pinned
common/speculative.cpp:2787-2870): the types are tried in a fixed order of preference
(the registry's priorities: the n-gram types first, then the model drafters); each drafts for the sequences
no type before it drafted for, up to its own length, and the first non-empty draft wins.

`cost`, which no anchor has: every n-gram type drafts for every sequence (they cost microseconds),
and a sequence's draft is the one with the most expected committed tokens per second of step,
E_t(L) / (d_t + V): E_t(L) = 1 + sum over i <= L of the product of the type's acceptance rates
at positions 1..i (running, decaying counts, a 1/2 prior), d_t the type's measured seconds per
draft call, V the measured seconds of a verify. The model drafter is called only for sequences
whose best n-gram draft scores below what the model is expected to give at its length. Drafts
that are made but not verified are scored afterwards against the committed tokens (as far as
those reach), so a type keeps being measured while it loses.

Either way, after the verify the type whose draft was a sequence's last non-empty one hears the
accepted count; every other type hears it as someone else's (`other`: the n-gram types'
statistics skip it, SP:1838-1845 and 1996-2000); as llama.cpp's `impl_last`, a step where no type
drafts leaves the last drafter as it was. Every type follows every target decode, drafting or not
(begin, observe, flush, commit, release go to all of them): a draft model's cache and a DFlash
draft's features must stay current, and the n-gram types learn from the whole text.

A sequence may name the types that draft for it (DraftLimits.types: a server request's
`speculative.type`); the others skip it, and for it they are always `other`. A server also holds
the n-gram types it was not started with, on standby (`default` False): they follow the text like
the others and draft only for the sequences that name them.
"""

from __future__ import annotations

import time

import numpy as np

from ggspec.speculative.proposer import Draft, Proposer
from ggspec.speculative.rules.costs import Acceptance, draft_match, ema
from ggspec.speculative.types import registry

SELECT_RULES = ("first", "cost")
_EMPTY = np.empty(0, dtype=np.int32)


class SeveralProposer(Proposer):
    """Drafts with several proposers, one draft per sequence chosen by `select` (module docstring)."""

    def __init__(self, proposers: list[Proposer], caps: list[int], select: str = "first",
                 default: list[bool] | None = None) -> None:
        """`caps`: each proposer's own draft length (llama.cpp's n_max of its type). Under `cost`,
        the n-gram proposers are all but the last when it drafts with a model (`model_last`).
        `default`: whether each one drafts for a sequence that names no types (None: all do;
        the others are on standby)."""
        self.proposers = proposers
        self.caps = caps
        self.select = select
        self.default = default or [True] * len(proposers)
        self.model_last = not registry.get(proposers[-1].name).traits.cheap  # the last drafts with a model
        own = [p for p, on in zip(proposers, self.default) if on]
        self.name = ",".join(p.name for p in own)
        limits = [p.max_draft for p in own if p.max_draft is not None]
        self.max_draft: int | None = max(limits) if len(limits) == len(own) else None
        self.last: dict[int, int] = {}  # seq_id -> index of the proposer of its last non-empty draft
        self.wins = [0] * len(proposers)  # drafts each proposer made that were verified
        self.acceptance = [Acceptance(cap) for cap in caps]
        self.t_call: list[float | None] = [None] * len(proposers)  # seconds per propose call
        self.t_verify: float | None = None
        self._t_proposed: float | None = None  # when the last propose returned (the verify follows)
        self._verified: dict[int, tuple[int, int]] = {}  # seq_id -> (proposer, draft length) verified now
        self._unused: dict[int, list[tuple[int, int, np.ndarray]]] = {}  # seq_id -> (proposer, pos0, tokens)
        self._scoring: dict[int, tuple[int, list]] = {}  # seq_id -> (pos0, unused drafts) waiting for tokens

    # --- following the target ---------------------------------------------------------------------

    def begin(self, seq, cached: int = 0) -> None:
        self._forget(seq)
        for p in self.proposers:
            p.begin(seq, cached)

    def observe(self, spans) -> None:
        for p in self.proposers:
            p.observe(spans)

    def memory(self) -> dict[str, int] | None:
        return next((m for p in self.proposers if (m := p.memory()) is not None), None)

    def flush(self) -> None:
        for p in self.proposers:
            p.flush()

    def commit(self, seq, pos0: int, n_committed: int, other: bool = False, rows: list[int] | None = None) -> None:
        if self._t_proposed is not None:  # the first commit after a propose: the verify just ran
            self.t_verify = ema(self.t_verify, time.perf_counter() - self._t_proposed)
            self._t_proposed = None
        sid = seq.seq_id
        verified = self._verified.pop(sid, None)
        if verified is not None:
            i, length = verified
            self.acceptance[i].add(length, n_committed - 1, length)
        unused = self._unused.pop(sid, None)
        if unused:  # scored once the committed tokens are in the history (the next propose)
            self._scoring[sid] = (n_committed, unused)
        last = self.last.get(sid)
        allowed = self._allowed(seq)
        alone = allowed.count(True) == 1  # its one type is never someone else's
        for i, p in enumerate(self.proposers):
            theirs = other or not allowed[i] or (i != last and not alone)
            if rows is not None and p.grows_trees:  # (the others read the committed text, not rows)
                p.commit(seq, pos0, n_committed, other=theirs, rows=rows)
            else:
                p.commit(seq, pos0, n_committed, other=theirs)

    # --- token trees: from the drafter whose draft each sequence verifies ----------------------------

    @property
    def grows_trees(self) -> bool:
        return any(p.grows_trees for p in self.proposers)

    @property
    def cache_lag(self) -> int:
        return max((p.cache_lag for p in self.proposers), default=0)

    def keep_candidates(self) -> None:
        for p in self.proposers:
            p.keep_candidates()

    def want_candidates(self, on: bool) -> None:
        for p in self.proposers:
            p.want_candidates(on)

    def marginals(self, seqs, n: int, k: int) -> list:
        """Each sequence's candidates from the proposer whose draft it verifies this step (None
        where that one grows no trees: an n-gram type's)."""
        out: list = [None] * len(seqs)
        for i, p in enumerate(self.proposers):
            mine = [s for s, seq in enumerate(seqs) if self.last.get(seq.seq_id) == i]
            if mine and p.grows_trees:
                for s, cand in zip(mine, p.marginals([seqs[s] for s in mine], n, k)):
                    out[s] = cand
        return out

    def _score_unused(self, seq) -> None:
        """Drafts made but not verified, against the tokens committed after them."""
        scoring = self._scoring.pop(seq.seq_id, None)
        if scoring is None:
            return
        n_committed, unused = scoring
        for i, pos0, tokens in unused:
            matched, reach = draft_match(tokens, seq.history, pos0, limit=n_committed)
            self.acceptance[i].add(len(tokens), matched, reach)

    # --- drafting ---------------------------------------------------------------------------------

    def propose(self, seqs, n: int) -> list[Draft]:
        drafts = self._first(seqs, n) if self.select == "first" else self._cheapest(seqs, n)
        for seq, d in zip(seqs, drafts):
            if len(d):
                i = self.last[seq.seq_id]
                self.wins[i] += 1
                self._verified[seq.seq_id] = (i, len(d))
        self._t_proposed = time.perf_counter()
        return drafts

    def _allowed(self, seq) -> list[bool]:
        """Whether each proposer may draft for this sequence (its own types, else the defaults)."""
        types = seq.limits.types
        return self.default if types is None else [p.name in types for p in self.proposers]

    def _call(self, i: int, seqs, n: int) -> list[Draft]:
        """Proposer i's drafts for the sequences that allow it (empty for the others)."""
        mine = [s for s, seq in enumerate(seqs) if self._allowed(seq)[i]]
        drafts = [Draft(_EMPTY)] * len(seqs)
        if not mine:
            return drafts
        t0 = time.perf_counter()
        made = self.proposers[i].propose([seqs[s] for s in mine], min(n, self.caps[i]))
        self.t_call[i] = ema(self.t_call[i], time.perf_counter() - t0)
        for s, d in zip(mine, made):
            drafts[s] = d
        return drafts

    def _first(self, seqs, n: int) -> list[Draft]:
        """llama.cpp's rule: in order, each type for the sequences still without a draft."""
        out: dict[int, Draft] = {}
        waiting = list(seqs)
        for i in range(len(self.proposers)):
            if not waiting:
                break
            still = []
            for seq, d in zip(waiting, self._call(i, waiting, n)):
                if len(d):
                    out[seq.seq_id] = d
                    self.last[seq.seq_id] = i
                else:
                    still.append(seq)
            waiting = still
        return [out.get(seq.seq_id, Draft(_EMPTY)) for seq in seqs]

    def _cheapest(self, seqs, n: int) -> list[Draft]:
        """The cost rule: every n-gram type's draft, the model's only where it is expected to be
        worth more per second than the best of those."""
        for seq in seqs:
            self._score_unused(seq)
        k = len(self.proposers) - 1 if self.model_last else len(self.proposers)  # the n-gram proposers
        made = [self._call(i, seqs, n) for i in range(k)]
        drafts, choice, scores = [], [], []
        for s in range(len(seqs)):
            options = [(self._worth(i, len(made[i][s])), -i) for i in range(k) if len(made[i][s])]
            score, i = max(options, default=(0.0, 1))  # ties: the type llama.cpp prefers
            choice.append(-i)
            scores.append(score)
            drafts.append(made[-i][s] if -i >= 0 else Draft(_EMPTY))
        if self.model_last:
            worth = self._worth(k, min(n, self.caps[k]))
            want = [s for s in range(len(seqs)) if worth > scores[s]]
            if want:
                for s, d in zip(want, self._call(k, [seqs[s] for s in want], n)):
                    if len(d):  # (an empty model draft, a p-min cut: the n-gram one stays)
                        drafts[s], choice[s] = d, k
        for s, seq in enumerate(seqs):
            if choice[s] >= 0:
                self.last[seq.seq_id] = choice[s]
            unused = [(j, seq.pos, made[j][s].tokens) for j in range(k) if j != choice[s] and len(made[j][s])]
            if unused:
                self._unused[seq.seq_id] = unused
        return drafts

    def _worth(self, i: int, length: int) -> float:
        """Expected committed tokens per second of a step with proposer i's draft of this length
        (unmeasured costs count as free: the first calls measure them)."""
        seconds = (self.t_call[i] or 0.0) + (self.t_verify or 0.0)
        expected = self.acceptance[i].expected(length)
        return expected / seconds if seconds > 0 else float("inf")

    # --- lifetime ---------------------------------------------------------------------------------

    def _forget(self, seq) -> None:
        sid = seq.seq_id
        for d in (self.last, self._verified, self._unused, self._scoring):
            d.pop(sid, None)

    def release(self, seq, keep: int = 0) -> int:
        self._forget(seq)
        for p in self.proposers:
            keep = min(keep, p.release(seq, keep))
        return keep

    def reset(self) -> None:
        for d in (self.last, self._verified, self._unused, self._scoring):
            d.clear()
        for p in self.proposers:
            p.reset()

    def close(self) -> None:
        for p in self.proposers:
            p.close()
