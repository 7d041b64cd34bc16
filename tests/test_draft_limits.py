"""A sequence's own draft limits (DraftLimits: a server request's `speculative.n_max` /
`n_min`), on the real build: sequences with different limits share each step, every one decodes
the plain greedy text, and each verifies only drafts within its own limits."""

from __future__ import annotations

import pytest
from helpers.drafts import greedy
from helpers.pairs import CPP_CTX, DRAFT, STACK, TARGET

from ggspec.errors import InputError
from ggspec.speculative.driver import drive
from ggspec.speculative.engine import Engine, Serving
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.request import DraftLimits, Request

N = 40
LIMITS = [None, DraftLimits(2), DraftLimits(6, 4), DraftLimits(0)]


def test_sequences_with_their_own_limits_share_steps_and_stay_lossless():
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=6, parallel=len(LIMITS), ctx=CPP_CTX)) as e:
        prompt = e.target_model.tokenize(STACK)
        want = greedy(e, prompt, N)
        got: dict[int, list[int]] = {i: [] for i in range(len(LIMITS))}
        verified_together = 0
        steps: dict[int, list] = {i: [] for i in range(len(LIMITS))}
        for ev in drive(e, [Request(prompt, N, tag=i, ignore_eos=True, limits=lim) for i, lim in enumerate(LIMITS)]):
            got[ev.tag] += ev.tokens
            steps[ev.tag].append(ev.step)
            verified_together = max(verified_together, ev.verified)
    assert all(tokens == want for tokens in got.values())
    assert verified_together == len(LIMITS)  # one transaction for all of them
    drafted = {i: [s.drafted for s in steps[i] if s.kind != "prefill"] for i in steps}
    assert max(drafted[0]) == 6 and max(drafted[1]) == 2  # the engine's length, and a bound below it
    assert all(d == 0 or d >= 4 for d in drafted[2]) and max(drafted[2]) == 6  # no draft shorter than 4
    assert not any(drafted[3])  # n_max 0: plain


@pytest.mark.parametrize("limits, field", [(DraftLimits(7), "n_max"), (DraftLimits(-1), "n_max"),
                                           (DraftLimits(3, 4), "n_min"), (DraftLimits(3, -1), "n_min")])
def test_limits_beyond_the_engines_are_refused(limits, field):
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=6, ctx=CPP_CTX)) as e:
        with pytest.raises(InputError) as exc:
            e.add(Request(e.target_model.tokenize("x = 1"), 4, limits=limits))
        assert exc.value.field == field and not e.active


# --- the types and the confidence cut-off of one sequence --------------------------------------------

TYPED = [None, DraftLimits(6, types=("ngram-cache",)), DraftLimits(6, types=("ngram-mod", "draft-simple")),
         DraftLimits(6, p_min=0.95), DraftLimits(6, types=("draft-simple",), p_min=0.0)]


def test_sequences_draft_with_their_own_types_and_cut_off_in_one_step():
    """An engine holding the n-gram types on standby (a server's): a sequence naming ngram-simple
    drafts only what the text repeats, one naming draft-simple with its own cut-off drafts as the
    engine does without it; a high cut-off drafts less. Every one decodes the plain greedy text,
    all in the same verify."""
    cfg = PairConfig(TARGET, DRAFT, n_max=6, parallel=len(TYPED), ctx=CPP_CTX, p_min=0.5, calibrate=False)
    with Engine(Models(cfg), cfg, serving=Serving(standby_types=True)) as e:
        e._owns_models = True
        assert e.request_types[0] == "ngram-simple" and e.request_types[-1] == "draft-simple"
        assert e.proposer.name == "draft-simple"  # the standby types are not the engine's own
        prompt = e.target_model.tokenize(STACK)
        want = greedy(e, prompt, N)
        got: dict[int, list[int]] = {i: [] for i in range(len(TYPED))}
        drafted = {i: 0 for i in range(len(TYPED))}
        together = 0
        for ev in drive(e, [Request(prompt, N, tag=i, ignore_eos=True, limits=lim) for i, lim in enumerate(TYPED)]):
            got[ev.tag] += ev.tokens
            drafted[ev.tag] += ev.step.drafted if ev.step.kind != "prefill" else 0
            together = max(together, ev.verified)
    assert all(tokens == want for tokens in got.values())
    assert together == len(TYPED)
    assert drafted[1] > 0 and drafted[0] > 0
    assert drafted[3] < drafted[0] < drafted[4]  # cut-offs 0.95 < the engine's 0.5 < none


def test_a_sequence_naming_a_type_the_engine_lacks_is_refused():
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=6, ctx=CPP_CTX, calibrate=False)) as e:
        for limits, field in [(DraftLimits(3, types=("ngram-simple",)), "spec_type"),
                              (DraftLimits(3, types=()), "spec_type"), (DraftLimits(3, p_min=1.5), "p_min")]:
            with pytest.raises(InputError) as exc:
                e.add(Request(e.target_model.tokenize("x = 1"), 4, limits=limits))
            assert exc.value.field == field and not e.active
        assert e.request_types == ("draft-simple",)
