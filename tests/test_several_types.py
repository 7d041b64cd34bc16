"""Several speculative types at once (`--spec-type a,b`, llama.cpp's comma list).

The list in llama.cpp's order of preference, refusals in one line; drafts equal llama.cpp's own
loop (patch 0009's dump) at every common position for n-gram + draft-model, n-gram + DFlash and
n-gram + n-gram lists; the type that did not draft hears the verify as another's (its statistics
skip it); greedy output equals plain greedy output alone and three at once; the CLI and the server.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import PROMPTS, run_cli
from helpers.drafts import Recorder, compare
from helpers.pairs import CPP_CTX as CTX
from helpers.pairs import DFLASH, DRAFT, STACK, TARGET
from helpers.serving import serve_equals_plain

from ggspec.bench.native import run_cpp
from ggspec.errors import InputError
from ggspec.speculative.driver import generate_greedy, generate_spec
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.types.ngram_mod import NgramModProposer
from ggspec.speculative.types.registry import options_from_flat, spec_types

SIZES = dict(ngram_size_n=3, ngram_size_m=8, ngram_map_size_n=3, ngram_map_size_m=8, ngram_mod_n_match=4,
             ngram_mod_n_max=8, ngram_mod_n_min=2)
N = 160


def _cfg(spec_type: str, draft=None, **kw) -> PairConfig:
    sizes = options_from_flat({**SIZES, **kw.pop("sizes", {})})
    return PairConfig(**{"target": TARGET, "draft": draft, "spec_type": spec_type, "n_max": 4, "ctx": CTX,
                         "spec_options": sizes, **kw})


def test_a_list_is_taken_in_llama_cpps_order_of_preference():
    assert spec_types("draft-dflash, ngram-mod") == ("ngram-mod", "draft-dflash")
    assert spec_types("draft-simple,ngram-map-k4v,ngram-simple") == ("ngram-simple", "ngram-map-k4v", "draft-simple")
    for value, needle in (("ngram-mod,ngram-mod", "given twice"), ("draft-simple,draft-dflash", "one draft model"),
                          ("ngram-mod,bogus", "bogus: unknown"), ("ngram-mod,", "unknown"),
                          ("ngram-mod,draft-eagle3,draft-mtp", "one draft model")):
        with pytest.raises(InputError, match=needle):
            spec_types(value)
    with Engine.open(_cfg("draft-simple,ngram-mod", DRAFT)) as eng:
        assert eng.plan.spec_type == "ngram-mod,draft-simple" and eng.plan.kinds == ("ngram-mod", "draft-simple")
        assert eng.n_max == 8  # the longest of the types' own lengths (ngram-mod's 8, draft-simple's 4)
    with Engine.open(_cfg("ngram-simple,ngram-mod", DRAFT)) as eng:  # no model type: the draft is not used
        assert eng.models.draft is None and any("not used" in w for w in eng.warnings)


CASES = [("ngram-simple,draft-simple", DRAFT), ("ngram-mod,draft-simple", DRAFT),
         ("ngram-map-k4v,draft-dflash", DFLASH), ("ngram-map-k,ngram-mod", None)]


@pytest.mark.parametrize("spec_type, draft", CASES)
def test_drafts_equal_llama_cpps_at_every_position(spec_type, draft, tool):
    with Engine.open(_cfg(spec_type, draft)) as eng:
        prompt = eng.target_model.tokenize(STACK)
        plain = [t for st in generate_greedy(eng, prompt, N, ignore_eos=True) for t in st.tokens]
        rec = Recorder(eng.proposer)
        spec = [t for st in generate_spec(eng, prompt, N, ignore_eos=True, proposer=rec) for t in st.tokens]
        wins = eng.proposer.wins
    assert spec == plain
    assert all(wins), wins  # every type drafted some of the steps
    res = run_cpp(tool, TARGET, draft, STACK, N, 4, defer=False, spec_type=spec_type, options=options_from_flat(SIZES),
                  dump_drafts=True)
    assert compare(rec.log, res.drafts, res.draft_anchors) >= len(rec.log) - 2
    assert res.accepted > 0


def test_the_type_that_did_not_draft_hears_the_verify_as_anothers():
    """ngram-mod counts low-acceptance steps of its own drafts only (llama.cpp's is_other)."""
    mod = NgramModProposer(2, 8, 1)
    seq = Sequence(0, Request(np.array([1, 2, 3, 1, 2, 3, 1, 2], dtype=np.int32), 8))
    seq.id_last, seq.pos = 2, 7
    mod.begin(seq)
    assert len(mod.propose([seq], 8)[0]) > 0
    mod.commit(seq, 7, 1, other=True)  # rejected, but someone else's draft
    assert mod._info[0].n_low == 0
    assert len(mod.propose([seq], 8)[0]) > 0
    mod.commit(seq, 7, 1)
    assert mod._info[0].n_low == 1


def test_three_sequences_at_once_are_each_plain_greedy():
    with Engine.open(_cfg("ngram-mod,draft-simple", DRAFT, parallel=3)) as eng:
        prompts = [eng.target_model.tokenize(t) for t in (STACK, *PROMPTS[:2])]
        plain = [[t for st in generate_greedy(eng, p, 80, ignore_eos=True) for t in st.tokens] for p in prompts]
        eng.reset()
        seqs = [eng.add(Request(p, 80, ignore_eos=True)) for p in prompts]
        list(eng.run())
        assert all(eng.proposer.wins)
    assert [s.tokens for s in seqs] == plain


def test_cli_and_server_run_a_list():
    res = run_cli("run", "-m", str(TARGET), "-md", str(DRAFT), "--spec-type", "draft-simple,ngram-simple",
                  "--spec-ngram-simple-size-n", "3", "-p", STACK, "-n", "48", "--check")
    assert res.returncode == 0, res.stderr
    assert "ngram-simple,draft-simple" in res.stderr and "identical" in res.stderr, res.stderr
    bad = run_cli("run", "-m", str(TARGET), "-md", str(DRAFT), "--spec-type", "draft-simple,draft-dflash", "-p", "x")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "one draft model" in bad.stderr
    serve_equals_plain(TARGET, "-md", str(DRAFT), "--spec-type", "ngram-mod,draft-simple")


# --- the cost rule --------------------------------------------------------------------------------


def test_acceptance_counts_and_expected_tokens():
    from ggspec.speculative.types.type_list import Acceptance

    a = Acceptance(4)
    assert a.expected(0) == 1.0 and a.expected(2) == pytest.approx(1 + 0.5 + 0.25)  # the 1/2 prior
    a.add(4, 1, 4)  # first right, second wrong: positions 1 and 2 reached, position 1 accepted
    assert a.tried.tolist() == [1, 1, 0, 0] and a.accepted.tolist() == [1, 0, 0, 0]
    a.add(4, 2, 2)  # an unused draft checked against 2 committed tokens: both right, nothing beyond
    assert a.tried[:3].tolist() == pytest.approx([1.99, 1.99, 0]) and a.accepted[1] == pytest.approx(1)


def _wins(eng: Engine, text: str) -> tuple[list[int], list[int]]:
    """(text, wins per type) of one greedy generation."""
    before = list(eng.proposer.wins)
    tokens = [t for st in generate_spec(eng, eng.target_model.tokenize(text), 96, ignore_eos=True) for t in st.tokens]
    return tokens, [w - b for w, b in zip(eng.proposer.wins, before)]


def test_the_cost_rule_weighs_acceptance_against_call_costs():
    """Lossless whatever it picks; with an expensive model call it picks what llama.cpp's rule picks
    (any n-gram draft), with a hopeless n-gram type and a free model, the model's drafts."""
    kw = dict(sizes=dict(ngram_size_n=1))  # ngram-simple matching one token: it drafts often, and poorly
    with Engine.open(_cfg("ngram-simple,draft-simple", DRAFT, spec_select="first", **kw)) as first:
        plain = [t for st in generate_greedy(first, first.target_model.tokenize(STACK), 96, ignore_eos=True)
                 for t in st.tokens]
        first_text, first_wins = _wins(first, STACK)
    assert first_text == plain and all(first_wins)
    with Engine.open(_cfg("ngram-simple,draft-simple", DRAFT, spec_select="cost", **kw)) as eng:
        text, _ = _wins(eng, STACK)  # measures the costs and acceptance
        assert text == plain
        rule = eng.proposer
        rule.t_call[1] = 10.0  # a draft model call of 10 s
        text, wins = _wins(eng, STACK)
        assert text == plain and wins == first_wins
        rule.t_call[1], rule.acceptance[0].tried[:], rule.acceptance[0].accepted[:] = 1e-9, 1e6, 0.0
        text, wins = _wins(eng, STACK)
        assert text == plain and wins[0] == 0 and wins[1] > 0
