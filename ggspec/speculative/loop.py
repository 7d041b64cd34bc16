"""One sequence at a time: thin generators over the engine, yielding each step with its stats.

`generate_spec` decodes speculatively (output equals `generate_greedy`'s token for token);
`generate_greedy` is the plain baseline (`--no-spec`) through the same engine and caches;
`decode_plain` runs that baseline to the end, for its text and its speed (`decode_one` either way).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ggspec.errors import InputError
from ggspec.speculative.engine import Engine
from ggspec.speculative.stats import Step


@contextmanager
def proposing(engine: Engine, proposer):
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


def _one(engine: Engine, seq) -> Iterator[Step]:
    try:
        while not seq.done:
            for s, step in engine.step():
                if s is seq:
                    yield step
    finally:
        engine.cancel(seq)  # an abandoned generator frees its slot (nothing to do once closed)


def generate_spec(engine: Engine, prompt, n_predict: int, *, ignore_eos: bool = False,
                  proposer=None) -> Iterator[Step]:
    """Speculative decoding of one prompt on an otherwise idle engine."""
    if not engine.speculative:
        raise InputError("the pair has no draft method, so it cannot decode speculatively", field="draft")
    with proposing(engine, proposer):
        seq = engine.add(prompt, n_predict, ignore_eos=ignore_eos)
        yield from _one(engine, seq)


def generate_greedy(engine: Engine, prompt, n_predict: int, *, record_margins: bool = False,
                    ignore_eos: bool = False, grammar: str | None = None) -> Iterator[Step]:
    """Plain greedy decoding, one target decode per token (under `grammar`, GBNF). With
    `record_margins`, each step carries the target's top-2 logit margin of its token (the
    losslessness gate's tie check)."""
    seq = engine.add(prompt, n_predict, ignore_eos=ignore_eos, speculate=False, record_margins=record_margins,
                     grammar=grammar)
    yield from _one(engine, seq)


def decode_plain(engine: Engine, prompt, n_predict: int, *, ignore_eos: bool = False, seed: int | None = None):
    """Plain decoding of one prompt to the end, with the engine's sampler (greedy at
    temperature 0), on an otherwise idle engine: the finished Sequence (its tokens and stats)."""
    return decode_one(engine, prompt, n_predict, speculate=False, ignore_eos=ignore_eos, seed=seed)


def decode_one(engine: Engine, prompt, n_predict: int, *, speculate: bool = True, ignore_eos: bool = False,
               seed: int | None = None, grammar: str | None = None):
    """One prompt decoded to the end (speculatively unless `speculate` is False, under `grammar`)
    on an otherwise idle engine: the finished Sequence."""
    seq = engine.add(prompt, n_predict, ignore_eos=ignore_eos, speculate=speculate, seed=seed, grammar=grammar)
    for _ in _one(engine, seq):
        pass
    return seq
