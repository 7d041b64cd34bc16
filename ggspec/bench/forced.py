"""A proposer that forces chosen acceptance lengths, for tests and benchmarks.

Random-weight drafts are almost never accepted, so on their own they would only ever exercise
"accept 0". This proposer runs the real DFlash draft (so the draft cache goes through exactly
the same injections and rollbacks), then replaces its tokens with the target's own greedy
continuation, corrupted at one chosen position k: the target accepts exactly k drafts.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ggspec.speculative.proposer import Draft


class ForcedAcceptance:
    """Wraps a proposer: its real drafts are made and discarded, the target's true continuation
    (corrupted at the wanted position) is proposed instead."""

    def __init__(self, inner, reference=None, accept_lengths: Iterator[int] | None = None, n_vocab: int = 0) -> None:
        """`reference` (or `reference(seq)` when it is callable, for several sequences): the greedy
        token at each position (the prompt followed by its plain greedy continuation);
        `accept_lengths` yields the wanted accepted count for each sequence's step (values above
        the step's draft length mean "accept everything"). Made with the engine (Engine's
        `wrap_proposer`), it is armed with them before each decode (`arm`)."""
        self.inner = inner
        self.n_vocab = n_vocab
        self.name = inner.name
        self.max_draft = inner.max_draft
        self.arm(reference, accept_lengths)

    def arm(self, reference, accept_lengths: Iterator[int] | None) -> None:
        """The continuation and the acceptance lengths of the next decode (see __init__)."""
        if reference is None or callable(reference):  # (None: not armed yet, every draft its own)
            self.reference = reference or (lambda _seq: None)
        else:
            self.reference = lambda _seq, r=np.asarray(reference): r
        self.accept_lengths = accept_lengths

    def __getattr__(self, name):  # begin, observe, commit, flush, release, reset, close
        return getattr(self.inner, name)

    def propose(self, seqs, n: int) -> list[Draft]:
        made = self.inner.propose(seqs, n)  # real draft work, result discarded
        drafts = []
        for seq, own in zip(seqs, made):
            reference = self.reference(seq)
            if reference is None:  # not a benchmark's sequence (the engine's calibration): its own draft
                drafts.append(own)
                continue
            reference = np.asarray(reference, dtype=np.int32)
            truth = reference[seq.pos + 1:seq.pos + 1 + n]
            tokens = np.zeros(n, dtype=np.int32)
            tokens[:len(truth)] = truth
            k = next(self.accept_lengths)
            if k < n:
                tokens[k] = (tokens[k] + 1) % self.n_vocab  # any other token: rejected right there
            drafts.append(Draft(tokens))
        return drafts


def cycle_lengths(n_max: int) -> Iterator[int]:
    """0, 1, ..., n_max, 0, 1, ... so every acceptance length occurs."""
    while True:
        yield from range(n_max + 1)


# Benchmark acceptance profiles: share of verify steps by accepted draft count 0..n_max (n_max 7).
# Used only by benchmarks and tests to replay a realistic acceptance pattern on any target.
PROFILES: dict[str, tuple[float, ...]] = {
    # a real DFlash pair, uncapped, n-max 7, 1422 verifications (bimodal: reject early or accept all)
    "dflash": (24.5, 19.5, 15.0, 9.9, 7.7, 5.0, 3.6, 14.7),
    # MTP-like: most drafts accepted in full
    "mtp": (4.0, 3.0, 3.0, 4.0, 5.0, 8.0, 13.0, 60.0),
    "uniform": (1.0,) * 8,
}


def fit_profile(weights: tuple[float, ...], n_max: int) -> tuple[float, ...]:
    """A histogram of accepted counts 0..len-1 carried to another draft length by its per-position
    continuation rates (the chance that draft k is accepted when all before it were): a shorter
    draft accepts all of itself wherever the original accepted at least that many, a longer one
    keeps accepting at the last measured rate (the DFlash histogram's draft-length-7 shape at n_max 3 or 15)."""
    n0 = len(weights) - 1
    if n_max == n0:
        return tuple(weights)
    w = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    if n_max < n0:
        return tuple(float(x) for x in (*w[:n_max], w[n_max:].sum()))
    reach = np.cumsum(w[::-1])[::-1]  # reach[k] = P(at least k accepted)
    last = reach[n0] / reach[n0 - 1] if reach[n0 - 1] > 0 else 0.0  # P(accept draft n0 | reached it)
    out = list(w[:n0])
    tail = reach[n0]  # the mass that accepted every draft of the original length
    for _ in range(n0, n_max):
        out.append(tail * (1 - last))
        tail *= last
    out.append(tail)
    return tuple(float(x) for x in out)


def profile_lengths(profile: str | tuple[float, ...], n_max: int, seed: int = 0) -> Iterator[int]:
    """Accepted counts drawn i.i.d. from a profile: a name of PROFILES (fitted to n_max by
    fit_profile) or exactly n_max + 1 weights."""
    weights = np.asarray(fit_profile(PROFILES[profile], n_max) if isinstance(profile, str) else profile,
                         dtype=np.float64)
    if len(weights) != n_max + 1:
        raise ValueError(f"acceptance profile has {len(weights)} entries, n_max {n_max} needs {n_max + 1}")
    rng = np.random.default_rng(seed)
    p = weights / weights.sum()
    while True:
        yield int(rng.choice(n_max + 1, p=p))
