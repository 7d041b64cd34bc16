"""Speculative sampling's acceptance rule, in pure numpy: the committed tokens follow the target's
distribution whatever the draft proposes (chi-square tests over many draws), and the test rejects
deliberately wrong rules, so it can fail."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from ggspec.speculative.proposer import Draft
from ggspec.speculative.sampling import Candidates, SamplerSettings, distribution, sample
from ggspec.speculative.verifier import Outcome, RejectionVerifier

V = 6
DRAWS = 20000
P = np.array([[0.30, 0.25, 0.20, 0.15, 0.07, 0.03],   # target at position 0
              [0.05, 0.10, 0.40, 0.05, 0.30, 0.10],   # position 1
              [0.50, 0.10, 0.10, 0.10, 0.10, 0.10]])  # position 2 (the bonus row)
Q = np.array([[0.10, 0.10, 0.50, 0.10, 0.10, 0.10],   # a draft that disagrees with the target
              [0.05, 0.50, 0.05, 0.30, 0.05, 0.05]])


def sparse(dense: np.ndarray) -> Candidates:
    """Dense rows as Candidates, listed in a scrambled order (the rule must not rely on any)."""
    order = np.random.default_rng(7).permutation(dense.shape[1])
    return Candidates(np.broadcast_to(order, dense.shape), dense[:, order])


def _run(rule, q: np.ndarray | None, seed: int = 0) -> tuple[np.ndarray, float]:
    """Joint counts of the first two committed tokens (the second only counts when the first step
    committed at least two; otherwise a fresh step at position 1 would follow: simulated by the
    target alone), and the mean accepted count."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((V, V))
    accepted = 0
    for _ in range(DRAWS):
        if q is None:  # a point-mass draft: the draft's own greedy choices
            draft = Draft(np.array([2, 1], dtype=np.int32))
        else:
            draft = Draft(np.array([sample(q[0], rng.random()), sample(q[1], rng.random())], dtype=np.int32),
                          sparse(q))
        out = rule(sparse(P), draft, rng)
        accepted += out.accepted
        first = out.tokens[0]
        second = out.tokens[1] if len(out.tokens) > 1 else sample(P[1], rng.random())
        counts[first, second] += 1
    return counts, accepted / DRAWS


def _p_value(counts: np.ndarray) -> float:
    expected = np.outer(P[0], P[1]) * DRAWS
    keep = expected >= 5
    obs, exp = counts[keep], expected[keep]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.parametrize("q", [Q, None], ids=["sampled-draft", "point-mass-draft"])
def test_committed_tokens_follow_the_target(q):
    counts, tau = _run(RejectionVerifier.verify_one, q)
    assert _p_value(counts) > 0.01
    assert 0.2 < tau < 2  # drafts are accepted sometimes, rejected sometimes


def _resample_from_p(p, draft, rng):
    """Wrong: on a rejection, draw from p instead of the residual."""
    out = RejectionVerifier.verify_one(p, draft, rng)
    if out.accepted < len(draft):
        return Outcome(out.accepted, out.tokens[:-1] + [sample(P[out.accepted], rng.random())])
    return out


def _accept_with_p(p, draft, rng):
    """Wrong: accept with probability p(x) instead of min(1, p(x) / q(x))."""
    tokens = draft.tokens.tolist()
    for i, x in enumerate(tokens):
        if rng.random() >= P[i, x]:
            residual = np.maximum(P[i] - Q[i], 0.0)
            return Outcome(i, tokens[:i] + [sample(residual, rng.random())])
    return Outcome(len(tokens), tokens + [sample(P[len(tokens)], rng.random())])


@pytest.mark.parametrize("rule", [_resample_from_p, _accept_with_p])
def test_the_test_rejects_wrong_rules(rule):
    counts, _ = _run(rule, Q)
    assert _p_value(counts) < 1e-6


def test_the_verifier_applies_the_sampler_transforms():
    """Through RejectionVerifier.verify: logits rows, top-k 2 at temperature 1 -> only the two most
    likely tokens are ever committed, in proportion 0.6 : 0.4."""
    from types import SimpleNamespace

    logits = np.log(np.array([[0.6, 0.4, 1e-3, 1e-3], [0.6, 0.4, 1e-3, 1e-3]]))
    v = RejectionVerifier(SamplerSettings(temp=1.0, top_k=2, top_p=1.0, min_p=0.0))
    gen = np.random.default_rng(1)
    seq = SimpleNamespace(rng=lambda _purpose: gen)
    firsts = [v.verify(logits, [(seq, Draft(np.array([3], dtype=np.int32)), 0)])[0].tokens[0] for _ in range(4000)]
    assert set(firsts) == {0, 1}  # the draft's token 3 is outside top-k: always rejected
    assert np.mean(np.array(firsts) == 0) == pytest.approx(0.6, abs=0.03)
    assert distribution(logits, v.settings)[0, 2:].sum() == 0
