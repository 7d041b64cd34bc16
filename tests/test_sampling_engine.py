"""Speculative sampling through the engine on the trained tiny pair: the joint distribution of the
first two sampled tokens equals plain sampling's (chi-square over many seeds, p > 0.01), a wrong
acceptance rule is rejected by the same test, and the same seed gives the same text at parallel 1
and 4. Statistical, not timed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.stats import draft_model_decoded, draws, p_value, plain_and_spec_draws

from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.errors import InputError
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.request import Request
from ggspec.speculative.sampling import SamplerSettings, sample
from ggspec.speculative.verifier import Outcome, RejectionVerifier

PROMPT = "import os\nimport sys\n\n\ndef main("
CTX = ContextParams(n_ctx=2048, n_threads=1, type_k="f32", type_v="f32", flash_attn="off")
SETTINGS = {
    "t0.7-defaults": SamplerSettings(temp=0.7),  # llama.cpp's top-k 40, top-p 0.95, min-p 0.05
    "t1.0-plain": SamplerSettings(temp=1.0, top_k=0, top_p=1.0, min_p=0.0),
    "t1.0-topk-topp": SamplerSettings(temp=1.0, top_k=20, top_p=0.9, min_p=0.0),
    # penalties and bias: the second token's row depends on the first (each row over its own history)
    "t1.0-penalties-bias": SamplerSettings(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, penalty_repeat=1.5,
                                           penalty_present=0.7, penalty_freq=0.3, logit_bias=((13, 1.5), (25, -3.0))),
}


@pytest.fixture(scope="module")
def coder():
    files = resolve(get_entry("tiny-coder"))
    cfg = PairConfig(target=files.target, draft=files.draft, n_max=7, ctx=CTX, parallel=8)
    with Models(cfg) as models:
        yield models, cfg


def _stepped(eng: Engine) -> None:
    assert eng.stats.steps > 0


@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_sampling_has_the_plain_distribution(name, coder):
    models, cfg = coder
    cfg = replace(cfg, sampling=SETTINGS[name])
    prompt = models.target.tokenize(PROMPT)
    plain, spec = plain_and_spec_draws(models, cfg, prompt, check=_stepped)
    assert len(plain) > 5, plain  # a real distribution, not a point mass
    p = p_value(plain, spec)
    assert p > 0.01, (p, plain.most_common(5), spec.most_common(5))


def test_p_min_cut_sampled_drafts_keep_the_distribution(coder):
    """--spec-draft-p-min on sampled DFlash drafts: shorter drafts (the cut-off bites), the same
    distribution (the cut looks at the draft only)."""
    models, cfg = coder
    cfg = replace(cfg, sampling=SETTINGS["t1.0-plain"], p_min=0.6)
    prompt = models.target.tokenize(PROMPT)
    plain, spec = plain_and_spec_draws(models, cfg, prompt)
    with Engine(models, replace(cfg, parallel=1)) as eng:  # how long the drafts are, one sequence
        seq = eng.add(Request(prompt, 64, ignore_eos=True, seed=3))
        list(eng.run())
        assert 0 < seq.stats.drafted < cfg.n_max * seq.stats.spec_steps
    assert p_value(plain, spec) > 0.01


@pytest.mark.parametrize("kind, name, p_min", [("draft-simple", "t0.7-defaults", 0.0), ("draft-simple", "t1.0-plain", 0.5),
                                               ("draft-eagle3", "t1.0-topk-topp", 0.0)])
def test_a_draft_models_sampled_drafts_keep_the_distribution(kind, name, p_min):
    """draft-simple and draft-eagle3: drafts drawn from the draft's own distribution (rejection
    sampling against it), also where p-min cuts them."""
    files = resolve(get_entry("tiny-coder-simple"))
    draft = files.draft if kind == "draft-simple" else files.target.parent / "tiny-coder-eagle3.gguf"
    cfg = PairConfig(target=files.target, draft=draft, n_max=4, ctx=CTX, parallel=8, p_min=p_min,
                     sampling=SETTINGS[name])
    with Models(cfg) as models:
        assert models.plan.kind == kind
        prompt = models.target.tokenize(PROMPT)
        plain, spec = plain_and_spec_draws(models, cfg, prompt, check=draft_model_decoded)
    assert p_value(plain, spec) > 0.01


class ResampleFromP(RejectionVerifier):
    """Wrong: at a rejection, draw the correction from p instead of the residual."""

    def verify(self, logits, spans):
        out = []
        for (seq, draft, row0), o in zip(spans, super().verify(logits, spans)):
            if o.accepted < len(draft):
                from ggspec.speculative.sampling import distribution

                p = distribution(logits[row0 + o.accepted], self.settings)
                o = Outcome(o.accepted, o.tokens[:-1] + [sample(p, seq.rng(7).random())])
            out.append(o)
        return out


def test_the_test_rejects_a_wrong_rule(coder):
    models, cfg = coder
    cfg = replace(cfg, sampling=SETTINGS["t1.0-plain"])
    prompt = models.target.tokenize(PROMPT)
    with Engine(models, cfg, plain=True) as eng:
        plain = draws(eng, prompt, speculate=False)
    with Engine(models, cfg) as eng:
        eng.verifier = ResampleFromP(cfg.sampling)
        wrong = draws(eng, prompt, speculate=True)
    assert p_value(plain, wrong) < 0.01


def test_capped_planes_and_replays_keep_the_distribution(hybrid_pair, build_info):
    """A hybrid target with 3 capped planes: rejected drafts roll back or replay."""
    cfg = PairConfig(target=hybrid_pair.target, draft=hybrid_pair.draft, n_max=7, ctx=CTX, parallel=8,
                     planes=PlaneOptions(3, "default"), sampling=SamplerSettings(temp=1.0, top_k=0, top_p=1.0, min_p=0))
    with Models(cfg) as models:
        prompt = models.target.tokenize(PROMPT)
        plain, spec = plain_and_spec_draws(models, cfg, prompt, n=3)
    assert p_value(plain, spec) > 0.01


def test_same_seed_same_text_at_parallel_1_and_4(coder):
    models, cfg = coder
    prompt = models.target.tokenize(PROMPT)
    texts = {}
    for parallel in (1, 4):
        c = replace(cfg, parallel=parallel, sampling=SETTINGS["t0.7-defaults"])
        with Engine(models, c) as eng:
            seqs = [eng.add(Request(prompt, 48, ignore_eos=True, seed=s)) for s in range(4)] if parallel == 4 else []
            if parallel == 1:
                for s in range(4):
                    seqs.append(eng.add(Request(prompt, 48, ignore_eos=True, seed=s)))
                    list(eng.run())
            else:
                list(eng.run())
            texts[parallel] = [seq.tokens for seq in seqs]
    assert texts[1] == texts[4]
    assert len({tuple(t) for t in texts[1]}) > 1  # different seeds, different texts


def test_each_sequence_samples_with_its_own_settings(coder):
    """One batch, three sampler settings (greedy, temp 0.7 defaults, temp 1.0 top-k 5): each
    sequence's text is what it gives alone, and the greedy one is plain greedy's."""
    models, cfg = coder
    prompt = models.target.tokenize(PROMPT)
    wanted = [(SamplerSettings(temp=0.0), 1), (SETTINGS["t0.7-defaults"], 2),
              (SamplerSettings(temp=1.0, top_k=5, top_p=1.0, min_p=0.0), 3)]
    with Engine(models, replace(cfg, parallel=4)) as eng:
        together = [eng.add(Request(prompt, 40, ignore_eos=True, sampling=s, seed=seed)) for s, seed in wanted]
        list(eng.run())
    with Engine(models, replace(cfg, parallel=1)) as eng:
        alone = []
        for s, seed in wanted:
            alone.append(eng.add(Request(prompt, 40, ignore_eos=True, sampling=s, seed=seed)))
            list(eng.run())
        plain = eng.add(Request(prompt, 40, ignore_eos=True, speculate=False))
        list(eng.run())
    assert [s.tokens for s in together] == [s.tokens for s in alone]
    assert together[0].tokens == plain.tokens
    assert len({tuple(s.tokens) for s in together}) == 3
    assert all(s.stats.spec_steps > 0 for s in together)
    with Engine(models, cfg) as eng, pytest.raises(InputError, match="top-p"):
        eng.add(Request(prompt, 4, sampling=SamplerSettings(temp=1.0, top_p=1.5)))


@pytest.mark.parametrize("kind, name", [("draft-dflash", "t1.0-plain"), ("draft-dflash", "t0.7-defaults"),
                                        ("draft-simple", "t1.0-topk-topp")])
def test_token_trees_keep_the_distribution(kind, name, coder):
    """Sampling sequences verifying token trees of 16 nodes (tree_verify.TreeVerify.sample: a draw
    from the target's distribution at each node, then the child holding it): the first two tokens
    are distributed as plain sampling's, and trees were verified."""
    models, cfg = coder
    if kind == "draft-simple":
        files = resolve(get_entry("tiny-coder-simple"))
        cfg = replace(cfg, draft=files.draft)
    cfg = replace(cfg, sampling=SETTINGS[name], tree_budget=16, tree_auto=False, spec_type=kind)

    def trees_verified(eng: Engine) -> None:
        assert eng.tree_rule is not None and eng.tree_rule.stats.verified > 0

    with Models(cfg) as own:
        prompt = own.target.tokenize(PROMPT)
        plain, spec = plain_and_spec_draws(own, cfg, prompt, check=trees_verified)
    assert p_value(plain, spec) > 0.01, (plain.most_common(5), spec.most_common(5))


def test_the_test_rejects_a_greedy_walk_of_a_sampled_tree(coder, monkeypatch):
    """The same test's power on trees: a walk that follows the target's argmax child (right for
    greedy sequences) on sampled ones is told apart from plain sampling."""
    from ggspec.speculative import tree_verify

    models, cfg = coder
    cfg = replace(cfg, sampling=SETTINGS["t1.0-plain"], tree_budget=16, tree_auto=False)

    def argmax_walk(rows, placed, seq):
        out, offsets = tree_verify.TreeVerify.accept(rows.argmax(axis=1).tolist(), placed)
        return out, offsets

    monkeypatch.setattr(tree_verify.TreeVerify, "sample", staticmethod(argmax_walk))
    prompt = models.target.tokenize(PROMPT)
    plain, wrong = plain_and_spec_draws(models, cfg, prompt)
    assert p_value(plain, wrong) < 0.01
