"""`first_token_from_prefill` (the server's engine, as llama-server): the prefill decodes the whole
prompt and the first token comes from its last row, a step earlier. Only *when* the first token
comes changes: greedy text is the default engine's token for token (DFlash, n-gram, plain, a hybrid
target with capped planes, batched, with the prompt cache), a budget of one ends at the prefill,
and sampled text keeps the target's distribution and its seed."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine, Serving
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.request import Request
from ggspec.speculative.sampling import SamplerSettings

N = 40
CTX = ContextParams(n_ctx=2048, n_threads=1)
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n\ndef main(", "class Stack:\n    def push(self, x):"]


@pytest.fixture(scope="module")
def coder():
    files = resolve(get_entry("tiny-coder"))
    cfg = PairConfig(target=files.target, draft=files.draft, n_max=7, parallel=3, ctx=CTX)
    with Models(cfg) as models:
        yield models, cfg


def _texts(eng: Engine, prompts, n: int = N) -> list[list[int]]:
    seqs = [eng.add(Request(p, n, ignore_eos=True)) for p in prompts]
    list(eng.run())
    return [s.tokens for s in seqs]


@pytest.mark.parametrize("kind", ["dflash", "ngram-simple", "plain"])
def test_greedy_text_is_the_default_engines(coder, kind):
    models, cfg = coder
    cfg = replace(cfg, spec_type="ngram-simple") if kind == "ngram-simple" else cfg
    prompts = [models.target.tokenize(p) for p in PROMPTS]
    with Engine(models, cfg, plain=kind == "plain") as default:
        want_batched = _texts(default, prompts)
        want_alone = [_texts(default, [p])[0] for p in prompts]
    assert want_batched == want_alone
    with Engine(models, cfg, plain=kind == "plain", serving=Serving(first_token_from_prefill=True, prompt_cache=True)) as eng:
        seq = eng.add(Request(prompts[0], N, ignore_eos=True))
        first = eng.step()
        # the prefill brings the first token; the sequence is then one position further on
        assert [step.kind for s, step in first if s is seq][0] == "prefill"
        assert [len(step.tokens) for s, step in first if s is seq][0] == 1
        list(eng.run())
        assert seq.tokens == want_batched[0]
        assert seq.stats.n_generated == N and seq.stats.n_decoded == N - 1
        assert _texts(eng, prompts) == want_batched  # batched, and with the prompt cache's cells
        assert _texts(eng, prompts[1:2]) == want_batched[1:2]


def test_a_budget_of_one_ends_at_the_prefill(coder):
    models, cfg = coder
    prompt = models.target.tokenize(PROMPTS[0])
    with Engine(models, cfg) as default:
        want = _texts(default, [prompt], n=1)[0]
    with Engine(models, cfg, serving=Serving(first_token_from_prefill=True)) as eng:
        seq = eng.add(Request(prompt, 1, ignore_eos=True))
        steps = eng.step()
        assert seq.done and seq.tokens == want and not eng.active
        assert [step.kind for _, step in steps] == ["prefill"] and eng.stats.steps == 0  # no transaction


def test_hybrid_target_with_capped_planes(hybrid_pair, build_info):
    cfg = PairConfig(target=hybrid_pair.target, draft=hybrid_pair.draft, n_max=7, parallel=2, ctx=CTX,
                     planes=PlaneOptions(3, "default"))
    with Models(cfg) as models:
        prompts = [models.target.tokenize(p) for p in PROMPTS[:2]]
        with Engine(models, cfg) as default:
            want = _texts(default, prompts, n=24)
        with Engine(models, cfg, serving=Serving(first_token_from_prefill=True)) as eng:
            assert _texts(eng, prompts, n=24) == want


def _first_two(eng: Engine, prompt, seeds) -> Counter:
    counts: Counter = Counter()
    pending = list(seeds)
    while pending or eng.active:
        while pending and eng.can_add(prompt, 2):
            eng.add(Request(prompt, 2, ignore_eos=True, seed=pending.pop()))
        for seq in {seq: None for seq, _ in eng.step() if seq.done}:
            counts[tuple(seq.tokens)] += 1
    return counts


def test_sampling_keeps_the_distribution_and_the_seed(coder):
    """The first two sampled tokens (the prefill's and the first transaction's) against plain
    sampling over 1500 seeds each (chi-square, p > 0.01); a seed gives the same text alone and
    batched."""
    models, cfg = coder
    cfg = replace(cfg, parallel=8, sampling=SamplerSettings(temp=0.7))
    prompt = models.target.tokenize(PROMPTS[1])
    with Engine(models, cfg, plain=True) as eng:
        plain = _first_two(eng, prompt, range(10**6, 10**6 + 1500))
    with Engine(models, cfg, serving=Serving(first_token_from_prefill=True)) as eng:
        early = _first_two(eng, prompt, range(1500))
        common = [k for k, c in (plain + early).items() if c >= 10]
        rows = np.array([[c[k] for k in common] + [sum(c.values()) - sum(c[k] for k in common)] for c in (plain, early)])
        assert chi2_contingency(rows[:, rows.sum(axis=0) > 0]).pvalue > 0.01
        alone = []
        for s in (5, 6):
            alone.append(eng.add(Request(prompt, 24, ignore_eos=True, seed=s)))
            list(eng.run())
        together = [eng.add(Request(prompt, 24, ignore_eos=True, seed=s)) for s in (6, 5)]
        list(eng.run())
        assert [s.tokens for s in alone] == [s.tokens for s in together[::-1]]
        assert alone[0].tokens != alone[1].tokens
