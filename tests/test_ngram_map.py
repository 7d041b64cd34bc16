"""ngram-map-k and ngram-map-k4v: llama.cpp's n-gram map drafters (common/ngram-map.cpp).

The rules on hand-made histories (quirks included), then the proposer against llama.cpp's own
loop: `llama-speculative-simple --spec-type ngram-map-k[4v]` (patch 0009's dump) drafts exactly
what ggspec drafts at every common position, on the shipped tiny-coder target; greedy output equals
plain greedy output, alone and three sequences at once; a request drafts as it would alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import PROMPTS, run_cli
from test_mtp import Recorder
from test_ngram import STACK, TINY_TARGET
from ggspec.bench.native import TOOL, find_tool, run_cpp
from ggspec.errors import InputError
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.loop import generate_greedy, generate_spec
from ggspec.speculative.models import PairConfig
from ggspec.speculative.ngram_map import NgramMap, NgramMapProposer, ngram_hash
from ggspec.speculative.ngram_map import NgramMapOptions

CTX = ContextParams(n_ctx=2048, n_threads=1, flash_attn="off")  # llama.cpp's settings of the tool runs


def _draft(m: NgramMap, inp, sampled) -> list[int]:
    return m.draft(np.asarray(inp, dtype=np.int32), sampled).tolist()


# --- the rules ------------------------------------------------------------------------------------


def test_the_hash_is_llama_cpps_32_bit_lcg():
    assert ngram_hash([1, 2], 0, 2) == 2654435761 + 2
    assert ngram_hash([7, 1, 2], 1, 2) == 2654435763
    assert ngram_hash([70000] * 6, 0, 6) < 2**32


def test_key_only_drafts_what_followed_the_key_and_shrinks_to_what_was_accepted():
    m = NgramMap(2, 3, key_only=True, min_hits=1)
    inp = [5, 1, 2, 7, 8, 9, 3, 4, 1]
    assert _draft(m, inp, 2) == [7, 8, 9]  # the key [1, 2] (last token + id_last) at start 1
    m.accept(1)
    assert _draft(m, inp, 2) == [7]  # the key's next draft holds what its last one got accepted
    m.accept(0)
    assert _draft(m, inp, 2) == []  # (quirk) a wholly rejected key never drafts again
    assert _draft(m, inp[:6], 2) == []  # too short: fewer than 2 n + m tokens


def test_k4v_needs_min_hits_and_a_clear_winner_then_drafts_after_the_current_match():
    inp = [9, 5, 1, 2, 5, 1, 3, 8]  # key [5]: continuations [1, 2] and [1, 3], once each
    assert _draft(NgramMap(1, 2, key_only=True, min_hits=1), inp, 5) == [1, 3]  # the most recent match
    assert _draft(NgramMap(1, 2, key_only=False, min_hits=1), inp, 5) == []  # no clear winner
    assert _draft(NgramMap(1, 2, key_only=False, min_hits=2), inp, 5) == []  # one hit so far
    # [1, 2] twice and [1, 3] once: [1, 2] wins, but (quirk) the tokens after the current match,
    # the [1, 3] occurrence, are drafted
    assert _draft(NgramMap(1, 2, key_only=False, min_hits=1), [5, 1, 2, 5, 1, 2, 5, 1, 3, 0], 5) == [1, 3]


def test_bad_sizes_are_one_line():
    for kw, what in (({"size_n": 0}, "size_n"), ({"size_m": 1025}, "size_m"), ({"min_hits": 0}, "min_hits")):
        with pytest.raises(InputError, match=what):
            NgramMapProposer(True, **kw)
    with pytest.raises(InputError, match="minimum hits must be at least 1"):
        PairConfig(target=TINY_TARGET, spec_type="ngram-map-k4v",
                   spec_options={"ngram-map-k4v": NgramMapOptions(min_hits=0)}).validate()


# --- against llama.cpp's loop ---------------------------------------------------------------------


CASES = [  # prompt, tokens, size_n, size_m, min_hits
    (STACK, 160, 3, 8, 1),
    (STACK, 160, 12, 48, 1),  # llama.cpp's defaults
    ("for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\n", 200, 2, 5, 1),
    ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n", 200, 3, 6, 2),
]


@pytest.fixture(scope="module")
def tool(build_info):
    return find_tool(TOOL)


@pytest.mark.parametrize("spec_type", ["ngram-map-k", "ngram-map-k4v"])
@pytest.mark.parametrize("prompt, n, size_n, size_m, min_hits", CASES)
def test_drafts_equal_llama_cpps_at_every_position(spec_type, prompt, n, size_n, size_m, min_hits, tool):
    options = {spec_type: NgramMapOptions(size_n, size_m, min_hits)}
    cfg = PairConfig(target=TINY_TARGET, spec_type=spec_type, spec_options=options, ctx=CTX)
    with Engine.open(cfg) as eng:
        prompt_ids = eng.target_model.tokenize(prompt)
        plain = [t for st in generate_greedy(eng, prompt_ids, n, ignore_eos=True) for t in st.tokens]
        rec = Recorder(eng.proposer)
        spec = [t for st in generate_spec(eng, prompt_ids, n, ignore_eos=True, proposer=rec) for t in st.tokens]
    assert spec == plain
    res = run_cpp(tool, TINY_TARGET, None, prompt, n, size_m, defer=False, spec_type=spec_type, options=options,
                  dump_drafts=True)
    assert_drafts_equal(rec.log, res, len(prompt_ids) + n - size_m - 2)


def assert_drafts_equal(log: list, res, budget_end: int) -> None:
    """ggspec's drafts (a Recorder log) equal llama.cpp's dumped ones at every common position;
    llama.cpp's may be shorter only from `budget_end` on, where its budget cut them."""
    theirs = {pos: (anchor, d) for (pos, d), anchor in zip(res.drafts, res.draft_anchors)}
    common = [(pos, idl, d) for pos, idl, d in log if pos in theirs]
    assert len(common) >= len(log) - 2  # all but the budget's last steps
    for pos, id_last, d in common:
        assert (id_last, d[:len(theirs[pos][1])]) == theirs[pos], f"position {pos}"
        assert len(d) == len(theirs[pos][1]) or pos >= budget_end, f"position {pos}"
    assert sum(len(d) for _, _, d in log) > 0 and res.accepted > 0


