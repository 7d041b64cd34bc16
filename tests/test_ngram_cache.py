"""ngram-cache: llama.cpp's n-gram cache drafter (common/ngram-cache.cpp).

The rules on hand-made chunks (counts within a chunk only, the thresholds, the tie rule: the
continuation seen first later wins, libstdc++'s order of a two-entry map); ties decide drafts of a
real run; with a draft model in a comma list against llama.cpp's own loop (patch 0009's dump); the
CLI. Alone, its drafts against llama.cpp's at every position (ties included), greedy output against
plain greedy output and B after A as B alone: tests/test_exactness.py.
"""

from __future__ import annotations

from conftest import run_cli
from helpers.drafts import Recorder, compare
from helpers.pairs import CPP_CTX as CTX
from helpers.pairs import DRAFT, STACK, TARGET

from ggspec.bench.native import run_cpp
from ggspec.speculative.driver import generate_greedy, generate_spec
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.types.ngram_cache import N_DRAFT, NgramCache


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


def test_ties_decide_some_drafts_on_the_stack_prompt():
    """The tie rule is exercised where it matters: on STACK (whose drafts equal llama.cpp's at every
    position, tests/test_exactness.py) some drafted tokens were ties, and the output is plain greedy."""
    with Engine.open(PairConfig(target=TARGET, spec_type="ngram-cache", ctx=CTX)) as eng:
        assert eng.n_max == N_DRAFT
        ids = eng.target_model.tokenize(STACK)
        plain = [t for st in generate_greedy(eng, ids, 160, ignore_eos=True) for t in st.tokens]
        spec = [t for st in generate_spec(eng, ids, 160, ignore_eos=True) for t in st.tokens]
        assert spec == plain
        assert eng.proposer.ties > 0


def test_with_a_draft_model_in_a_list(tool):
    cfg = PairConfig(target=TARGET, draft=DRAFT, spec_type="ngram-cache,draft-simple", n_max=4, ctx=CTX)
    with Engine.open(cfg) as eng:
        ids = eng.target_model.tokenize(STACK)
        rec = Recorder(eng.proposer)
        list(generate_spec(eng, ids, 160, ignore_eos=True, proposer=rec))
        assert all(eng.proposer.wins)
    res = run_cpp(tool, TARGET, DRAFT, STACK, 160, 4, defer=False, spec_type="ngram-cache,draft-simple",
                  dump_drafts=True)
    assert compare(rec.log, res.drafts, res.draft_anchors) >= len(rec.log) - 2


def test_cli_runs_it():
    res = run_cli("run", "-m", str(TARGET), "--spec-type", "ngram-cache", "-p", STACK, "-n", "48", "--check")
    assert res.returncode == 0, res.stderr
    assert "ngram-cache auto ≤ 8" in res.stderr and "identical" in res.stderr, res.stderr
