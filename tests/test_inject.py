"""Injection modes: pruned deferral (default), deferral of every row, upstream's immediate injection.
Draft proposals and final output must be bit-identical in every mode."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import PROMPTS

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.runtime import ContextParams
from ggspec.speculative.driver import generate_greedy, generate_spec
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.types.draft_type import INJECT_MODES

N_MAX, N_PREDICT = 7, 96
CTX = ContextParams(n_ctx=1024, n_batch=256, n_ubatch=256, type_k="f32", type_v="f32", flash_attn="off")


class Recording(ForcedAcceptance):
    """Forced acceptance that also records what the real draft proposed at each step."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.proposals: list[list[int]] = []

    def propose(self, seqs, n):
        real = self.inner.propose(seqs, n)
        self.proposals.append([d.tokens.tolist() for d in real])
        self.inner.propose = lambda *a: real  # the forced proposal below reuses this one draft
        try:
            return super().propose(seqs, n)
        finally:
            del self.inner.propose


def _run(pair, mode: str, texts):
    cfg = PairConfig(target=pair.target, draft=pair.draft, fixed_block=True, n_max=N_MAX, ctx=CTX, inject=mode)
    outputs, proposals = [], []
    with Engine.open(cfg) as sp:
        for i, text in enumerate(texts):
            prompt = sp.target_model.tokenize(text)
            sp.reset()
            ref = [t for s in generate_greedy(sp, prompt, N_PREDICT, ignore_eos=True) for t in s.tokens]
            sp.reset()
            lengths = itertools.islice(cycle_lengths(N_MAX), i, None)
            rec = Recording(sp.proposer, np.concatenate([prompt, ref]), lengths, sp.target_model.n_vocab)
            out = [t for s in generate_spec(sp, prompt, N_PREDICT, proposer=rec, ignore_eos=True) for t in s.tokens]
            assert out == ref, f"{mode}: output differs from plain greedy on prompt {i}"
            outputs.append(out)
            proposals.append(rec.proposals)
    return outputs, proposals


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_modes_give_identical_drafts_and_output(kind, request, build_info):
    pair = request.getfixturevalue(f"{kind}_pair")
    texts = PROMPTS[:5]
    results = {mode: _run(pair, mode, texts) for mode in INJECT_MODES}
    base_out, base_props = results["pruned"]
    for mode, (out, props) in results.items():
        assert out == base_out, mode
        assert props == base_props, f"{mode}: draft proposals differ from pruned deferral"
    assert sum(len(p) for p in base_props) > 50


def test_trained_pair_drafts_identical_across_modes(build_info):
    """On the trained pair the drafts carry information: same proposals in every mode."""
    from ggspec.catalogue.pairs import get_entry, resolve

    files = resolve(get_entry("tiny-coder"))
    results = {mode: _run(files, mode, PROMPTS[:3]) for mode in INJECT_MODES}
    assert results["immediate"][1] == results["deferred"][1] == results["pruned"][1]
