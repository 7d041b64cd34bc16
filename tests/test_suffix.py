"""The `suffix` draft type (SuffixDecoding): its drafts against arctic-inference's own
(`SuffixTree` and `SuffixDecodingCache`, built from its source by `ggspec build --tools`), on
random token streams and on the real token streams of the engine's runs; its losslessness; the
global trie's bound; and a lone model's default (the CLI drafts with it unless told otherwise).
"""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
from conftest import PROMPTS, run_cli
from helpers.drafts import greedy
from helpers.pairs import CPP_CTX, STACK, TARGET

from ggspec.native import suffix_oracle
from ggspec.speculative.driver import generate_spec
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.types.suffix import DEFAULT_DEPTH, SuffixCache, SuffixOptions
from ggspec.speculative.types.suffix_trie import SuffixTrie


@pytest.fixture(scope="module")
def oracle():
    """arctic_inference.suffix_decoding, as `ggspec build --tools` built it."""
    if not suffix_oracle.is_built():
        pytest.skip("the suffix oracle is not built: `pip install -e '.[test]' && ggspec build --tools`")
    sys.path.insert(0, str(suffix_oracle.oracle_dir()))
    try:
        import arctic_inference.suffix_decoding as sd
    finally:
        sys.path.pop(0)
    return sd


def _stream(rng: random.Random, n: int, vocab: int) -> list[int]:
    """Tokens that repeat themselves often (copies of earlier stretches), as text does."""
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < 0.5:
            i = rng.randrange(len(out))
            out += out[i:i + rng.randint(1, 12)]
        else:
            out.append(rng.randrange(vocab))
    return out[:n]


def _same(ref, mine) -> bool:
    return (list(ref.token_ids), list(ref.parents), [float(p) for p in ref.probs], ref.score, ref.match_len) == \
        (mine.tokens, mine.parents, mine.probs, mine.score, mine.match_len)


@pytest.mark.parametrize("seed", range(3))
def test_the_trie_drafts_as_the_reference_tree(oracle, seed):
    """Chains and trees, every setting, with sequences added, extended and removed: equal tokens,
    parents, float32 probabilities, scores and match lengths (ties of equal counts included)."""
    rng = random.Random(seed)
    compared = 0
    for _ in range(40):
        depth, vocab = rng.choice([4, 8, 24, 64]), rng.choice([3, 5, 20, 200])
        ref, mine, seqs = oracle._C.SuffixTree(depth), SuffixTrie(depth), {}
        for _ in range(rng.randint(1, 6)):
            key = rng.randrange(4)
            if key in seqs and rng.random() < 0.2:
                ref.remove(key)
                mine.remove(key)
                del seqs[key]
                continue
            tokens = _stream(rng, rng.randint(1, 300), vocab)
            ref.extend(key, tokens)
            mine.extend(key, tokens)
            seqs.setdefault(key, []).extend(tokens)
            for _ in range(15):
                context = _stream(rng, rng.randint(2, 40), vocab)
                if seqs and rng.random() < 0.5:  # the end of a held sequence, somewhere
                    s = rng.choice(list(seqs.values()))
                    end = rng.randint(1, len(s))
                    context = s[max(0, end - rng.randint(2, 40)):end]
                args = (rng.choice([1, 4, 16, 64]), rng.choice([1.0, 0.5, 2.0]), rng.choice([0.0, 1.0]),
                        rng.choice([0.0, 0.1, 0.3]))
                for tree in (False, True):
                    a, b = ref.speculate(context, *args, tree), mine.speculate(context, *args, tree)
                    assert _same(a, b), (tree, depth, context, list(a.token_ids), b.tokens)
                    compared += 1
        assert ref.check_integrity() == ""
    assert compared > 1000


