"""`ggspec serve` as llama-server: its own endpoints (/completion, /tokenize, /detokenize,
/apply-template, /props, /slots), `timings`, and speculation chosen per request.

The tiny pair's server is checked against `ggspec run`'s greedy text; the real Gemma 3 270M's
against llama.cpp's own llama-server of the same build, request for request."""

from __future__ import annotations

import http.client
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers.pairs import STACK
from helpers.serving import LiveServer, NativeServer, pair_fixtures

from ggspec.runtime import ContextParams
from ggspec.speculative.driver import drive
from ggspec.speculative.engine import Engine
from ggspec.speculative.lossless import compare
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request

PAIR = "tiny-coder"
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):"]
N = 32


refs, server = pair_fixtures(PAIR, PROMPTS, N)


def _stream(port: int, path: str, body: dict) -> list[dict]:
    """The `data: {...}` events of a streamed answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in resp.read().decode().splitlines() if line.startswith("data: {")]
    conn.close()
    return events


def _greedy(prompt: str, **kw) -> dict:
    return {"prompt": prompt, "n_predict": N, "temperature": 0, "ignore_eos": True, **kw}


# --- /completion -----------------------------------------------------------------------------------


def test_completion_is_greedy_run_whole_and_streamed(server, refs):
    """llama-server's native completion: the same text as `ggspec run`, its token ids, why it
    stopped, the request's settings and its timings with the speculative figures."""
    for prompt, want in refs.items():
        code, r = server.post("/completion", _greedy(prompt, return_tokens=True))
        assert code == 200, r
        assert r["content"] == want and r["stop"] is True and r["stop_type"] == "limit" and r["stopping_word"] == ""
        assert r["tokens_predicted"] == N == len(r["tokens"]) and r["tokens_evaluated"] > 0 and 0 <= r["id_slot"] < 4
        assert server.post("/detokenize", {"tokens": r["tokens"]})[1]["content"] == want
        t = r["timings"]
        assert t["predicted_n"] == N and t["draft_n"] >= t["draft_n_accepted"] > 0 and t["predicted_per_second"] > 0
        g = r["generation_settings"]
        assert g["temperature"] == 0 and g["n_predict"] == N and g["speculative.n_max"] == 7
        assert g["speculative.type"] == "draft-dflash"

        events = _stream(server.port, "/completion", _greedy(prompt))
        *pieces, last = events
        assert all(e["stop"] is False and e["tokens"] == [] for e in pieces) and last["stop"] is True
        assert "".join(e["content"] for e in events) == want
        assert last["timings"]["predicted_n"] == N and last["tokens_predicted"] == N


def test_completion_stops_at_a_stop_word_or_the_budget(server, refs):
    prompt, want = next((p, w) for p, w in refs.items() if "\n" in w)
    code, r = server.post("/completion", _greedy(prompt, stop=["\n"]))
    assert code == 200 and r["stop_type"] == "word" and r["stopping_word"] == "\n"
    assert r["content"] == want[:want.index("\n")]
    code, r = server.post("/completion", {**_greedy(prompt), "n_predict": 5})
    assert code == 200 and r["stop_type"] == "limit" and r["tokens_predicted"] == 5 and want.startswith(r["content"])
    code, r = server.post("/completion", {**_greedy(prompt), "n_predict": 0})  # the prompt alone
    assert code == 200 and r["content"] == "" and r["tokens_predicted"] == 0


def test_completion_stops_past_t_max_predict_ms_once_a_line_has_ended(server, refs):
    """llama-server's t_max_predict_ms (a per-request option: speculative/request.py): a prefix of
    the text that goes past its first line end, cut as a limit; 0 or less: no limit."""
    prompt, want = next((p, w) for p, w in refs.items() if "\n" in w[:-8])
    code, r = server.post("/completion", _greedy(prompt, t_max_predict_ms=1))
    assert code == 200 and r["stop_type"] == "limit" and "\n" in r["content"]
    assert want.startswith(r["content"]) and r["tokens_predicted"] < N
    code, r = server.post("/v1/completions", {"prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": True,
                                              "t_max_predict_ms": 1})
    assert code == 200 and r["choices"][0]["finish_reason"] == "length" and want.startswith(r["choices"][0]["text"])
    code, r = server.post("/completion", _greedy(prompt, t_max_predict_ms=-1))
    assert code == 200 and r["content"] == want
    code, r = server.post("/completion", _greedy(prompt, t_max_predict_ms=0.5))
    assert code == 400 and r["error"]["param"] == "t_max_predict_ms"


