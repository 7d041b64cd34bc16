"""The engine's prompt cache: a slot keeps its last sequence's cells, a prompt that starts the same
way goes to that slot and only the rest of it is decoded, and the output is what a fresh engine
gives (the cells are the same computation)."""

from __future__ import annotations

import numpy as np
import pytest

from ggspec.pairs import get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig

N = 32
CTX = ContextParams(n_ctx=2048, n_threads=1)


def _cfg(**kw) -> PairConfig:
    files = resolve(get_entry("tiny-coder"))
    return PairConfig(target=files.target, draft=files.draft, n_max=7, parallel=2, ctx=CTX, **kw)


def _generate(eng: Engine, prompt: np.ndarray):
    seq = eng.add(prompt, N, ignore_eos=True)
    list(eng.run())
    return seq


@pytest.mark.parametrize("spec_type", [None, "ngram-simple"])
def test_a_repeated_or_extended_prompt_decodes_only_its_new_tokens(build_info, spec_type):
    cfg = _cfg(spec_type=spec_type) if spec_type else _cfg()
    with Engine.open(cfg, prompt_cache=True) as eng, Engine.open(cfg) as fresh:
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
    with Engine.open(cfg, prompt_cache=True) as eng:
        assert not eng.prompt_cache  # a recurrent state cannot be cut back to a prefix