def test_the_cache_drafts_as_the_reference_cache(oracle):
    """Several requests, their prompts and outputs, the global trie across them and its eviction of
    the oldest outputs by count: SuffixCache.speculate equals SuffixDecodingCache.speculate."""
    rng = random.Random(7)
    ref = oracle.SuffixDecodingCache(max_tree_depth=24, max_cached_requests=3)
    mine = SuffixCache(depth=24, cache_tokens=1 << 20, max_requests=3)
    history: dict[int, list[int]] = {}
    for req in range(12):
        prompt = _stream(rng, rng.randint(5, 120), 30)
        ref.start_request(req, prompt)
        mine.start(req, prompt)
        history[req] = list(prompt)
        for _ in range(rng.randint(1, 30)):
            out = _stream(rng, rng.randint(1, 6), 30)
            ref.add_active_response(req, out)
            mine.add(req, out)
            history[req] += out
            context = history[req][-24:]
            for tree in (False, True):
                a = ref.speculate(req, context, max_spec_tokens=16, min_token_prob=0.1, use_tree_spec=tree)
                b = mine.speculate(req, context, 16, min_prob=0.1, tree=tree)
                assert (a.token_ids, a.score, a.match_len) == (b.tokens, b.score, b.match_len)
        ref.stop_request(req)
        mine.stop(req)
        assert set(ref.cached_requests) == set(mine._kept)