# --- speculation per request -----------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["/completion", "/v1/completions"])
def test_speculation_per_request_in_one_batch(server, refs, endpoint):
    """Requests with their own speculative settings, at once in the same steps: each gets the
    greedy text; `"speculative": false` drafts nothing, `speculative.n_max` bounds each draft,
    `speculative.n_min` drops shorter ones, `speculative.type` names the server's own type or
    adds an n-gram type it holds on standby, `speculative.p_min` cuts its drafts at a confidence."""
    settings = [{"speculative": False}, {"speculative.type": "none"}, {"speculative.n_max": 2},
                {"speculative.n_max": 7, "speculative.n_min": 5}, {}, {"speculative.type": "draft-dflash"},
                {"speculative.type": "ngram-mod,draft-dflash", "speculative.p_min": 0.9}]
    prompt, want = next(iter(refs.items()))

    def ask(extra: dict) -> dict:
        body = _greedy(prompt, **extra) if endpoint == "/completion" else {
            "prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": True, **extra}
        code, r = server.post(endpoint, body)
        assert code == 200, r
        return r

    with ThreadPoolExecutor(len(settings)) as pool:
        replies = list(pool.map(ask, settings))
    for extra, r in zip(settings, replies):
        text = r["content"] if endpoint == "/completion" else r["choices"][0]["text"]
        assert text == want, extra
        t = r["timings"]
        drafted, steps = t.get("draft_n", 0), (r["usage"]["spec_steps"] if "usage" in r else None)
        if extra.get("speculative") is False or extra.get("speculative.type") == "none":
            assert drafted == 0
        else:
            assert drafted > 0, extra
        if endpoint == "/completion":  # the request's own settings, as it ran
            g = r["generation_settings"]
            assert g["speculative.type"] == extra.get("speculative.type", "draft-dflash"
                                                      if extra.get("speculative") is not False else "none")
            assert g["speculative.p_min"] == extra.get("speculative.p_min", 0.0)
        if steps is not None and drafted:
            n_max, n_min = extra.get("speculative.n_max", 7), extra.get("speculative.n_min", 0)
            assert n_min * steps <= drafted <= n_max * steps, (extra, drafted, steps)


def test_a_request_drafts_with_a_standby_ngram_type(server):
    """A DFlash server holds the n-gram types too: a request naming ngram-cache drafts from the
    text's n-grams (the DFlash draft unused for it), lossless against the same server's plain
    answer; the settings it ran with say so."""
    body = _greedy(STACK, n_predict=48)
    plain = server.post("/completion", {**body, "speculative": False})[1]
    code, r = server.post("/completion", {**body, "speculative.type": "ngram-cache"})
    assert code == 200, r
    assert r["content"] == plain["content"] and r["timings"]["draft_n"] > 0
    assert r["generation_settings"]["speculative.type"] == "ngram-cache"
    held = server.get("/props")[1]["speculative"]["request_types"]
    assert held[-1] == "draft-dflash" and "ngram-cache" in held


# --- constrained output ----------------------------------------------------------------------------

ARGS = r'''root ::= "(" name ("," " " name)* "):" "\n"
name ::= [a-z_] [a-z_0-9]{0,7}'''
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"]}


