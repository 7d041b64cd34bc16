"""Recurrent-state planes for hybrid targets: how many, which states they keep, and `auto` lead.

A hybrid target (gated delta-net layers) cannot drop rejected tokens from its recurrent state;
it restores a snapshot ("plane") taken during the verify batch. Uncapped, there is one plane per
possible accepted count (n_max + 1) and every rollback is a plane switch. Capped at P planes
(patch 0002), one plane keeps the newest state (everything accepted), one the input state
(before the batch), `lead` planes the states after the first 1..lead tokens, and the rest the
states after the last tokens. A rollback whose state is not kept restores the input plane and
replays the committed tokens `[id_last, d1..da]` on the target (see engine.py: _replay).

For a verify batch of n tokens the kept token counts k are {0, n} ∪ {1..lead} ∪ {n-1, n-2, ...};
accepting a drafts needs the state after k = a + 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError

UNCAPPED = "uncapped"


@dataclass(frozen=True)
class PlaneOptions:
    planes: int | None = None  # None: uncapped (n_max + 1 planes)
    lead: int | str = "default"  # an int, "default" or "auto"

    @staticmethod
    def parse(planes: str | int | None, lead: str | int | None) -> "PlaneOptions":
        """From CLI / models.toml spellings: planes N|uncapped, lead N|default|auto."""
        p: int | None = None
        if planes is not None and str(planes) != UNCAPPED:
            try:
                p = int(planes)
            except ValueError:
                raise InputError(f"{planes}: expected a number or 'uncapped'", field="planes") from None
        ld: int | str = "default" if lead is None else lead
        if isinstance(ld, str) and ld not in ("default", "auto"):
            try:
                ld = int(ld)
            except ValueError:
                raise InputError(f"{lead}: expected a number, 'default' or 'auto'", field="lead") from None
        return PlaneOptions(p, ld)

    @property
    def given(self) -> bool:
        return self.planes is not None or self.lead != "default"

    def check(self, n_max: int) -> None:
        if self.planes is not None and not 2 <= self.planes <= n_max + 1:
            raise InputError(f"{self.planes} planes: must be 2..{n_max + 1} "
                             f"(n_max + 1 = uncapped) for a draft length of {n_max}", field="planes")
        if isinstance(self.lead, int):
            planes = self.planes if self.planes is not None else n_max + 1
            if not 0 <= self.lead <= planes - 2:
                raise InputError(f"lead {self.lead}: must be 0..{planes - 2} "
                                 f"(planes - 2: one plane keeps the newest state, one the input state)", field="lead")

    def n_planes(self, n_max: int) -> int:
        return self.planes if self.planes is not None else n_max + 1

    def capped(self, n_max: int) -> bool:
        return self.n_planes(n_max) < n_max + 1


def default_lead(planes: int) -> int:
    """DFlash's default: keep {0, 1, ..., planes - 3 accepted, everything accepted}.

    DFlash's acceptance is bimodal (measured on a real DFlash pair: 24.5 % of steps accept nothing, 14.7 % accept all
    7), so the leading states plus the newest cover far more steps than the trailing ones."""
    return planes - 2


def kept_counts(planes: int, lead: int, n_tokens: int) -> set[int]:
    """Token counts whose state survives a batch of n_tokens (mirrors patch 0002's slot map).
    lead -1 is llama.cpp's default layout: the newest states only, no input state."""
    if lead < 0:
        return {n_tokens - j for j in range(min(n_tokens, planes))}
    if n_tokens + 1 <= planes:
        return set(range(n_tokens + 1))
    lead_states = range(1, lead + 1)
    trailing = range(n_tokens - 1, n_tokens - 1 - (planes - 2 - lead), -1)
    return {k for k in (n_tokens, 0, *lead_states, *trailing) if 0 <= k <= n_tokens}


def covered_accepts(planes: int, lead: int, n_max: int) -> set[int]:
    """Accepted counts a (0..n_max) a full verify batch can roll back to without a replay."""
    return {k - 1 for k in kept_counts(planes, lead, n_max + 1) if k >= 1}


def replay_cost(a: int) -> float:
    """Relative cost of replaying a + 1 tokens: one target call plus a small per-token part
    (on the CPU here a k-token batch costs about 1 + 0.05 k single-token decodes)."""
    return 1.0 + 0.05 * (a + 1)


class AutoLead:
    """Picks the lead from the running (decayed) histogram of accepted counts so as to minimise
    the expected replay cost, with hysteresis: a layout change may rebuild the target's graph, so
    it switches only when the best layout is clearly cheaper, and not more often than every
    `cooldown` steps. The histogram outlives a request (`Engine.reset` keeps it): acceptance is
    a property of the model pair and the workload, so the next request starts from what was learned.

    It runs once per verify step, between two llama.cpp calls whose work evicts the CPU caches;
    numpy's dispatch costs ~17 us there (measured), so this is plain Python floats (~2 us)."""

    def __init__(self, target, planes: int, n_max: int, decay: float = 0.99, margin: float = 0.15,
                 first: int = 8, cooldown: int = 32) -> None:
        """decay: per-step forgetting of the histogram (0.99: about the last 100 steps count);
        margin: how much cheaper the best layout must be to switch; first / cooldown: steps
        before the first decision and between changes."""
        self.target = target  # the Context whose layout this controls
        self.planes, self.n_max = planes, n_max
        self.decay, self.margin = decay, margin
        self.first, self.cooldown = first, cooldown
        self.lead = default_lead(planes)
        self.changes = 0
        self.steps = 0
        self._since_change = 0
        # Forgetting without touching every bin each step: step t adds weight decay**-t, which
        # keeps every ratio between bins (all a decision needs) equal to the decayed histogram's.
        self._gain = 1.0
        self._hist = [0.0] * (n_max + 1)
        self._costs = [0.0] * (planes - 1)  # expected replay cost of lead 0..planes-2, same scale
        covered = [covered_accepts(planes, lead, n_max) for lead in range(planes - 1)]
        # _cost_of[a][lead]: the replay cost accepted count a incurs under that lead (0: kept)
        self._cost_of = [[0.0 if a in kept else replay_cost(a) for kept in covered] for a in range(n_max + 1)]

    @property
    def hist(self) -> np.ndarray:
        """The decayed histogram of accepted counts (the most recent step counts 1)."""
        return np.asarray(self._hist) / (self._gain * self.decay) if self.steps else np.zeros(self.n_max + 1)

    def start(self) -> None:
        self.target.set_rs_layout(self.planes, self.lead)

    def observe(self, accepted: int, drafted: int) -> None:
        """Record a full-size step's accepted count; switch the target's layout when it pays."""
        if drafted != self.n_max:
            return  # a shortened last block says nothing about the usual pattern
        g = self._gain
        self._hist[accepted] += g
        costs = self._costs
        for lead, c in enumerate(self._cost_of[accepted]):
            costs[lead] += g * c
        self._gain = g / self.decay
        if self._gain > 1e150:  # rescale long before float overflow; ratios are unchanged
            self._hist = [h / self._gain for h in self._hist]
            self._costs = [c / self._gain for c in costs]
            self._gain = 1.0
        self.steps += 1
        self._since_change += 1
        if self._since_change < (self.cooldown if self.changes else self.first):
            return
        costs = self._costs
        best = min(range(len(costs)), key=costs.__getitem__)
        if costs[best] < (1 - self.margin) * costs[self.lead]:
            self.lead = best
            self.changes += 1
            self._since_change = 0
            self.target.set_rs_layout(self.planes, best)


def layout_words(target, options: PlaneOptions, n_max: int, auto: "AutoLead | None") -> str:
    """A hybrid target's recurrent-state layout in words, for stats lines."""
    planes = options.n_planes(n_max)
    if not options.capped(n_max):
        return f"{planes} planes (uncapped)"
    if auto is not None:
        return f"{planes} planes, lead auto (now {auto.lead}, {auto.changes} changes)"
    kept = sorted(k - 1 for k in target.rs_kept_counts(n_max + 1) if k >= 1)
    return f"{planes} planes, lead {options.lead} (keeps accepted {kept})"