class _Log:
    """Wraps the engine's suffix proposer: each draft with the sequence's tokens when it was made."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.max_draft = inner, inner.name, inner.max_draft
        self.log: list[tuple[list[int], list[int], int]] = []  # (output so far, draft, length asked)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, seqs, n):
        drafts = self.inner.propose(seqs, n)
        self.log += [(list(s.tokens), d.tokens.tolist(), n) for s, d in zip(seqs, drafts) if s.started]
        return drafts


def test_the_engine_drafts_as_the_reference_on_real_streams(oracle):
    """The tiny target's own text, four prompts through one engine (the global trie carries from
    one to the next): every draft the engine made equals the reference cache's, fed the same
    prompts and outputs in the same order; every output is plain greedy."""
    cfg = PairConfig(target=TARGET, spec_type="suffix", n_max=16, adaptive=False, ctx=CPP_CTX,
                     spec_options={"suffix": SuffixOptions(min_match=1)})  # (every draft, as the reference's)
    texts = [STACK, STACK.replace("items", "things"), PROMPTS[0], STACK]
    ref = oracle.SuffixDecodingCache(max_tree_depth=DEFAULT_DEPTH)
    drafted = 0
    with Engine.open(cfg) as eng:
        for req, text in enumerate(texts):
            prompt = eng.target_model.tokenize(text)
            plain = greedy(eng, prompt, 96)
            log = _Log(eng.proposer)
            out = [t for st in generate_spec(eng, prompt, 96, ignore_eos=True, proposer=log) for t in st.tokens]
            assert out == plain
            ref.start_request(req, prompt.tolist())
            fed = 0
            for tokens, draft, n in log.log:
                ref.add_active_response(req, tokens[fed:])
                fed = len(tokens)
                context = (prompt.tolist() + tokens)[-DEFAULT_DEPTH:]
                want = ref.speculate(req, context, max_spec_tokens=n, min_token_prob=0.1).token_ids
                assert draft == list(want), (req, len(tokens))
                drafted += len(draft)
            ref.add_active_response(req, out[fed:])
            ref.stop_request(req)
    assert drafted > 100


def test_a_global_trie_is_bounded_and_can_be_off():
    cache = SuffixCache(depth=8, cache_tokens=100)
    for req in range(10):
        cache.start(req, [1, 2, 3])
        cache.add(req, list(range(req, req + 40)))
        cache.stop(req)
    held = cache.memory()
    assert held["tokens"] <= 100 and held["outputs"] == 2 and held["bytes"] > 0
    assert list(cache._kept) == [8, 9]  # the newest outputs
    drafts = []
    for tokens in (1 << 10, 0):  # request 1 drafts from request 0's answer only where the trie is shared
        cache = SuffixCache(depth=8, cache_tokens=tokens)
        cache.start(0, [1])
        cache.add(0, [5, 6, 7, 8])
        cache.stop(0)
        cache.start(1, [2, 5, 6])
        drafts.append(cache.speculate(1, [2, 5, 6], 4).tokens)
    assert drafts == [[7, 8], []] and cache.memory()["outputs"] == 0


def test_suffix_options_are_checked():
    with pytest.raises(Exception, match="suffix depth"):
        SuffixOptions(depth=0).validate()
    with pytest.raises(Exception, match="cut-off"):
        SuffixOptions(p_min=1.5).validate()


def test_a_repeated_prompt_drafts_from_the_earlier_answer():
    """Across the prompts of one engine (a server's requests): the second time a prompt comes, the
    first answer is in the global trie, so nearly every token of the second is drafted."""
    cfg = PairConfig(target=TARGET, spec_type="suffix", n_max=16, adaptive=False, ctx=CPP_CTX)
    with Engine.open(cfg) as eng:
        prompt = eng.target_model.tokenize(PROMPTS[0])
        first = list(generate_spec(eng, prompt, 64, ignore_eos=True))
        second = list(generate_spec(eng, prompt, 64, ignore_eos=True))
        assert [t for s in first for t in s.tokens] == [t for s in second for t in s.tokens]
        assert eng.proposer.memory()["outputs"] == 2
    assert len(second) < len(first) and sum(s.accepted for s in second) >= 0.75 * 64


def test_a_lone_model_drafts_from_the_text_by_default(real_target):
    """`run -m model` with nothing else: the suffix drafter under the adaptive length, said in a
    note and in the stats line; the text equals `--spec-type none`'s (plain) byte for byte."""
    prompt = "def add(a, b):\n    return a + b\n\n\n# The same function again:\ndef add(a, b):\n"
    common = ("run", "-m", str(real_target), "-n", "48", "-t", "2", "--temp", "0", "-p", prompt)
    spec = run_cli(*common, timeout=300)
    plain = run_cli(*common, "--spec-type", "none", timeout=300)
    assert spec.returncode == 0 and plain.returncode == 0, spec.stderr + plain.stderr
    assert "drafts from the text itself (suffix)" in spec.stderr and "suffix auto" in spec.stderr
    assert "no speculation" in plain.stderr and "suffix" not in plain.stderr
    assert spec.stdout == plain.stdout
    assert np.any([line.startswith("speculation") for line in spec.stderr.splitlines()]) or "τ" in spec.stderr


def test_a_lone_model_server_drafts_from_earlier_answers_and_says_why(build_info):
    """`serve -m model` with nothing else: suffix, the reason and the shared trie in /props; a
    repeated request drafts from the first answer (the global trie) and answers the same; a
    request may still ask for plain decoding."""
    from helpers.serving import LiveServer

    s = LiveServer("-m", str(TARGET), "-np", "2", "-t", "1")
    try:
        props = s.get("/props")[1]["speculative"]
        assert props["spec_type"] == "suffix" and "lone model" in props["drafter"], props
        body = {"prompt": PROMPTS[1], "max_tokens": 48, "temperature": 0, "ignore_eos": True}
        first = s.post("/v1/completions", body)[1]
        second = s.post("/v1/completions", body)[1]
        plain = s.post("/v1/completions", {**body, "speculative.type": "none"})[1]
        assert first["choices"][0]["text"] == second["choices"][0]["text"] == plain["choices"][0]["text"]
        assert second["usage"]["accepted_tokens"] >= 0.75 * 48 > first["usage"]["accepted_tokens"]
        kept = s.get("/props")[1]["speculative"]["kept"]
        assert kept["outputs"] >= 2 and kept["tokens"] >= 96 and kept["bytes"] > 0, kept
    finally:
        code, err = s.stop()
    assert code == 0, err


def test_a_request_names_suffix_on_a_server_with_a_draft_model(build_info):
    """A DFlash server holds suffix on standby with the n-gram types: a request naming it drafts
    from the text and answers what a plain request does."""
    from helpers.serving import LiveServer

    s = LiveServer("--pair", "tiny-coder", "--spec-draft-n-max", "7", "-np", "2", "-t", "1")
    try:
        assert "suffix" in s.get("/props")[1]["speculative"]["request_types"]
        body = {"prompt": STACK, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
        code, named = s.post("/v1/completions", {**body, "speculative.type": "suffix"})
        plain = s.post("/v1/completions", {**body, "speculative.type": "none"})[1]
        assert code == 200 and named["choices"][0]["text"] == plain["choices"][0]["text"]
        assert named["usage"]["draft_tokens"] > 0
    finally:
        code, err = s.stop()
    assert code == 0, err