def test_a_grammar_holds_under_speculation_and_equals_plain(server):
    """GBNF on both APIs and a JSON schema through response_format: speculative answers equal the
    same server's plain ones ("speculative": false) under the same constraint, and follow it."""
    prompt = "    def push"
    body = {"prompt": prompt, "n_predict": N, "temperature": 0, "grammar": ARGS}
    spec, plain = server.post("/completion", body), server.post("/completion", {**body, "speculative": False})
    assert spec[0] == plain[0] == 200 and spec[1]["content"] == plain[1]["content"]
    assert re.fullmatch(r"\([a-z_][a-z_0-9]{0,7}(, [a-z_][a-z_0-9]{0,7})*\):\n", spec[1]["content"]), spec[1]
    assert spec[1]["stop_type"] == "eos"  # the grammar complete: only an end token is left
    code, r = server.post("/v1/completions", {"prompt": prompt, "max_tokens": N, "temperature": 0, "grammar": ARGS})
    assert code == 200 and r["choices"][0]["text"] == spec[1]["content"] and r["choices"][0]["finish_reason"] == "stop"

    chat = {"messages": [{"role": "user", "content": "A person as JSON:"}], "max_tokens": 64, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}
    (c1, a), (c2, b) = server.post("/v1/chat/completions", chat), server.post("/v1/chat/completions",
                                                                             {**chat, "speculative": False})
    assert c1 == c2 == 200
    text = a["choices"][0]["message"]["content"]
    assert text == b["choices"][0]["message"]["content"]
    if a["choices"][0]["finish_reason"] == "stop":  # complete: valid JSON of the schema's shape
        person = json.loads(text)
        assert set(person) == {"name", "age"} and isinstance(person["age"], int)


# --- token probabilities ----------------------------------------------------------------------------


def test_token_probabilities_on_every_endpoint(server, refs):
    """n_probs (llama-server), logprobs (completions) and logprobs + top_logprobs (chat): one
    entry per generated token, the token's own log-probability among its row's likeliest (greedy:
    the first of them), the same entries streamed or whole and speculating or not."""
    prompt, want = next(iter(refs.items()))
    code, r = server.post("/completion", _greedy(prompt, n_probs=3, return_tokens=True))
    assert code == 200
    probs = r["completion_probabilities"]
    assert [e["id"] for e in probs] == r["tokens"] and "".join(e["token"] for e in probs) == want
    for e in probs:
        assert len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["id"] == e["id"]  # greedy: the likeliest
        assert e["logprob"] == e["top_logprobs"][0]["logprob"] <= 0
        assert [t["logprob"] for t in e["top_logprobs"]] == sorted((t["logprob"] for t in e["top_logprobs"]), reverse=True)
    streamed = [e for ev in _stream(server.port, "/completion", _greedy(prompt, n_probs=3))
                for e in ev.get("completion_probabilities", [])]
    plain = server.post("/completion", _greedy(prompt, n_probs=3, speculative=False))[1]["completion_probabilities"]
    assert [e["id"] for e in streamed] == [e["id"] for e in plain] == r["tokens"]
    for a, b in zip(probs, plain):  # the verify rows' probabilities are the plain rows' (to rounding)
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)

    code, r = server.post("/v1/completions", {"prompt": prompt, "max_tokens": N, "temperature": 0,
                                              "ignore_eos": True, "logprobs": 2})
    content = r["choices"][0]["logprobs"]["content"]
    assert code == 200 and len(content) == N and all(len(e["top_logprobs"]) == 2 for e in content)
    code, r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                                   "temperature": 0, "logprobs": True, "top_logprobs": 0})
    content = r["choices"][0]["logprobs"]["content"]
    assert code == 200 and len(content) == r["usage"]["completion_tokens"] and content[0]["top_logprobs"] == []


# --- several choices --------------------------------------------------------------------------------


