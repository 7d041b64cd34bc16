"""One request inside the engine: how far it got (tokens, position, statistics), its request whole."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ggspec.errors import GGSpecError
from ggspec.runtime.grammar import Grammar, GrammarDeadEnd
from ggspec.speculative.request import DraftLimits, Request
from ggspec.speculative.sampling import SamplerSettings
from ggspec.speculative.stats import RunStats

GREEDY = SamplerSettings(temp=0.0)


@dataclass(eq=False)
class Sequence:
    """A request being continued (`request`: what was asked, whole; the rest is how far it got).
    `seq_id` is the llama.cpp sequence (cache slot) it occupies while it is active; the engine
    frees it when the sequence finishes or is cancelled. `limits`, `grammar`, `sampling` and
    `seed` are the request's as the engine resolved them (its defaults, a compiled grammar, a
    concrete seed)."""

    seq_id: int
    request: Request
    speculate: bool = True  # False: plain decoding for this sequence (the proposer never sees it)
    plain_by_cost: bool = False  # it decodes plainly because no draft length pays (its steps: k = 0)
    limits: DraftLimits = DraftLimits(1 << 30)  # its own bounds on a draft's length (the engine's: no bound)
    grammar: Grammar | None = None  # what its tokens must follow (runtime.Grammar, at the state after them)
    limit: int = 0  # positions it may use (prompt, budget, one verify block), set by the engine
    n_cached: int = 0  # leading prompt tokens its slot's cells held already (the prompt cache)
    prefilled: int = 0  # prompt positions its cells hold so far (n_cached, then each prefill chunk's end)
    t_prefill: float = 0.0  # seconds its prefill chunks took so far (handing rows to the draft included)
    t_prefill_inject: float = 0.0  # of which handing captured rows to the draft
    tokens: list[int] = field(default_factory=list)  # generated (committed) tokens
    history: list[int] = field(default_factory=list)  # prompt + committed tokens (n-gram lookups)
    pos: int = 0  # position of id_last, which the target has not decoded yet
    id_last: int = -1  # the last committed token
    done: bool = False
    cancelled: bool = False
    failure: GGSpecError | None = None  # why it ended where it could not go on (its grammar's dead end)
    stats: RunStats = field(default_factory=RunStats)
    sampling: SamplerSettings = GREEDY  # how its tokens are chosen (temperature 0: greedy)
    seed: int = 0  # sampling: every random draw derives from (seed, purpose, position)
    # sampled with a seed given: its text must not depend on timings (no choice made from costs
    # changes how its tokens are drawn)
    seeded: bool = False
    t_first: float | None = None  # when its first token was committed (perf_counter; t_max_predict_ms)
    line_ended: bool = False  # a committed token held a newline (t_max_predict_ms)

    def __post_init__(self) -> None:
        self.prefilled = max(self.prefilled, self.n_cached)
        if not self.history:
            self.history = [int(t) for t in self.prompt]

    # what was asked, as asked (read from the request: never a second copy)
    @property
    def prompt(self) -> np.ndarray:
        return self.request.prompt

    @property
    def n_predict(self) -> int:
        return self.request.n_predict

    @property
    def ignore_eos(self) -> bool:
        return self.request.ignore_eos

    @property
    def tag(self) -> object:
        return self.request.tag

    @property
    def record_margins(self) -> bool:
        return self.request.record_margins

    @property
    def n_probs(self) -> int:
        return self.request.n_probs

    @property
    def left(self) -> int:
        """Tokens still allowed by the budget."""
        return self.n_predict - len(self.tokens)

    def fail(self, error: GGSpecError) -> None:
        """End this sequence, alone, on an error of its own (the step goes on for the others)."""
        self.failure, self.done = error, True

    @property
    def started(self) -> bool:
        """Whether its prompt has been decoded (id_last is known)."""
        return self.id_last >= 0

    def take(self, tokens: list[int], vocab) -> list[int]:
        """Append a step's committed tokens, cut at the budget or after an end-of-generation token,
        and mark the sequence done where it ends; returns those kept. `pos` must already be past
        them. `vocab` (the target Model) says what a token is: `is_eog(t)`, `token_bytes(t)`."""
        if self.t_first is None:
            self.t_first = time.perf_counter()
        kept = []
        for t in tokens[:self.left]:
            if self.grammar is not None:
                try:
                    self.grammar.accept(t)
                except GrammarDeadEnd as exc:  # (the verifier checks first: a last line of defence)
                    self.fail(exc)
                    break
            kept.append(t)
            if not self.ignore_eos and vocab.is_eog(t):
                self.done = True
                break
        self.tokens += kept
        self.history += kept
        self.id_last = tokens[-1]
        if self.left <= 0 or self.pos >= self.limit or self._out_of_time(kept, vocab):
            self.done = True
        return kept

    def _out_of_time(self, kept: list[int], vocab) -> bool:
        """llama-server's t_max_predict_ms: a line has ended and the time since its first token
        is past the request's limit."""
        limit_ms = self.request.t_max_predict_ms
        if limit_ms <= 0:
            return False
        self.line_ended = self.line_ended or any(b"\n" in vocab.token_bytes(t) for t in kept)
        return self.line_ended and (time.perf_counter() - self.t_first) * 1000.0 > limit_ms

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
