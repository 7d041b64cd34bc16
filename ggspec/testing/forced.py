"""A proposer that forces chosen acceptance lengths, for tests and benchmarks.

Random-weight drafts are almost never accepted, so on their own they would only ever exercise
"accept 0". This proposer runs the real DFlash draft (so the draft cache goes through exactly
the same injections and rollbacks), then replaces its tokens with the target's own greedy
continuation, corrupted at one chosen position k: the target accepts exactly k drafts.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class ForcedAcceptance:
    def __init__(self, inner, reference: np.ndarray, accept_lengths: Iterator[int], n_vocab: int) -> None:
        """`reference[i]` is the greedy token at position i (prompt followed by its plain greedy
        continuation); `accept_lengths` yields the wanted accepted count for each step (values
        above the step's draft length mean "accept everything")."""
        self.inner = inner
        self.reference = np.asarray(reference, dtype=np.int32)
        self.accept_lengths = accept_lengths
        self.n_vocab = n_vocab

    def capture(self, n_rows: int, pos0: int) -> None:
        self.inner.capture(n_rows, pos0)

    def accept(self, n_committed: int, pos0: int) -> None:
        self.inner.accept(n_committed, pos0)

    def flush(self) -> int:
        return self.inner.flush()

    def propose(self, id_last: int, pos: int, n: int) -> np.ndarray:
        self.inner.propose(id_last, pos, n)  # real draft work, result discarded
        truth = self.reference[pos + 1:pos + 1 + n]
        tokens = np.zeros(n, dtype=np.int32)
        tokens[:len(truth)] = truth
        k = next(self.accept_lengths)
        if k < n:
            tokens[k] = (tokens[k] + 1) % self.n_vocab  # any other token: rejected right there
        return tokens

    def close(self) -> None:
        pass


def cycle_lengths(n_max: int) -> Iterator[int]:
    """0, 1, ..., n_max, 0, 1, ... so every acceptance length occurs."""
    while True:
        yield from range(n_max + 1)


# Benchmark acceptance profiles: share of verify steps by accepted draft count 0..n_max (n_max 7).
# Used only by benchmarks and tests to replay a realistic acceptance pattern on any target.
PROFILES: dict[str, tuple[float, ...]] = {
    # seed 000: DFlash, uncapped, n-max 7, 1422 verifications (bimodal: reject early or accept all)
    "dflash": (24.5, 19.5, 15.0, 9.9, 7.7, 5.0, 3.6, 14.7),
    # MTP-like: most drafts accepted in full
    "mtp": (4.0, 3.0, 3.0, 4.0, 5.0, 8.0, 13.0, 60.0),
    "uniform": (1.0,) * 8,
}


def profile_lengths(profile: str | tuple[float, ...], n_max: int, seed: int = 0) -> Iterator[int]:
    """Accepted counts drawn i.i.d. from a profile (a name of PROFILES or n_max + 1 weights)."""
    weights = np.asarray(PROFILES[profile] if isinstance(profile, str) else profile, dtype=np.float64)
    if len(weights) != n_max + 1:
        raise ValueError(f"acceptance profile has {len(weights)} entries, n_max {n_max} needs {n_max + 1}")
    rng = np.random.default_rng(seed)
    p = weights / weights.sum()
    while True:
        yield int(rng.choice(n_max + 1, p=p))
