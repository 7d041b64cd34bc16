"""ngram-cache: llama.cpp's n-gram cache drafter (common/ngram-cache.cpp).

The rules on hand-made chunks (counts within a chunk only, the thresholds, the tie rule), then
the proposer against llama.cpp's own loop (`llama-speculative-simple --spec-type ngram-cache`,
patch 0009's dump) on the shipped tiny-coder target: the same drafts at every common position,
ties included (the continuation seen first later wins: libstdc++'s order of a two-entry map);
greedy output equals plain greedy output, three sequences at once; a request drafts as it would
alone; with a draft model in a comma list.
"""

from __future__ import annotations

import pytest

from conftest import PROMPTS, run_cli
from test_draft_model import DRAFT
from test_mtp import Recorder, _compare
from test_ngram import STACK, TINY_TARGET
from test_ngram_map import drafts_of
from ggspec.bench.native import TOOL, find_tool, run_cpp
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.loop import generate_greedy, generate_spec
from ggspec.speculative.models import PairConfig
from ggspec.speculative.ngram_cache import N_DRAFT, NgramCache

CTX = ContextParams(n_ctx=2048, n_threads=1, flash_attn="off")
REPEAT = "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\n"


def test_only_ngrams_inside_a_chunk_are_counted():
    c = NgramCache()
    c.update([1, 2, 3])
    c.update([4, 5])
    assert c.parts[(1,)] == {2: 1} and c.parts[(1, 2)] == {3: 1} and c.parts[(4,)] == {5: 1}
    assert (3,) not in c.parts and (2, 3) not in c.parts  # 3 -> 4 spans the boundary


def test_drafts_follow_the_longest_convincing_ngram():
    c = NgramCache()
    c.update([7, 1, 2, 9, 1, 2, 9, 1, 2, 9])
    assert c.draft([5, 1, 2]) == [9, 1, 2, 9, 1, 2, 9, 1]  # 8 tokens at most
    assert len(c.draft([5, 1, 2])) == N_DRAFT
    one = NgramCache()
    one.update([3, 4])  # a single occurrence: enough for 3- and 4-grams, not for 1- and 2-grams
    assert one.draft([0, 3]) == []
    one.update([3, 4, 6])
    assert one.draft([0, 3]) == [4]  # 3 -> 4 twice (66 %+); 4 -> 6 once: not enough


def test_a_tie_goes_to_the_continuation_seen_first_later():
    c = NgramCache()
    c.update([8, 1, 5, 8, 1, 6])  # [8, 1] -> 5 once, then -> 6 once: 50 % each
    assert c.draft([0, 8, 1], 1) == [6] and c.ties == 1


@pytest.fixture(scope="module")
def tool(build_info):
    return find_tool(TOOL)


@pytest.mark.parametrize("prompt, n", [(STACK, 160), (REPEAT, 200), (PROMPTS[1], 120), (PROMPTS[19], 120)])
def test_drafts_equal_llama_cpps_at_every_position(prompt, n, tool):
    cfg = PairConfig(target=TINY_TARGET, spec_type="ngram-cache", ctx=CTX)
    with Engine.open(cfg) as eng:
        assert eng.n_max == N_DRAFT
        ids = eng.target_model.tokenize(prompt)
        plain = [t for st in generate_greedy(eng, ids, n, ignore_eos=True) for t in st.tokens]
        rec = Recorder(eng.proposer)
        spec = [t for st in generate_spec(eng, ids, n, ignore_eos=True, proposer=rec) for t in st.tokens]
        ties = eng.proposer.ties
    assert spec == plain
    res = run_cpp(tool, TINY_TARGET, None, prompt, n, N_DRAFT, defer=False, spec_type="ngram-cache", dump_drafts=True)
    assert _compare(rec.log, res.drafts, res.draft_anchors) >= len(rec.log) - 2
    assert sum(len(d) for _, _, d in rec.log) > 0
    if prompt == STACK:
        assert ties > 0  # the tie rule decided some drafted tokens, and llama.cpp drafted the same


def test_with_a_draft_model_in_a_list(tool):
    cfg = PairConfig(target=TINY_TARGET, draft=DRAFT, spec_type="ngram-cache,draft-simple", n_max=4, ctx=CTX)
    with Engine.open(cfg) as eng:
        ids = eng.target_model.tokenize(STACK)
        rec = Recorder(eng.proposer)
        list(generate_spec(eng, ids, 160, ignore_eos=True, proposer=rec))
        assert all(eng.proposer.wins)
    res = run_cpp(tool, TINY_TARGET, DRAFT, STACK, 160, 4, defer=False, spec_type="ngram-cache,draft-simple",
                  dump_drafts=True)
    assert _compare(rec.log, res.drafts, res.draft_anchors) >= len(rec.log) - 2


def test_three_sequences_at_once_are_each_plain_greedy():
    with Engine.open(PairConfig(target=TINY_TARGET, spec_type="ngram-cache", ctx=CTX, parallel=3)) as eng:
        prompts = [eng.target_model.tokenize(t) for t in (STACK, REPEAT, PROMPTS[0])]
        plain = [[t for st in generate_greedy(eng, p, 80, ignore_eos=True) for t in st.tokens] for p in prompts]
        eng.reset()
        seqs = [eng.add(p, 80, ignore_eos=True) for p in prompts]
        list(eng.run())
    assert [s.tokens for s in seqs] == plain
    assert sum(s.stats.accepted for s in seqs) > 0


def test_a_request_in_a_reused_slot_drafts_as_it_would_alone():
    with Engine.open(PairConfig(target=TINY_TARGET, spec_type="ngram-cache", ctx=CTX)) as eng:
        alone = drafts_of(eng, STACK)
        drafts_of(eng, REPEAT)
        after = drafts_of(eng, STACK)
    assert after == alone and any(d for _, _, d in alone)


def test_cli_runs_it():
    res = run_cli("run", "-m", str(TINY_TARGET), "--spec-type", "ngram-cache", "-p", STACK, "-n", "48", "--check")
    assert res.returncode == 0, res.stderr
    assert "ngram-cache n_max 8" in res.stderr and "identical" in res.stderr, res.stderr
