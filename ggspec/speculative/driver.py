"""The one loop that decodes many prompts on an Engine: admit while a slot is free, step, hand out tokens.

`drive(engine, requests)` is a generator: it adds each `Request` to the engine as soon as a slot is
free (continuous batching: in the requests' order; the first that does not fit waits, and those
behind it), runs one `Engine.step` after another, and yields one `Event` per sequence per step
with the tokens it committed. Closing the generator early (Ctrl-C, a caller that stops reading)
cancels the sequences it started, so their slots are free for the next use of the engine.

`ggspec run` (console.run) and `ggspec bench` (bench.runner) decode through `drive`. The server's
scheduler runs the engine on its own thread, fed by an HTTP queue, and sends each prompt's first
tokens before the step's transaction (Engine.prefill): it keeps its own loop and admits a
Request with `Engine.add`. Distill's capture does not use an Engine at all (it decodes groups of prompts on
a raw context with layer-input extraction), so it has no loop to share.

One sequence at a time, thin generators over the same engine, yielding each step with its stats:
`generate_spec` decodes speculatively (output equals `generate_greedy`'s token for token);
`generate_greedy` is the plain baseline (`--no-spec`) through the same engine and caches;
`decode_plain` runs that baseline to the end, for its text and its speed (`decode_one` either way).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ggspec.errors import InputError
from ggspec.speculative.request import Request
from ggspec.speculative.sampling import DEFAULT_SEED
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.stats import Step


@dataclass(frozen=True, slots=True)
class Event:
    """One sequence's share of one engine step."""

    tag: object
    seq: Sequence  # the engine's sequence: its tokens and stats so far
    step: Step  # what this step committed for it (tokens, kind, timings)
    finished: bool  # the sequence is done: this is its last event
    calls: int  # llama.cpp calls of the whole engine step (all its sequences)
    verified: int  # sequences whose drafts the step's transaction verified together (0 for a prefill)

    @property
    def tokens(self) -> list[int]:
        return self.step.tokens


def request_seed(seed: int, i: int) -> int | None:
    """Prompt i's seed when several prompts share one: seed + i, so each draws its own tokens and
    a rerun draws the same ones; llama.cpp's default seed (a random one) stays random per prompt."""
    return None if seed == DEFAULT_SEED else (seed + i) % 2**32


def admit(engine, pending: deque[Request]) -> list[Sequence]:
    """Start the requests at the front of `pending` while the engine has a free slot for them."""
    started = []
    while pending and engine.can_add(pending[0].prompt, pending[0].n_predict):
        started.append(engine.add(pending.popleft()))
    return started


def step_events(engine) -> list[Event]:
    """One engine step, as one Event per result (a newly joined sequence may have two: its prefill
    and its first transaction); a finished sequence's last event says so."""
    calls = engine.stats.calls
    results = engine.step()
    calls = engine.stats.calls - calls
    verified = sum(1 for _, step in results if step.kind != "prefill")
    last = {seq: k for k, (seq, _) in enumerate(results)}
    for seq in last:
        if seq.failure is not None:  # (the engine went on without it; a caller of this driver
            raise seq.failure        # hears of it as before, as the error it is)
    return [Event(seq.tag, seq, step, seq.done and last[seq] == k, calls, verified)
            for k, (seq, step) in enumerate(results)]


def drive(engine, requests: Iterable[Request]) -> Iterator[Event]:
    """Decode every request on `engine`, as many at a time as it has slots; yields each step's
    events in the engine's order. Closing the generator cancels what it started and did not finish."""
    pending = deque(requests)
    started: list[Sequence] = []
    try:
        while pending or engine.active:
            started += admit(engine, pending)
            yield from step_events(engine)
    finally:
        for seq in started:
            if not seq.done:
                engine.cancel(seq)


# --- one sequence at a time ----------------------------------------------------------------------


@contextmanager
def proposing(engine, proposer):
    """Let `proposer` (e.g. a ForcedAcceptance around the engine's own) draft for a while."""
    if proposer is None:
        yield
        return
    own = engine.proposer
    engine.proposer = proposer
    try:
        yield
    finally:
        engine.proposer = own


def _one(engine, seq) -> Iterator[Step]:
    try:
        while not seq.done:
            for s, step in engine.step():
                if s is seq:
                    if seq.failure is not None:
                        raise seq.failure
                    yield step
    finally:
        engine.cancel(seq)  # an abandoned generator frees its slot (nothing to do once closed)


def generate_spec(engine, prompt, n_predict: int, *, ignore_eos: bool = False,
                  proposer=None) -> Iterator[Step]:
    """Speculative decoding of one prompt on an otherwise idle engine."""
    if not engine.speculative:
        raise InputError("the pair has no draft method, so it cannot decode speculatively", field="draft")
    with proposing(engine, proposer):
        seq = engine.add(Request(prompt, n_predict, ignore_eos=ignore_eos))
        yield from _one(engine, seq)


def generate_greedy(engine, prompt, n_predict: int, *, record_margins: bool = False,
                    ignore_eos: bool = False, grammar: str | None = None) -> Iterator[Step]:
    """Plain greedy decoding, one target decode per token (under `grammar`, GBNF). With
    `record_margins`, each step carries the target's top-2 logit margin of its token (the
    losslessness gate's tie check)."""
    seq = engine.add(Request(prompt, n_predict, ignore_eos=ignore_eos, speculate=False, record_margins=record_margins,
                     grammar=grammar))
    yield from _one(engine, seq)


def decode_plain(engine, prompt, n_predict: int, *, ignore_eos: bool = False, seed: int | None = None):
    """Plain decoding of one prompt to the end, with the engine's sampler (greedy at
    temperature 0), on an otherwise idle engine: the finished Sequence (its tokens and stats)."""
    return decode_one(engine, prompt, n_predict, speculate=False, ignore_eos=ignore_eos, seed=seed)


def decode_one(engine, prompt, n_predict: int, *, speculate: bool = True, ignore_eos: bool = False,
               seed: int | None = None, grammar: str | None = None):
    """One prompt decoded to the end (speculatively unless `speculate` is False, under `grammar`)
    on an otherwise idle engine: the finished Sequence."""
    seq = engine.add(Request(prompt, n_predict, ignore_eos=ignore_eos, speculate=speculate, seed=seed, grammar=grammar))
    for _ in _one(engine, seq):
        pass
    return seq
