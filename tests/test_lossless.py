"""Losslessness: speculative greedy output equals plain greedy output, token for token.

Run on the real patched build with tiny random-weight pairs (dense qwen3 and hybrid qwen35),
with the real DFlash draft and with forced acceptance lengths covering 0..n_max.
The fixtures have wide logit margins, so every prompt must match exactly; at a divergence the
report gives the target's own top-2 margin there (see ggspec.spec.oracle).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import PROMPTS
from ggspec.runtime import ContextParams
from ggspec.spec.forced import ForcedAcceptance, cycle_lengths
from ggspec.spec.loop import generate_greedy, generate_spec
from ggspec.spec.oracle import compare
from ggspec.spec.pair import PairConfig, SpecPair
from ggspec.spec.stats import summarize

N_PREDICT = 128
N_MAX = 7  # the fixtures' block size is 8


def _open(pair, build_info, n_max=N_MAX) -> SpecPair:
    cfg = PairConfig(target=pair.target, draft=pair.draft, dflash=True, n_max=n_max,
                     ctx=ContextParams(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=1,
                                       type_k="f32", type_v="f32", flash_attn="off"))
    return SpecPair(cfg)


def _plain(sp: SpecPair, prompt: np.ndarray) -> tuple[list[int], list[float]]:
    sp.reset()
    tokens, margins = [], []
    for step in generate_greedy(sp.target, prompt, N_PREDICT, record_margins=True, ignore_eos=True):
        tokens += step.tokens
        margins += step.margins
    return tokens, margins


def _spec(sp: SpecPair, prompt: np.ndarray, proposer) -> tuple[list[int], list]:
    sp.reset()
    steps = list(generate_spec(sp.target, proposer, prompt, N_PREDICT, sp.n_max, ignore_eos=True))
    return [t for s in steps for t in s.tokens], steps


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_speculative_equals_greedy(kind, request, build_info):
    pair = request.getfixturevalue(f"{kind}_pair")
    with _open(pair, build_info) as sp:
        assert sp.target_model.is_recurrent == (kind == "hybrid")
        failures, compared = [], 0
        forced_hist = np.zeros(N_MAX + 1, dtype=int)
        for i, text in enumerate(PROMPTS):
            prompt = sp.target_model.tokenize(text)
            plain, margins = _plain(sp, prompt)
            compared += len(plain)

            real, _ = _spec(sp, prompt, sp.proposer)
            div = compare(plain, margins, real)
            if div is not None:
                failures.append(f"prompt {i} (DFlash draft): {div.describe()}")

            # start each prompt's cycle at a different length so steps meet every length mid-run
            lengths = itertools.islice(cycle_lengths(N_MAX), i % (N_MAX + 1), None)
            forced = ForcedAcceptance(sp.proposer, np.concatenate([prompt, plain]), lengths,
                                      sp.target_model.n_vocab)
            got, steps = _spec(sp, prompt, forced)
            div = compare(plain, margins, got)
            if div is not None:
                failures.append(f"prompt {i} (forced acceptance): {div.describe()}")
            hist = summarize(steps).accept_hist
            forced_hist[:len(hist)] += hist
        assert not failures, "\n".join(failures)
        assert compared == len(PROMPTS) * N_PREDICT, f"only {compared} tokens compared"
        assert (forced_hist > 0).all(), f"some acceptance length never happened: {forced_hist}"


def test_gate_catches_an_off_by_one_accept(dense_pair, build_info, monkeypatch):
    """The gate has teeth: accepting one draft too many changes the output, and the margin
    there classifies it as a real divergence, not a near-tie."""
    with _open(dense_pair, build_info) as sp:
        prompt = sp.target_model.tokenize(PROMPTS[0])
        plain, margins = _plain(sp, prompt)
        import ggspec.spec.loop as loop

        real_accept = loop.accept_greedy
        monkeypatch.setattr(loop, "accept_greedy", lambda d, t: min(len(d), real_accept(d, t) + 1))
        forced = ForcedAcceptance(sp.proposer, np.concatenate([prompt, plain]),
                                  cycle_lengths(N_MAX), sp.target_model.n_vocab)
        got, _ = _spec(sp, prompt, forced)
        div = compare(plain, margins, got)
        assert div is not None, "a missing rollback went unnoticed"
        assert not div.benign, div.describe()
