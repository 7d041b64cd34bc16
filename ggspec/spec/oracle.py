"""The losslessness oracle: speculative greedy output must equal plain greedy output.

At the first divergence we report the target's own top-2 logit margin there (from the plain
run). Only a tiny margin can make a batched verify flip an argmax by rounding (a benign
near-tie); any larger margin means a real bug.
"""

from __future__ import annotations

from dataclasses import dataclass

# A divergence at a position whose top-2 logit gap is below this counts as a rounding near-tie.
# The gap between two logits is the gap between their log-probabilities, so this is seed 002's
# gate of 0.2 nat.
TIE_MARGIN = 0.2


@dataclass(frozen=True)
class Divergence:
    index: int  # first generated-token index where the two runs differ
    expected: int | None  # plain greedy token (None: the plain run ended earlier)
    got: int | None  # speculative token (None: the speculative run ended earlier)
    margin: float | None  # the target's top-2 logit margin at `index` in the plain run

    @property
    def benign(self) -> bool:
        return self.margin is not None and self.margin < TIE_MARGIN

    def describe(self) -> str:
        kind = "benign near-tie" if self.benign else "REAL divergence"
        return (f"{kind} at token {self.index}: plain {self.expected}, speculative {self.got}, "
                f"target top-2 margin {self.margin if self.margin is None else f'{self.margin:.5f}'}")


def compare(plain: list[int], margins: list[float], spec: list[int]) -> Divergence | None:
    """None when the two token streams are identical."""
    for i in range(max(len(plain), len(spec))):
        a = plain[i] if i < len(plain) else None
        b = spec[i] if i < len(spec) else None
        if a != b:
            return Divergence(i, a, b, margins[i] if i < len(margins) else None)
    return None
