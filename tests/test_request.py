"""One request record from the edge to the sequence (speculative/request.py): checked on its own
and by the engine that takes it, the engine's defaults filled in, kept whole by its sequence; and
one per-request option that acts in the engine, llama-server's t_max_predict_ms, on the real build."""

from __future__ import annotations

import pytest
from helpers.pairs import CPP_CTX, DRAFT, STACK, TARGET

from ggspec.errors import InputError
from ggspec.speculative.driver import drive
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import DraftLimits, Request
from ggspec.speculative.sampling import SamplerSettings

N = 48


@pytest.fixture(scope="module")
def engine():
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=4, parallel=2, ctx=CPP_CTX)) as eng:
        yield eng


@pytest.mark.parametrize("request_, field", [
    (Request([1, 2, 3], 0), "n_predict"),
    (Request([1, 2, 3], 8, n_probs=-1), "n_probs"),
    (Request([1, 2, 3], 8, t_max_predict_ms=1.5), "t_max_predict_ms"),
    (Request([1, 2, 3], 8, limits=DraftLimits(3, 4)), "n_min"),
    (Request([1, 2, 3], 8, limits=DraftLimits(3, p_min=2.0)), "p_min"),
    (Request([1, 2, 3], 8, limits=DraftLimits(5)), "n_max"),  # beyond this engine's n_max (4)
    (Request([1, 2, 3], 8, sampling=SamplerSettings(top_p=2.0)), "top_p"),
])
def test_a_bad_request_is_refused_naming_its_field(engine, request_, field):
    with pytest.raises(InputError) as exc:
        engine.check(request_)
    assert exc.value.field == field
    with pytest.raises(InputError):
        engine.add(request_)
    assert not engine.active


def test_the_engine_fills_its_defaults_and_the_sequence_keeps_the_request_whole(engine):
    asked = Request(engine.target_model.tokenize(STACK).tolist(), 4, tag="a", ignore_eos=True)
    checked = engine.check(asked)
    assert checked.sampling == engine.sampling and checked.limits == DraftLimits(engine.n_max)
    assert checked.prompt.dtype.name == "int32" and asked.limits is None  # (the request as asked is unchanged)
    seq = engine.add(asked)
    try:
        assert seq.request == checked and seq.tag == "a" and seq.n_predict == 4 and seq.limits == checked.limits
    finally:
        engine.cancel(seq)


def test_t_max_predict_ms_stops_at_the_first_line_end_past_the_limit(engine):
    """llama-server's rule: once a generated token has held a newline and the time since the first
    token is past the limit, the request ends (a prefix of its unlimited text, cut after that step)."""
    prompt = engine.target_model.tokenize(STACK)
    unlimited = [t for ev in drive(engine, [Request(prompt, N, ignore_eos=True)]) for t in ev.tokens]
    lines = [i for i, t in enumerate(unlimited) if b"\n" in engine.target_model.token_bytes(t)]
    assert lines and lines[0] < N - 8, "the test needs a text with an early line end"
    events = list(drive(engine, [Request(prompt, N, ignore_eos=True, t_max_predict_ms=1)]))
    limited = [t for ev in events for t in ev.tokens]
    assert unlimited[:len(limited)] == limited and events[-1].finished
    assert lines[0] < len(limited) < N  # (a step of the tiny pair takes about a millisecond)
    far = [t for ev in drive(engine, [Request(prompt, N, ignore_eos=True, t_max_predict_ms=10**9)]) for t in ev.tokens]
    assert far == unlimited
