"""The engine's prompt cache: a slot keeps its last sequence's cells, a prompt that starts the same
way goes to that slot and only the rest of it is decoded, and on the tiny pair the output is what
a fresh engine gives (the cells are the same computation). On a real model the cached prompt's last
token, decoded alone, can tip a later token (llama.cpp's arithmetic depends on the batch, as in
llama-server): a sequence added with `cached=False` decodes its whole prompt, the uncached text."""

from __future__ import annotations

import numpy as np
import pytest

from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine, Serving
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request

N = 32
CTX = ContextParams(n_ctx=2048, n_threads=1)


def _cfg(**kw) -> PairConfig:
    files = resolve(get_entry("tiny-coder"))
    return PairConfig(target=files.target, draft=files.draft, n_max=7, ctx=CTX, **{"parallel": 2, **kw})


def _generate(eng: Engine, prompt: np.ndarray):
    seq = eng.add(Request(prompt, N, ignore_eos=True))
    list(eng.run())
    return seq


@pytest.mark.parametrize("spec_type", [None, "ngram-simple"])
def test_a_repeated_or_extended_prompt_decodes_only_its_new_tokens(build_info, spec_type):
    cfg = _cfg(spec_type=spec_type) if spec_type else _cfg()
    with Engine.open(cfg, serving=Serving(prompt_cache=True)) as eng, Engine.open(cfg) as fresh:
        assert eng.prompt_cache
        tok = eng.target_model.tokenize
        a, b = tok("def fibonacci(n):"), tok("The quick brown fox")
        first = _generate(eng, a)
        other = _generate(eng, b)  # the other free slot would do, but b shares nothing with a's slot
        assert first.n_cached == 0 and other.n_cached == 0
        again = _generate(eng, a)
        assert again.seq_id == first.seq_id and again.n_cached == len(a) - 1  # all but id_last
        assert again.tokens == first.tokens
        assert again.stats.n_cached == len(a) - 1 and again.stats.n_prompt == len(a)
        # a conversation's next turn: the old prompt and answer, then new text
        longer = np.concatenate([a, np.asarray(first.tokens[:10], dtype=np.int32), tok("\n\ndef g(x):", add_special=False)])
        turn = _generate(eng, longer)
        assert turn.seq_id == first.seq_id and turn.n_cached == len(a) + 10
        assert turn.tokens == _generate(fresh, longer).tokens
        if eng.draft_ctx is not None:  # the draft's cells hold this sequence's positions only
            assert eng.draft_ctx.pos_max(turn.seq_id) < len(longer) + N + 8
        back = _generate(eng, b)
        assert back.seq_id == other.seq_id and back.n_cached == len(b) - 1 and back.tokens == other.tokens


def test_off_by_default_and_for_recurrent_targets(build_info, hybrid_pair):
    with Engine.open(_cfg()) as eng:
        a = eng.target_model.tokenize("def fibonacci(n):")
        _generate(eng, a)
        assert not eng.prompt_cache and _generate(eng, a).n_cached == 0
    cfg = PairConfig(target=hybrid_pair.target, draft=hybrid_pair.draft, n_max=7, parallel=2, ctx=CTX)
    with Engine.open(cfg, serving=Serving(prompt_cache=True)) as eng:
        assert not eng.prompt_cache  # a recurrent state cannot be cut back to a prefix
        assert eng.store is None


# --- the host-memory store (--cache-ram) ------------------------------------------------------------

TEXTS = ("def fibonacci(n):\n    if n < 2:", "import os\nimport sys\n\ndef main():", "class Stack:\n    def __init__(self):")


@pytest.mark.parametrize("spec_type", [None, "ngram-simple", "plain"])
def test_cells_a_new_prompt_overwrote_come_back_from_host_memory(build_info, spec_type):
    """One slot, three prompts in turn: without the store every prompt is decoded whole each
    time; with it the second round loads each prompt's cells (target and draft) and decodes only
    id_last, and the text is a fresh engine's."""
    cfg = _cfg(parallel=1, **({"spec_type": spec_type} if spec_type == "ngram-simple" else {}))
    plain = spec_type == "plain"
    with Engine.open(cfg, plain=plain, serving=Serving(prompt_cache=True, cache_ram=None)) as eng, \
            Engine.open(cfg, plain=plain, serving=Serving(prompt_cache=True)) as slot_only, \
            Engine.open(cfg, plain=plain) as fresh:
        prompts = [eng.target_model.tokenize(t) for t in TEXTS]
        refs = [_generate(fresh, p).tokens for p in prompts]
        for p, ref in zip(prompts, refs):
            assert _generate(eng, p).tokens == ref and _generate(slot_only, p).tokens == ref
        assert len(eng.store) == 2  # the first two prompts' cells, saved when the next one took the slot
        for p, ref in zip(prompts, refs):
            seq = _generate(eng, p)
            assert seq.n_cached == len(p) - 1, "all but id_last came from the store"
            assert seq.tokens == ref
            if eng.draft_ctx is not None:  # the draft's cells were loaded too: its positions follow the target's
                assert eng.draft_ctx.pos_max(seq.seq_id) >= len(p) - 2
            assert _generate(slot_only, p).n_cached <= 1  # the slot alone held another prompt
        assert eng.store.hits == 3 and eng.store.tokens_loaded == sum(len(p) - 1 for p in prompts)


def test_store_keeps_to_its_budget_least_recently_used_first(build_info):
    cfg = _cfg(parallel=1)
    with Engine.open(cfg, serving=Serving(prompt_cache=True, cache_ram=None)) as probe:
        prompts = [probe.target_model.tokenize(t) for t in TEXTS]
        for p in prompts[:2]:
            _generate(probe, p)
        one = probe.store.nbytes  # the first prompt's cells (the largest of the three prompts)
    with Engine.open(cfg, serving=Serving(prompt_cache=True, cache_ram=one)) as eng:
        for p in prompts:
            _generate(eng, p)
        assert len(eng.store) == 1 and eng.store.nbytes <= one  # the first went when the second came
        assert _generate(eng, prompts[1]).n_cached == len(prompts[1]) - 1  # the one kept
        assert _generate(eng, prompts[0]).n_cached <= 1  # the one dropped
    with Engine.open(cfg, serving=Serving(prompt_cache=True, cache_ram=0)) as off:
        assert off.store is None


@pytest.mark.real
def test_a_sequence_may_decode_its_whole_prompt_whatever_the_cache_holds(build_info):
    """The real Qwen2.5-Coder 1.5B, plain greedy at -np 4 (a serving engine): the same prompt three
    times; the third with `cached=False` decodes every prompt token and gives the first, uncached
    run's text token for token, whatever the cached second run gave."""
    from ggspec.bench.prompts import BUILTIN
    from ggspec.catalogue.pairs import check_files

    entry = get_entry("qwen2.5-coder-1.5b")
    if check_files(entry, None) != "ok":
        pytest.skip("qwen2.5-coder-1.5b is not pulled")
    cfg = PairConfig(target=resolve(entry).target, parallel=4, ctx=ContextParams(n_ctx=4096, n_threads=2, flash_attn="off"))
    with Engine.open(cfg, plain=True, serving=Serving(prompt_cache=True, first_token_from_prefill=True)) as eng:
        prompt = eng.target_model.tokenize(BUILTIN[1].text)
        runs = []
        for cached in (True, True, False):
            seq = eng.add(Request(prompt, 64, cached=cached))
            list(eng.run())
            runs.append((seq.tokens, seq.n_cached))
    assert runs[0][1] == 0 and runs[1][1] == len(prompt) - 1 and runs[2][1] == 0
    assert runs[2][0] == runs[0][0]
