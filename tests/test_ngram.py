"""The n-gram proposer (llama.cpp's ngram-simple): the pure draft function on hand-made histories,
against a literal transcription of llama.cpp's loops on random ones, the proposer's protocol, and
llama.cpp's own speculative loop (llama-speculative-simple --spec-type ngram-simple) on the
trained tiny target: its drafted / accepted counts equal a simulation of that loop built from
ggspec's plain greedy continuation and this module's draft function."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
from helpers.drafts import sequence
from helpers.pairs import STACK, TARGET

from ggspec.errors import InputError
from ggspec.speculative.proposer import Draft, Span
from ggspec.speculative.request import Request
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.types.ngram import DEFAULT_SIZE_M, DEFAULT_SIZE_N, NgramProposer, ngram_simple_draft


def draft(history, size_n, size_m):
    """The draft after a full history (id_last last), as a list."""
    return ngram_simple_draft(history[:-1], history[-1], size_n, size_m).tolist()


def reference_draft(tokens, sampled, n, m):
    """common_ngram_simple_draft transcribed loop for loop (the spec the fast version must meet)."""
    cur_len = len(tokens)
    if cur_len <= n + m + 1:
        return []
    pattern = [tokens[j] for j in range(cur_len - n + 1, cur_len)] + [sampled]
    match_pos = 0
    for j in range(cur_len - n - 1, 0, -1):
        if all(tokens[j + k] == pattern[k] for k in range(len(pattern))):
            match_pos = j
            break
    if match_pos == 0:
        return []
    copy_max = min(m, cur_len - (match_pos + n))
    if copy_max < n:
        return []
    return [tokens[match_pos + n + j] for j in range(copy_max)]


# ---------------------------------------------------------------- the pure function

def test_defaults_are_llama_cpps():
    assert (DEFAULT_SIZE_N, DEFAULT_SIZE_M) == (12, 48)
    p = NgramProposer()
    assert (p.size_n, p.size_m, p.max_draft, p.name) == (12, 48, 48, "ngram-simple")


def test_match_drafts_what_followed_it():
    # the last 3 tokens (7 8 9, id_last 9) occurred before, followed by 10 11 12 13 14 ...
    h = [1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 23, 7, 8, 9]
    assert draft(h, 3, 4) == [10, 11, 12, 13]
    assert draft(h, 3, 6) == [10, 11, 12, 13, 14, 15]
    assert draft(h, 2, 4) == [10, 11, 12, 13]
    out = ngram_simple_draft(h[:-1], h[-1], 3, 4)
    assert out.dtype == np.int32 and out.ndim == 1


def test_id_last_is_part_of_the_pattern():
    h = [1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 23, 7, 8, 9]
    assert draft(h[:-1] + [5], 3, 4) == []  # 7 8 5 never occurred
    # the pattern is tokens[-(n-1):] + [sampled], not the last n of `tokens`
    assert ngram_simple_draft(h, 99, 3, 4).tolist() == []
    assert ngram_simple_draft(h[:-1], 9, 3, 4).tolist() == [10, 11, 12, 13]


def test_no_match_is_empty():
    h = list(range(100))
    assert draft(h, 1, 4) == [] and draft(h, 12, 48) == []


def test_too_short_a_history_drafts_nothing():
    # L = len(tokens) must exceed n + m + 1, whatever matches
    base = [1, 7, 8, 9, 10, 11, 12, 13, 14, 7, 8, 9]  # tokens: 11 entries, sampled 9
    assert len(base) - 1 == 11
    assert draft(base, 3, 7) == []  # 11 <= 3 + 7 + 1
    assert draft(base, 3, 6) == [10, 11, 12, 13, 14, 7]  # 11 > 10: 6 follow the match at j = 1
    assert draft([0] + base, 3, 7) == [10, 11, 12, 13, 14, 7, 8]  # one more token of history


def test_most_recent_occurrence_wins():
    a = [5, 6, 7, 30, 31, 32, 33, 34]
    b = [5, 6, 7, 40, 41, 42, 43, 44]
    h = [1] + a + b + [2, 3, 4, 9, 9, 5, 6, 7]
    assert draft(h, 3, 5) == [40, 41, 42, 43, 44]
    h = [1] + b + a + [2, 3, 4, 9, 9, 5, 6, 7]
    assert draft(h, 3, 5) == [30, 31, 32, 33, 34]


def test_a_too_short_recent_match_hides_an_older_long_one():
    # the most recent occurrence of [5 6 5] overlaps the current one (two tokens back): it leaves
    # 1 token before the end of the history (< n = 3), so no draft, although an older occurrence
    # has a long continuation
    older = [1, 5, 6, 5, 30, 31, 32, 33, 34, 35, 36, 37, 38, 9]
    assert draft(older + [5, 6, 5, 6, 5], 3, 5) == []
    assert draft(older + [7, 6, 5, 6, 5], 3, 5) == [30, 31, 32, 33, 34]  # no recent one: the older
    # the continuation may run into the current pattern itself: here exactly n tokens follow
    h = [1, 5, 6, 7, 30, 31, 32, 33, 34, 35, 36, 37, 38, 5, 6, 7, 50, 5, 6, 7]
    assert draft(h, 3, 5) == [50, 5, 6]


def test_position_zero_is_never_a_match():
    h = [5, 6, 7, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 5, 6, 7]
    assert draft(h, 3, 5) == []
    assert draft([0] + h, 3, 5) == [30, 31, 32, 33, 34]


def test_the_shift_by_one_occurrence_is_skipped():
    # a constant run: the pattern [5]*n also starts one token earlier (start L - n), which the
    # search never tries; the next start (shift 2) leaves one token, fewer than n >= 2
    h = [1, 2, 3] + [5] * 40
    assert draft(h, 2, 4) == [] and draft(h, 12, 8) == []
    assert draft(h, 1, 4) == [5]  # n = 1: one token is enough


@pytest.mark.parametrize("period", [3, 5, 12, 13, 14, 20, 60])
def test_periodic_history_drafts_period_minus_one(period):
    block = list(range(100, 100 + period))
    h = [1, 2] + block * 6 + block[:4]
    got = draft(h, DEFAULT_SIZE_N, DEFAULT_SIZE_M)
    want = 0 if period - 1 < DEFAULT_SIZE_N else min(period - 1, DEFAULT_SIZE_M)
    assert len(got) == want
    assert got == (block[4:] + block)[:want]  # the continuation of the cycle


def test_draft_length_is_capped_by_size_m_and_by_the_history():
    block = list(range(200, 260))  # period 60
    h = [1] + block * 3 + block[:12]
    assert len(draft(h, 12, 48)) == 48
    assert len(draft(h, 12, 100)) == 59
    assert len(draft(h, 4, 1)) == 0  # k = 1 < n
    assert draft(h, 1, 1) == [block[12]]


def test_accepts_lists_and_arrays_of_any_int_dtype():
    h = [1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 23, 7, 8, 9]
    for tokens in (h[:-1], np.array(h[:-1], dtype=np.int64), np.array(h[:-1], dtype=np.int32)):
        assert ngram_simple_draft(tokens, 9, 3, 4).tolist() == [10, 11, 12, 13]
    with pytest.raises(ValueError):
        ngram_simple_draft(h, 9, 0, 4)


@pytest.mark.parametrize("seed", range(6))
def test_equals_llama_cpps_loops_on_random_histories(seed):
    rng = np.random.default_rng(seed)
    drafted = 0
    for _ in range(400):
        n = int(rng.integers(1, 6))
        m = int(rng.integers(1, 10))
        vocab = int(rng.integers(2, 6))
        L = int(rng.integers(0, 90))
        if rng.random() < 0.5:  # repeated blocks with noise: many overlapping matches
            block = rng.integers(0, vocab, size=int(rng.integers(1, 15))).tolist()
            tokens = (block * (L // max(len(block), 1) + 1))[:L]
            for i in rng.integers(0, max(L, 1), size=int(rng.integers(0, 4))):
                if i < L:
                    tokens[i] = int(rng.integers(0, vocab))
        else:
            tokens = rng.integers(0, vocab, size=L).tolist()
        sampled = int(rng.integers(0, vocab))
        want = reference_draft(tokens, sampled, n, m)
        assert ngram_simple_draft(tokens, sampled, n, m).tolist() == want, (tokens, sampled, n, m)
        drafted += bool(want)
    assert drafted > 50  # the cases really exercise matches


@pytest.mark.parametrize("seed", range(3))
def test_equals_llama_cpps_loops_on_long_histories(seed):
    """Matches planted at every depth of a long history (the search runs in windows from the
    most recent start down), and none at all."""
    rng = np.random.default_rng(100 + seed)
    for depth in (None, 5, 900, 1030, 1100, 5100, 7990):
        n, m = int(rng.integers(1, 13)), int(rng.integers(1, 49))
        tokens = rng.integers(0, 3 if depth is None and n > 10 else 1000, size=8000).tolist()
        sampled = int(rng.integers(0, 1000))
        if depth is not None:
            pattern = tokens[len(tokens) - n + 1:] + [sampled]
            j = len(tokens) - n - 1 - depth
            tokens[j:j + n] = pattern
        want = reference_draft(tokens, sampled, n, m)
        assert ngram_simple_draft(tokens, sampled, n, m).tolist() == want, (depth, n, m)
    runs = [1, 2] + [5] * 5000  # a constant run: every start is a candidate
    assert ngram_simple_draft(runs, 5, 1, 4).tolist() == reference_draft(runs, 5, 1, 4) == [5]
    assert ngram_simple_draft(runs, 5, 3, 4).tolist() == reference_draft(runs, 5, 3, 4) == []


# ---------------------------------------------------------------- the proposer

def test_proposer_drafts_from_history_with_or_without_id_last_appended():
    block = list(range(100, 130))  # period 30: 29 tokens drafted with n 12
    prompt, gen = [1] + block * 2, block[:5]
    want = (block[5:] + block)[:29]
    p = NgramProposer()
    (d,) = p.propose([sequence(prompt, gen)], 48)
    assert isinstance(d, Draft) and d.probs is None and d.tokens.dtype == np.int32
    assert d.tokens.tolist() == want
    (d2,) = NgramProposer().propose([sequence(prompt, gen, include_id_last=False)], 48)
    assert d2.tokens.tolist() == want
    assert p.propose([sequence(prompt, gen)], 7)[0].tokens.tolist() == want[:7]  # n caps the draft
    assert len(p.propose([sequence(prompt, gen)], 0)[0]) == 0


def test_proposer_follows_a_growing_history_and_a_rewritten_one():
    block = list(range(100, 130))
    p = NgramProposer(size_n=4, size_m=8)
    s = sequence([1] + block * 2, block[:5])
    def ref(seq):
        return ngram_simple_draft(seq.history[:-1], seq.history[-1], 4, 8).tolist()

    for t in [7, 8, 9] + block[:20] + list(range(300, 600)):  # grows past the initial buffer
        got = p.propose([s], 8)[0].tokens.tolist()
        assert got == ref(s)
        s.tokens.append(t)
        s.history.append(t)
        s.id_last = t
    # a different sequence object with a shorter, different history: no stale state
    other = sequence([1] + block * 2, block[:5], seq_id=1)
    assert p.propose([s, other], 8)[1].tokens.tolist() == ref(other)
    # the same object rewritten in place (shorter history): recopied
    s.history, s.tokens = list(other.history), list(other.tokens)
    s.id_last = other.id_last
    assert p.propose([s], 8)[0].tokens.tolist() == ref(other)
    p.release(s)
    p.release(s)  # twice is harmless
    p.close()


def test_proposer_does_not_draft_before_the_prompt_is_decoded():
    s = Sequence(0, Request(np.arange(200, dtype=np.int32) % 7, 10))
    assert not s.started
    assert len(NgramProposer(1, 4).propose([s], 4)[0]) == 0


@pytest.mark.parametrize("kw", [{"size_n": 0}, {"size_m": 0}, {"size_n": 1025}, {"size_m": 2.5},
                                {"size_n": True}])
def test_bad_sizes_are_input_errors(kw):
    with pytest.raises(InputError):
        NgramProposer(**kw)


def test_the_engine_s_other_calls_change_nothing_it_drafts():
    """ngram-simple reads no target features: begin, observe, commit (its own draft or another
    type's), flush and hold leave its drafts those of a fresh proposer; it holds none of a
    sequence's positions (release returns what the prompt cache keeps), and after release and close
    it drafts from the history again."""
    block = list(range(100, 130))
    s = sequence([1] + block * 2, block[:5])
    want = NgramProposer().propose([s], 48)[0].tokens.tolist()
    assert len(want) == 29
    p = NgramProposer()
    pos = len(s.history) - 1
    p.begin(s, cached=3)
    p.observe([Span(s.seq_id, 0, 1, pos, np.array([s.id_last], dtype=np.int32))])
    p.flush()
    assert p.propose([s], 48)[0].tokens.tolist() == want
    p.commit(s, pos, 1)
    p.commit(s, pos, 3, other=True)
    p.hold()
    assert p.propose([s], 48)[0].tokens.tolist() == want
    assert p.release(s, keep=7) == 7 and p.release(s) == 0
    assert p.propose([s], 48)[0].tokens.tolist() == want
    p.close()
    assert p.propose([s], 48)[0].tokens.tolist() == want


# ---------------------------------------------------------------- llama.cpp's own loop

def simulate_speculative_simple(inp, greedy, n_predict, n_ctx, size_n, size_m, is_eog):
    """llama-speculative-simple's loop (examples/speculative-simple) with greedy acceptance, the
    target's verify replaced by its plain greedy continuation `greedy` of the prompt `inp`.
    Returns (n_predict, n_drafted, n_accept) as the tool prints them."""
    prompt_tgt = [int(t) for t in inp[:-1]]  # the target context, without id_last
    id_last = int(inp[-1])
    gen = drafted = accepted = 0
    while True:
        n_draft_max = max(min(n_ctx - len(prompt_tgt) - 2, n_predict - gen - 1), 0)
        d = ngram_simple_draft(prompt_tgt, id_last, size_n, size_m).tolist()
        if n_draft_max > 0:  # llama.cpp truncates only for n_max > 0
            d = d[:n_draft_max]
        a = 0
        while a < len(d) and d[a] == greedy[gen + a]:
            a += 1
        ids = greedy[gen:gen + a + 1]
        drafted += len(d)
        accepted += a
        gen += a + 1
        eos = False
        for t in ids:
            prompt_tgt.append(id_last)
            id_last = int(t)
            if is_eog(id_last):
                eos = True
                break
        if gen > n_predict or eos:
            return gen, drafted, accepted


def plain_greedy(ctx, prompt, n):
    """n tokens of plain greedy decoding, one target decode per token (ggspec.runtime directly,
    independent of the engine)."""
    from ggspec.runtime import Batch

    assert len(prompt) <= ctx.n_batch
    with Batch(ctx) as batch:
        batch.clear().add_tokens(prompt, 0, outputs="last")
        ctx.decode(batch)
        out = [int(ctx.argmax_rows()[-1])]
        while len(out) < n:
            batch.clear().add_tokens([out[-1]], len(prompt) + len(out) - 1, outputs="last")
            ctx.decode(batch)
            out.append(int(ctx.argmax_rows()[-1]))
    return out


NATIVE_CASES = [
    (STACK, 160, None, None),
    (STACK, 160, 3, 8),
    ("for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\n", 200, 2, 5),
    ("def f(x):\n    return x\n\n" * 6, 120, 12, 48),
    # short-period repeats: the most recent match is too short and the older, long ones must be
    # ignored (searching on past the first match would draft ~160 tokens here, not 8 / 176)
    ("x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n", 200, 4, 8),
    ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n", 200, 3, 6),
]


@pytest.fixture(scope="module")
def native_tool(build_info):
    from ggspec.bench.native import find_tool

    try:
        return find_tool()
    except InputError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tiny_target(build_info):
    from ggspec.runtime import Context, ContextParams, Model

    with Model(TARGET) as model:
        yield model, lambda: Context(model, ContextParams(n_ctx=2048, n_threads=1, type_k="f16", type_v="f16",
                                                           flash_attn="off"))


@pytest.mark.parametrize("prompt, n, size_n, size_m", NATIVE_CASES)
def test_counts_equal_llama_speculative_simple(native_tool, tiny_target, prompt, n, size_n, size_m):
    model, make_ctx = tiny_target
    sn, sm = size_n or DEFAULT_SIZE_N, size_m or DEFAULT_SIZE_M
    cmd = [str(native_tool), "-m", str(TARGET), "--spec-type", "ngram-simple", "-p", prompt, "-n", str(n),
           "--temp", "0", "-t", "1", "-c", "2048", "-ctk", "f16", "-ctv", "f16", "-fa", "off"]
    if size_n:
        cmd += ["--spec-ngram-simple-size-n", str(size_n), "--spec-ngram-simple-size-m", str(size_m)]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cpp = {k: int(re.search(rf"{k}\s*=\s*(\d+)", proc.stderr).group(1)) for k in ("n_predict", "n_drafted", "n_accept")}

    inp = model.tokenize(prompt, add_special=True, parse_special=True)  # common_tokenize(.., true, true)
    with make_ctx() as ctx:
        greedy = plain_greedy(ctx, inp, n + sm + 2)
    g, d, a = simulate_speculative_simple(inp, greedy, n, 2048, sn, sm, model.is_eog)
    # the same text first, else the counts could not agree
    text = model.detokenize(greedy[:g])
    assert text in proc.stdout, f"llama.cpp's text differs from ggspec's greedy:\n{proc.stdout!r}\n{text!r}"
    print(f"\nngram-simple n={sn} m={sm}: llama.cpp n_predict {cpp['n_predict']} drafted {cpp['n_drafted']} "
          f"accepted {cpp['n_accept']}; ggspec {g} / {d} / {a}")
    assert (g, d, a) == (cpp["n_predict"], cpp["n_drafted"], cpp["n_accept"])
    assert d > 0  # the case really drafts