def test_n_choices_are_sequences_of_their_own(server, refs):
    """`n`: one sequence per choice, batched together. Greedy, every choice is the greedy text;
    sampled with a seed, choice i is what a lone request with seed + i gets, streamed or whole."""
    prompt, want = next(iter(refs.items()))
    code, r = server.post("/v1/completions", {"prompt": prompt, "max_tokens": N, "temperature": 0,
                                              "ignore_eos": True, "n": 3})
    assert code == 200 and [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert all(c["text"] == want for c in r["choices"])
    assert r["usage"]["completion_tokens"] == 3 * N and r["usage"]["prompt_tokens"] < N

    sampled = {"max_tokens": 16, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "ignore_eos": True}
    msgs = [{"role": "user", "content": "def add(a, b):"}]
    code, r = server.post("/v1/chat/completions", {"messages": msgs, "n": 3, "seed": 7, **sampled})
    texts = [c["message"]["content"] for c in sorted(r["choices"], key=lambda c: c["index"])]
    alone = [server.post("/v1/chat/completions", {"messages": msgs, "seed": 7 + i, **sampled})[1]
             ["choices"][0]["message"]["content"] for i in range(3)]
    assert code == 200 and texts == alone and len(set(texts)) > 1
    streamed = ["", "", ""]
    for chunk in server.client.chat.completions.create(model=PAIR, messages=msgs, n=3, seed=7, stream=True,
                                                       max_tokens=16, temperature=1.0, top_p=1.0,
                                                       extra_body={"top_k": 0, "min_p": 0.0, "ignore_eos": True}):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == texts


# --- tokens, templates, the server's state ---------------------------------------------------------


def test_tokenize_detokenize_and_apply_template(server):
    code, r = server.post("/tokenize", {"content": "def f(x):"})
    assert code == 200 and all(isinstance(t, int) for t in r["tokens"])
    ids = r["tokens"]
    assert server.post("/detokenize", {"tokens": ids})[1] == {"content": "def f(x):"}
    pieces = server.post("/tokenize", {"content": "def f(x):", "with_pieces": True})[1]["tokens"]
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == "def f(x):"
    mixed = server.post("/tokenize", {"content": ["def", ids[-1]]})[1]["tokens"]
    assert mixed[-1] == ids[-1]
    assert server.post("/tokenize", {})[1] == {"tokens": []}
    code, r = server.post("/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and "hi" in r["prompt"] and r["prompt"].endswith("assistant\n")


def test_props_and_slots(server):
    code, props = server.get("/props")
    assert code == 200
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 1024
    params = props["default_generation_settings"]["params"]
    assert params["speculative.type"] == "draft-dflash" and params["speculative.n_max"] == 7
    assert props["speculative"]["spec_type"] == "draft-dflash" and props["build_info"].startswith("ggspec ")
    code, slots = server.get("/slots")
    assert code == 200 and [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == 1024 and s["speculative"] and not s["is_processing"] for s in slots)


# --- against llama-server, on a real model ---------------------------------------------------------


@pytest.mark.real
def test_answers_equal_llama_servers(build_info, real_target):
    """The same requests to llama-server and to ggspec serve (speculating with the pair's n-gram
    drafter) over Gemma 3 270M: the same tokens, texts, prompts and fields."""
    # (flash attention off in both: ggspec's verifying context has it off, and with it on the two
    # servers' kernels round differently; the oracle's margins are those of the same settings)
    ours = LiveServer("-m", str(real_target), "--spec-type", "ngram-simple", "--spec-draft-n-max", "8", "-np", "1",
                      "-c", "2048", "-fa", "off")
    theirs = NativeServer(build_info.lib_dir, real_target, "-np", "1", "-c", "2048", "-fa", "off")
    try:
        for body in ({"content": "Hello <start_of_turn>user\nhi"}, {"content": "x = 1", "add_special": True},
                     {"content": ["a b", 106, "c"], "with_pieces": True}, {"content": "naïve café ✓", "with_pieces": True}):
            assert ours.post("/tokenize", body) == theirs.post("/tokenize", body), body
        ids = theirs.post("/tokenize", {"content": "<start_of_turn>user\nnaïve<end_of_turn>", "parse_special": True})[1]
        assert ours.post("/detokenize", ids) == theirs.post("/detokenize", ids)
        chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]}
        assert ours.post("/apply-template", chat) == theirs.post("/apply-template", chat)

        for prompt in ("def is_prime(n):\n", "The capital of France is"):
            body = {"prompt": prompt, "n_predict": 24, "temperature": 0, "return_tokens": True}
            (c1, a), (c2, b) = ours.post("/completion", body), theirs.post("/completion", body)
            assert c1 == c2 == 200
            div = compare(b["tokens"], _margins(real_target, prompt, 24), a["tokens"])
            print(f"{prompt!r}: {'identical' if div is None else div.describe()} (llama-server = plain)")
            assert div is None or div.benign, div.describe()
            if div is None:
                assert a["content"] == b["content"]
                for key in ("stop_type", "stopping_word", "has_new_line"):
                    assert a[key] == b[key], key
            for key in ("tokens_predicted", "tokens_evaluated", "prompt"):
                assert a[key] == b[key], key
            assert set(b) <= set(a) and set(b["timings"]) <= set(a["timings"])
            assert set(b["generation_settings"]) & set(a["generation_settings"]) >= {"temperature", "top_k", "n_predict"}

        # a grammar: the same constraint in both (llama.cpp's grammar sampler)
        body = {"prompt": "Is the sky blue? Answer:", "n_predict": 16, "temperature": 0, "return_tokens": True,
                "grammar": 'root ::= " " ("yes" | "no") "," " " [a-z ]{1,40} "."'}
        (c1, a), (c2, b) = ours.post("/completion", body), theirs.post("/completion", body)
        assert c1 == c2 == 200 and a["tokens"] == b["tokens"] and a["content"] == b["content"], (a, b)

        # llama.cpp's reasoning budget (its own sampler through patch 0017): once the start tag is
        # out, so many tokens, then the message and the first end tag forced; without a message
        # field llama-server forces nothing (its handler does not run), and neither does ggspec
        for extra, forced in (({"reasoning_budget_tokens": 3, "reasoning_budget_start_tag": "if",
                                "reasoning_budget_end_tag": ":", "reasoning_budget_message": " BUDGET"}, True),
                              ({"reasoning_budget_tokens": 1, "reasoning_budget_start_tag": "if",
                                "reasoning_budget_end_tags": [":", "\n"], "reasoning_budget_message": ""}, False),
                              ({"reasoning_budget_tokens": 1, "reasoning_budget_start_tag": "if",
                                "reasoning_budget_end_tag": ":"}, False)):
            body = {"prompt": "def is_prime(n):\n", "n_predict": 40, "temperature": 0, "return_tokens": True, **extra}
            (c1, a), (c2, b) = ours.post("/completion", body), theirs.post("/completion", body)
            assert c1 == c2 == 200 and a["tokens"] == b["tokens"], (extra, a["content"], b["content"])
            assert (" BUDGET:" in a["content"]) == forced
            assert ours.post("/completion", {**body, "speculative": False})[1]["tokens"] == a["tokens"]

        # penalties and logit bias: the same samplers' arithmetic, over the same history (prompt included)
        body = {"prompt": "def is_prime(n):\n", "n_predict": 32, "temperature": 0, "return_tokens": True,
                "repeat_penalty": 1.3, "repeat_last_n": 32, "presence_penalty": 0.4, "frequency_penalty": 0.2,
                "logit_bias": [[" return", -2.5], [107, False]]}
        (c1, a), (c2, b) = ours.post("/completion", body), theirs.post("/completion", body)
        assert c1 == c2 == 200 and a["tokens"] == b["tokens"], (a["content"], b["content"])
        plain = ours.post("/completion", {**body, "speculative": False})[1]
        assert plain["tokens"] == a["tokens"]

        # token probabilities: the same tokens ranked alike, the same log-probabilities to rounding
        body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "n_probs": 4}
        (c1, a), (c2, b) = ours.post("/completion", body), theirs.post("/completion", body)
        assert c1 == c2 == 200
        for x, y in zip(a["completion_probabilities"], b["completion_probabilities"], strict=True):
            assert x["id"] == y["id"] and x["token"] == y["token"] and x["bytes"] == y["bytes"]
            assert [t["id"] for t in x["top_logprobs"]] == [t["id"] for t in y["top_logprobs"]]
            assert x["logprob"] == pytest.approx(y["logprob"], abs=1e-3)

        (_, a), (_, b) = ours.get("/props"), theirs.get("/props")
        assert set(b) - set(a) <= UI_ONLY_PROPS, set(b) - set(a)
        assert a["chat_template"] == b["chat_template"] and a["bos_token"] == b["bos_token"]
        assert a["total_slots"] == b["total_slots"] and a["default_generation_settings"]["n_ctx"] > 0
    finally:
        theirs.stop()
        code, err = ours.stop()
    assert code == 0, err


def _margins(target, prompt: str, n: int) -> list[float]:
    """The target's top-2 logit margin at each of its plain greedy tokens (the oracle's)."""
    with Engine.open(PairConfig(target, ctx=ContextParams(n_ctx=2048, n_threads=2, flash_attn="off")), plain=True) as e:
        ids = e.target_model.tokenize(prompt, add_special=True, parse_special=True)
        return [m for ev in drive(e, [Request(ids, n, speculate=False, record_margins=True)]) for m in ev.step.margins]


# /props fields of llama-server's web UI and media input, which ggspec serve has no use for
UI_ONLY_PROPS = {"ui", "ui_settings", "media_marker", "chat_template_caps", "cors_proxy_enabled", "model_ftype",
                 "chat_template_tool_use"}