def drafts_of(eng: Engine, text: str) -> list:
    """Every draft ggspec makes for one prompt (80 tokens): (position, id_last, tokens)."""
    rec = Recorder(eng.proposer)
    list(generate_spec(eng, eng.target_model.tokenize(text), 80, ignore_eos=True, proposer=rec))
    return rec.log


def test_three_sequences_at_once_are_each_plain_greedy():
    cfg = PairConfig(target=TINY_TARGET, spec_type="ngram-map-k4v",
                     spec_options={"ngram-map-k4v": NgramMapOptions(size_n=3, size_m=8)}, ctx=CTX, parallel=3)
    with Engine.open(cfg) as eng:
        prompts = [eng.target_model.tokenize(t) for t in (STACK, *PROMPTS[:2])]
        plain = [[t for st in generate_greedy(eng, p, 80, ignore_eos=True) for t in st.tokens] for p in prompts]
        eng.reset()
        seqs = [eng.add(p, 80, ignore_eos=True) for p in prompts]
        list(eng.run())
    assert [s.tokens for s in seqs] == plain
    assert sum(s.stats.drafted for s in seqs) > 0 and sum(s.stats.accepted for s in seqs) > 0


@pytest.mark.parametrize("spec_type", ["ngram-map-k", "ngram-map-k4v"])
def test_a_request_in_a_reused_slot_drafts_as_it_would_alone(spec_type):
    """Each sequence starts a fresh map (as each llama-speculative-simple run does): B after A in
    the same slot drafts exactly as B alone."""
    cfg = PairConfig(target=TINY_TARGET, spec_type=spec_type,
                     spec_options={spec_type: NgramMapOptions(size_n=3, size_m=8)}, ctx=CTX)
    with Engine.open(cfg) as eng:
        alone = drafts_of(eng, STACK)
    with Engine.open(cfg) as eng:
        drafts_of(eng, STACK + "    def peek(self):\n")  # same beginning, other keys and counts
        after = drafts_of(eng, STACK)
    assert after == alone and any(d for _, _, d in alone)


def test_cli_runs_the_map_types():
    for spec_type in ("ngram-map-k", "ngram-map-k4v"):
        res = run_cli("run", "-m", str(TINY_TARGET), "--spec-type", spec_type, "--spec-ngram-map-k-size-n", "3",
                      "--spec-ngram-map-k4v-size-m", "8", "-p", STACK, "-n", "48", "--check")
        assert res.returncode == 0, res.stderr
        assert f"{spec_type} n_max 8" in res.stderr and "identical" in res.stderr, res.stderr
    bad = run_cli("run", "-m", str(TINY_TARGET), "--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-min-hits", "0",
                  "-p", "x", "-n", "4")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "min-hits" in bad.stderr


@pytest.mark.parametrize("spec_type, flags", [
    ("ngram-simple", ["--spec-ngram-simple-size-n", "3"]),
    ("ngram-map-k4v", ["--spec-ngram-map-k4v-size-n", "3"]),
    ("ngram-mod", ["--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "2"]),
])
def test_bench_runs_the_ngram_types_beside_llama_cpps_loop(spec_type, flags, tmp_path):
    """`bench --native` gives every n-gram type llama.cpp's loop rows at the same settings: the
    same acceptance (τ within the budget's last steps) on all 12 built-in prompts."""
    import json

    out = tmp_path / "bench.json"
    res = run_cli("bench", "-m", str(TINY_TARGET), "--spec-type", spec_type, *flags, "--native", "--spec-draft-n-max",
                  "8", "-n", "48", "-r", "1", "--save", str(out), timeout=300)
    assert res.returncode == 0, res.stderr
    rows = {r["kind"]: r for r in json.loads(out.read_text())["rows"] if r["category"] == "all"}
    assert {"spec", "native"} <= set(rows)
    assert rows["spec"]["tau_pooled"] > 1.5
    assert rows["native"]["tau_pooled"] == pytest.approx(rows["spec"]["tau_pooled"], rel=0.03)
    assert rows["spec"]["identical"] == rows["native"]["identical"] == "12/12"
