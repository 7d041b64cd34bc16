"""ngram-mod: llama.cpp's shared hashed n-gram table (common/ngram-mod.cpp and its speculative impl).

The rules on hand-made histories; the CLI; a server keeps the table across requests. Its drafts
against llama.cpp's own loop (`--spec-type ngram-mod`, patch 0009's dump) at every position, the
five-in-a-row reset included, greedy output against plain greedy output and B after A as B alone:
tests/test_exactness.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli
from helpers.drafts import sequence
from helpers.pairs import CPP_CTX as CTX
from helpers.pairs import STACK, TARGET

from ggspec.errors import InputError
from ggspec.speculative.driver import generate_greedy, generate_spec
from ggspec.speculative.engine import Engine, Serving
from ggspec.speculative.models import PairConfig
from ggspec.speculative.types.ngram_mod import EMPTY, HASH_FACTOR, TABLE_SIZE, NgramModOptions, NgramModProposer, NgramTable


def _llama_index(window) -> int:
    """common_ngram_mod::idx with 64-bit unsigned arithmetic."""
    res = 0
    for t in window:
        res = (res * HASH_FACTOR + t) % 2**64
    return res % TABLE_SIZE


# --- the rules ------------------------------------------------------------------------------------


def test_the_index_is_llama_cpps_64_bit_hash_modulo_the_table():
    rng = np.random.default_rng(0)
    table = NgramTable(24)
    tokens = rng.integers(0, 262144, 200).astype(np.int32)
    starts = np.arange(0, 170)
    want = [_llama_index(tokens[s:s + 24].tolist()) for s in starts]
    assert table.indices(tokens, starts).tolist() == want
    assert [table.index(tokens[s:s + 24]) for s in starts[:20]] == want[:20]


def test_adding_writes_the_next_token_and_the_last_writer_wins():
    table = NgramTable(2, size=1024)
    tokens = np.array([1, 2, 3, 1, 2, 4, 1, 2], dtype=np.int32)
    table.add_range(tokens, 0, len(tokens) - 2)  # windows at 0..5, each followed by a token
    assert table.get([1, 2]) == 4  # [1, 2] -> 3 first, then -> 4
    assert table.get([2, 3]) == 1 and table.get([9, 9]) == EMPTY
    one_by_one = NgramTable(2, size=1024)
    for i in range(len(tokens) - 2):
        one_by_one.add_range(tokens, i, i + 1)
    assert np.array_equal(one_by_one.entries, table.entries) and one_by_one.used == table.used == 5  # 6 windows, [1, 2] twice


def test_drafts_chain_lookups_and_short_ones_are_dropped():
    block = list(range(100, 110))
    prompt, gen = [1] + block * 3, block[:4]
    (d,) = NgramModProposer(n_match=3, n_max=8, n_min=2).propose([sequence(prompt, gen)], 8)
    assert d.tokens.tolist() == (block[4:] + block)[:8]  # the chain goes round the block
    # a block of 10 can be chained for ever: n_max bounds it; nothing follows a novel window
    (d,) = NgramModProposer(n_match=3, n_max=64, n_min=48).propose([sequence(prompt, [7, 8, 9])], 64)
    assert len(d) == 0


def test_five_low_acceptance_verifies_empty_the_shared_table():
    block = list(range(100, 110))
    p = NgramModProposer(n_match=3, n_max=8, n_min=1)
    s = sequence([1] + block * 3, block[:4])
    p.begin(s)
    for k in range(5):
        assert p.table.used > 0
        assert len(p.propose([s], 8)[0]) == 8
        p.commit(s, 0, 1)  # 0 of 8 accepted
    assert p.table.used == 0 and p._info[0].n_low == 0 and p._info[0].i_last == 0


def test_bad_settings_are_one_line():
    for kw, what in (({"n_match": 0}, "n_match"), ({"n_max": 1025}, "n_max"), ({"n_min": 9, "n_max": 8}, "n_min")):
        with pytest.raises(InputError, match=what):
            NgramModProposer(**kw)
    with pytest.raises(InputError, match="shortest draft"):
        PairConfig(target=TARGET, spec_type="ngram-mod",
                   spec_options={"ngram-mod": NgramModOptions(n_min=65)}).validate()


def test_cli_runs_ngram_mod():
    res = run_cli("run", "-m", str(TARGET), "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "4",
                  "--spec-ngram-mod-n-max", "8", "--spec-ngram-mod-n-min", "2", "-p", STACK, "-n", "64", "--check")
    assert res.returncode == 0, res.stderr
    assert "ngram-mod auto ≤ 8" in res.stderr and "identical" in res.stderr, res.stderr
    bad = run_cli("run", "-m", str(TARGET), "--spec-type", "ngram-mod", "--spec-ngram-mod-n-min", "100",
                  "-p", "x", "-n", "4")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "--spec-ngram-mod-n-min" in bad.stderr


def test_a_server_keeps_the_table_across_requests():
    """keep_draft_state (ggspec serve), as llama-server: a repeated request drafts from what the
    first one added, so more of it; the output stays plain greedy; Engine.reset forgets it."""
    cfg = PairConfig(target=TARGET, spec_type="ngram-mod", adaptive=False,  # (every draft verified)
                     spec_options={"ngram-mod": NgramModOptions(n_match=3, n_max=8, n_min=1)}, ctx=CTX)
    with Engine.open(cfg, serving=Serving(keep_draft_state=True)) as eng:
        ids = eng.target_model.tokenize(STACK)
        plain = [t for st in generate_greedy(eng, ids, 80, ignore_eos=True) for t in st.tokens]
        first = list(generate_spec(eng, ids, 80, ignore_eos=True))
        again = list(generate_spec(eng, ids, 80, ignore_eos=True))
        eng.reset()
        fresh = list(generate_spec(eng, ids, 80, ignore_eos=True))
    for steps in (first, again, fresh):
        assert [t for st in steps for t in st.tokens] == plain
    accepted = [sum(st.accepted for st in steps) for steps in (first, again, fresh)]
    assert accepted[1] > accepted[0] == accepted[2], accepted
