"""Acceptance rules: given the target's rows for a verify span and the draft, what is committed.

A verify span of a sequence is [id_last, d1..dn]; row i of the target predicts the token after
the span's i-th token. Every rule returns the number of drafts accepted (a leading run) and the
committed tokens: those drafts plus one token from the target (the correction or the bonus).
Greedy (temperature 0) and the rejection sampler of speculative sampling (temperature > 0).

A sequence whose grammar allows no token at a row fails alone: its outcome commits nothing and
carries the error (`Outcome.failure`), and the other sequences of the batch go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ggspec.errors import GGSpecError
from ggspec.runtime.grammar import GrammarDeadEnd
from ggspec.speculative.proposer import Draft
from ggspec.speculative.sampling import Candidates, SamplerSettings, adjust, candidates
from ggspec.speculative.sequence import Sequence

DRAFT, VERIFY = 0, 1  # the purposes of a sequence's random draws (Sequence.rng)


@dataclass(slots=True)
class Outcome:
    accepted: int  # leading drafts the target accepted
    tokens: list[int]  # committed: d1..d_accepted, then the target's own token
    failure: GGSpecError | None = None  # this sequence cannot go on (nothing committed)


class Verifier(Protocol):
    def verify(self, logits: np.ndarray, spans: list[tuple[Sequence, Draft, int]]) -> list[Outcome]:
        """logits: (rows, n_vocab), the target's output rows of the whole verify batch;
        spans: (sequence, its draft, its first row) in batch order, each span len(draft) + 1 rows."""


def accept_greedy(draft, target_argmax) -> int:
    """Length of the leading run where draft[i] == target_argmax[i]. Plain lists are fastest here:
    a draft is a few tokens, and this runs for every sequence of every step."""
    a = 0
    while a < len(draft) and draft[a] == target_argmax[a]:
        a += 1
    return a


class GreedyVerifier:
    """Temperature 0: accept drafts while they equal the target's argmax; the target's argmax
    after them is committed too. One argmax over every row of the batch."""

    def verify(self, logits: np.ndarray, spans: list[tuple[Sequence, Draft, int]]) -> list[Outcome]:
        argmax = logits.argmax(axis=1).tolist()  # plain ints: the drafts are a few tokens each
        out = []
        for _seq, draft, row0 in spans:
            drafted = draft.tokens.tolist()
            target = argmax[row0:row0 + len(drafted) + 1]
            a = accept_greedy(drafted, target)
            out.append(Outcome(a, drafted[:a] + [target[a]]))
        return out


class SequenceVerifier:
    """The rule each sequence's own sampler settings call for (`Sequence.sampling`): greedy
    sequences by the greedy rule, sampling ones by rejection sampling with their settings. The
    greedy spans of a step share one argmax over the rows."""

    def __init__(self) -> None:
        self.greedy = GreedyVerifier()
        self.rejection = RejectionVerifier()  # each span with its sequence's own settings

    def verify(self, logits: np.ndarray, spans: list[tuple[Sequence, Draft, int]]) -> list[Outcome]:
        if all(seq.sampling.greedy and not row_by_row(seq) for seq, _, _ in spans):
            return self.greedy.verify(logits, spans)
        outcomes: list[Outcome | None] = [None] * len(spans)
        for k, (seq, draft, row0) in enumerate(spans):  # rows judged at their own state, span by span
            if row_by_row(seq):
                try:
                    outcomes[k] = verify_rows(logits[row0:row0 + len(draft) + 1], seq, draft)
                except GrammarDeadEnd as exc:  # this sequence ends; the others go on
                    outcomes[k] = Outcome(0, [], exc)
        for rule, greedy in ((self.greedy, True), (self.rejection, False)):  # each rule once per step
            mine = [k for k, (seq, _, _) in enumerate(spans) if seq.sampling.greedy == greedy and outcomes[k] is None]
            if mine:
                for k, outcome in zip(mine, rule.verify(logits, [spans[k] for k in mine])):
                    outcomes[k] = outcome
        return outcomes


def row_by_row(seq: Sequence) -> bool:
    """Whether a sequence's rows depend on the tokens before them (a grammar, logit bias,
    penalties): then each of its rows is judged at its own position (`verify_rows`)."""
    return seq.grammar is not None or seq.sampling.adjusts


def verify_rows(rows: np.ndarray, seq: Sequence, draft: Draft) -> Outcome:
    """One span whose rows are judged at the state after the span's tokens before them, as plain
    decoding would judge them: bias and penalties over the history up to that row (`adjust`), and
    the grammar at its state there (a clone walks the drafted tokens). Greedy: the best token the
    grammar allows; sampled: the rejection sampler over the distribution that leaves (forbidden
    tokens at -inf before top-k / top-p / min-p, as llama.cpp's chain)."""
    tokens = draft.tokens.tolist()
    last_n = seq.sampling.penalty_last_n
    history = [] if not seq.sampling.penalizes else seq.history[-last_n:] if last_n > 0 else seq.history

    def logits(i: int) -> np.ndarray:
        return adjust(rows[i], seq.sampling, history + tokens[:i]) if seq.sampling.adjusts else rows[i]

    if seq.grammar is None:
        if seq.sampling.greedy:
            return greedy_walk(tokens, lambda i: int(logits(i).argmax()), lambda x: None)
        return RejectionVerifier.verify_one(lambda i: candidates(logits(i), seq.sampling), draft, seq.rng(VERIFY))
    if not tokens and seq.sampling.greedy:  # one row, at the sequence's own state: no walk
        return Outcome(0, [seq.grammar.greedy(logits(0))])
    walk = seq.grammar.clone()
    try:
        if seq.sampling.greedy:
            return greedy_walk(tokens, lambda i: walk.greedy(logits(i)), walk.accept)
        at = [0]

        def row(i: int) -> Candidates:  # the walk reaches row i only after accepting tokens[:i]
            while at[0] < i:
                walk.accept(tokens[at[0]])
                at[0] += 1
            masked = walk.mask(logits(i))
            if not np.isfinite(masked).any():  # (nothing to draw from: the sampler would pick junk)
                raise GrammarDeadEnd("the grammar allows no token here")
            return candidates(masked, seq.sampling)

        return RejectionVerifier.verify_one(row, draft, seq.rng(VERIFY))
    finally:
        walk.close()


def greedy_walk(tokens: list[int], pick, advance) -> Outcome:
    """The greedy rule row by row: `pick(i)` is row i's token, `advance(x)` moves past an
    accepted draft token x (a grammar's walk) before the next row is picked."""
    for i, x in enumerate(tokens):
        best = pick(i)
        if best != x:
            return Outcome(i, tokens[:i] + [best])
        advance(x)
    return Outcome(len(tokens), tokens + [pick(len(tokens))])


class RejectionVerifier:
    """Speculative sampling: the committed tokens follow exactly the target's sampling distribution p
    (after the sampler transforms), whatever the draft proposed.

    At each drafted position i the draft token x, proposed with probability q(x), is accepted with
    probability min(1, p(x) / q(x)); at the first rejection the committed token is drawn from the
    residual norm(max(0, p - q)) and the step ends; when every draft is accepted the bonus token
    is drawn from p at the next row. A draft without a distribution (n-gram, a DFlash2 walk, a
    greedy draft) is a point mass on its token: accepted with probability p(x), the residual is p
    without x. Each sequence draws from its own generator (`Sequence.rng`), keyed by its seed and
    position. `settings` None: each sequence's own (`Sequence.sampling`)."""

    def __init__(self, settings: SamplerSettings | None = None) -> None:
        self.settings = settings

    def verify(self, logits: np.ndarray, spans: list[tuple[Sequence, Draft, int]]) -> list[Outcome]:
        out = []
        for seq, draft, row0 in spans:
            rows = logits[row0:row0 + len(draft) + 1]
            settings = self.settings or seq.sampling
            # a row's distribution is computed only when the walk reaches it (most steps stop early)
            out.append(self.verify_one(lambda i, rows=rows, s=settings: candidates(rows[i], s), draft,
                                       seq.rng(VERIFY)))
        return out

    @staticmethod
    def verify_one(p, draft: Draft, rng) -> Outcome:
        """p: the target's Candidates for the span's rows (len(draft) + 1 of them), or a function
        of the row index giving that row's; rng: anything with .random() in [0, 1)."""
        row = p.__getitem__ if isinstance(p, Candidates) else p
        tokens = draft.tokens.tolist()
        q = draft.probs
        for i, x in enumerate(tokens):
            p_i = row(i)
            q_x = 1.0 if q is None else q.prob(i, x)
            if q_x > 0 and rng.random() * q_x < p_i.prob(0, x):  # u < p(x) / q(x), without dividing
                continue
            residual = p_i.residual(None if q is None else q[i], x)
            return Outcome(i, tokens[:i] + [int(residual.sample([rng.random()])[0])])
        return Outcome(len(tokens), tokens + [int(row(len(tokens)).sample([rng.random()])[0])])
