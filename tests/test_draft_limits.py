"""A sequence's own draft limits (DraftLimits: a server request's `speculative.n_max` /
`n_min`), on the real build: sequences with different limits share each step, every one decodes
the plain greedy text, and each verifies only drafts within its own limits."""

from __future__ import annotations

import pytest

from ggspec.errors import InputError
from ggspec.speculative.driver import Request, drive
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.sequence import DraftLimits
from helpers.drafts import greedy
from helpers.pairs import CPP_CTX, DRAFT, STACK, TARGET

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
            e.add(e.target_model.tokenize("x = 1"), 4, limits=limits)
        assert exc.value.field == field and not e.active
