"""One generation request inside the engine: its tokens, position, budget and statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ggspec.runtime.grammar import Grammar
from ggspec.speculative.proposer import Draft
from ggspec.speculative.sampling import SamplerSettings
from ggspec.speculative.stats import RunStats

GREEDY = SamplerSettings(temp=0.0)


@dataclass(frozen=True)
class DraftLimits:
    """One sequence's own speculation within its engine's (a server request's `speculative.*`):
    drafts of at most n_max tokens (0: it decodes plainly) and none shorter than n_min (a shorter
    draft is not verified, as llama.cpp's --spec-draft-n-min; the engine's own n_min still applies
    where its drafter has one); `p_min`, the confidence cut-off of its drafts (None: the engine's);
    `types`, the speculative types that may draft for it (None: the engine's own; a server also
    holds the n-gram types for the requests that name them: Engine.request_types)."""

    n_max: int
    n_min: int = 0
    p_min: float | None = None
    types: tuple[str, ...] | None = None

    def cut(self, draft: Draft) -> Draft:
        draft = draft.head(self.n_max)
        return draft if len(draft) >= self.n_min else Draft.empty()


@dataclass(eq=False)
class Sequence:
    """A prompt being continued. `seq_id` is the llama.cpp sequence (cache slot) it occupies
    while it is active; the engine frees it when the sequence finishes or is cancelled."""

    seq_id: int
    prompt: np.ndarray  # (n_prompt,) int32
    n_predict: int  # token budget
    ignore_eos: bool = False
    tag: object = None  # the caller's label (a prompt index, a request id)
    speculate: bool = True  # False: plain decoding for this sequence (the proposer never sees it)
    plain_by_cost: bool = False  # it decodes plainly because no draft length pays (its steps: k = 0)
    record_margins: bool = False  # keep the target's top-2 margin of each plain step (the oracle)
    limits: DraftLimits = DraftLimits(1 << 30)  # its own bounds on a draft's length (the engine's: no bound)
    grammar: Grammar | None = None  # what its tokens must follow (runtime.Grammar, at the state after them)
    n_probs: int = 0  # report each committed token's probability and the n likeliest (Step.probs)
    limit: int = 0  # positions it may use (prompt, budget, one verify block), set by the engine
    n_cached: int = 0  # leading prompt tokens its slot's cells held already (the prompt cache)
    tokens: list[int] = field(default_factory=list)  # generated (committed) tokens
    history: list[int] = field(default_factory=list)  # prompt + committed tokens (n-gram lookups)
    pos: int = 0  # position of id_last, which the target has not decoded yet
    id_last: int = -1  # the last committed token
    done: bool = False
    cancelled: bool = False
    stats: RunStats = field(default_factory=RunStats)
    sampling: SamplerSettings = GREEDY  # how its tokens are chosen (temperature 0: greedy)
    seed: int = 0  # sampling: every random draw derives from (seed, purpose, position)
    # sampled with a seed given: its text must not depend on timings (no choice made from costs
    # changes how its tokens are drawn)
    seeded: bool = False

    def __post_init__(self) -> None:
        self.prompt = np.ascontiguousarray(self.prompt, dtype=np.int32)
        if not self.history:
            self.history = [int(t) for t in self.prompt]

    @property
    def left(self) -> int:
        """Tokens still allowed by the budget."""
        return self.n_predict - len(self.tokens)

    @property
    def started(self) -> bool:
        """Whether its prompt has been decoded (id_last is known)."""
        return self.id_last >= 0

    def take(self, tokens: list[int], is_eog) -> list[int]:
        """Append a step's committed tokens, cut at the budget or after an end-of-generation token
        (`is_eog`), and mark the sequence done where it ends; returns those kept. `pos` must
        already be past them."""
        kept = []
        for t in tokens[:self.left]:
            kept.append(t)
            if self.grammar is not None:
                self.grammar.accept(t)
            if not self.ignore_eos and is_eog(t):
                self.done = True
                break
        self.tokens += kept
        self.history += kept
        self.id_last = tokens[-1]
        if self.left <= 0 or self.pos >= self.limit:
            self.done = True
        return kept

    def p_min(self, default: float) -> float:
        """Its drafts' confidence cut-off: its own, else its proposer's (`default`)."""
        return default if self.limits.p_min is None else self.limits.p_min

    def rng(self, purpose: int) -> Draws:
        """The uniform draws of one step of one kind (0: drafting, 1: verifying), keyed by the
        sequence's seed and position: the same seed gives the same draws whatever other sequences
        run beside it and however many draws earlier steps made."""
        return Draws(self.seed, purpose, self.pos)


_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    """splitmix64's finaliser: a 64-bit mix with full avalanche."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK
    return z ^ (z >> 31)


class Draws:
    """A counter-based stream of uniforms in [0, 1) for one (seed, purpose, position): splitmix64
    over the key and a counter, a few microseconds a draw (numpy's generators take tens of
    microseconds to create, and a step needs a fresh one per sequence)."""

    __slots__ = ("_i", "_key")

    def __init__(self, seed: int, purpose: int, pos: int) -> None:
        self._key = _mix(_mix(_mix(seed & _MASK) ^ purpose) ^ pos)
        self._i = 0

    def random(self) -> float:
        self._i += 1
        return (_mix((self._key + self._i * 0x9E3779B97F4A7C15) & _MASK) >> 11) * (1.0 / (1 << 53))
