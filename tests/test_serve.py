"""`ggspec serve` against a live server on loopback, driven by OpenAI's Python client (and raw
HTTP where the client would refuse to send what is being tested)."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import run_cli
from helpers.serving import LiveServer, pair_fixtures

from ggspec.server.text import TextStream

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[1]
PAIR = "tiny-coder"
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "The quick brown fox",
           "import os\nimport sys\n\n"]
N = 40


refs, server4 = pair_fixtures(PAIR, PROMPTS, N, server_name="server4")


def _complete(s: LiveServer, prompt: str, stream: bool, **kw) -> tuple[str, str | None, dict | None]:
    """(text, finish reason, usage) of one completion through OpenAI's client."""
    args = dict(model=PAIR, prompt=prompt, max_tokens=N, temperature=0, extra_body={"ignore_eos": True})
    args.update(kw)
    if not stream:
        r = s.client.completions.create(**args)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.model_dump()
    text, finish, usage = "", None, None
    for chunk in s.client.completions.create(**args, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    return text, finish, usage


# --- lossless: the server's greedy text is `ggspec run`'s ------------------------------------------


@pytest.mark.parametrize("parallel", [1, 4])
def test_greedy_completions_equal_run_streamed_or_not_with_concurrent_clients(build_info, refs, parallel, server4):
    """Every prompt twice (streamed and whole) from 8 concurrent clients: each text is `ggspec
    run`'s, token for token, at -np 1 (requests queue) and -np 4 (batched in each step)."""
    s = server4 if parallel == 4 else LiveServer("--pair", PAIR, "-np", "1", "--no-cache-prompt", "--spec-draft-n-max", "7")
    try:
        jobs = [(p, stream) for p in PROMPTS for stream in (False, True)]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda j: _complete(s, *j), jobs))
        for (p, stream), (text, finish, usage) in zip(jobs, results):
            assert text == refs[p], (p, stream)
            assert finish == "length" and usage["completion_tokens"] == N
            assert usage["spec_steps"] > 0 and usage["draft_tokens"] >= usage["accepted_tokens"] > 0
            steps = usage["spec_steps"]
            assert usage["tau"] == pytest.approx((usage["accepted_tokens"] + steps) / steps, abs=1e-3)
            if parallel == 1:
                assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        if s is not server4:
            assert s.stop()[0] == 0


def test_a_repeated_prompt_comes_from_the_prompt_cache(server4, refs):
    """The second time, every prompt token but the last is in its slot's cells already: only
    one is decoded, and the answer is the same."""
    hits = server4.metric("ggspec:prefix_cache_hit_tokens_total", model_name=PAIR)
    p = "def fibonacci(n):\n    # the cache"
    first = _complete(server4, p, stream=False)
    second = _complete(server4, p, stream=True)
    assert second[0] == first[0]
    n_prompt = second[2]["prompt_tokens"]
    assert first[2]["prompt_tokens_details"]["cached_tokens"] < n_prompt - 1
    assert second[2]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1
    assert server4.metric("ggspec:prefix_cache_hit_tokens_total", model_name=PAIR) - hits >= n_prompt - 1
    assert server4.get("/v1/models")[1]["data"][0]["meta"]["prompt_cache"] is True
    # llama-server's "cache_prompt": false decodes the whole prompt (a cached prompt's last token
    # is decoded alone, which on real models can tip a later token)
    third = _complete(server4, p, stream=False, extra_body={"ignore_eos": True, "cache_prompt": False})
    assert third[0] == first[0] and third[2]["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_hybrid_targets_next_turn_reuses_its_cells_through_checkpoints(build_info, hybrid_pair):
    """A qwen35 target over HTTP: a prompt, then the same prompt with more text after it: the
    second request's cached_tokens count the first prompt (its checkpoint), /slots lists the
    slot's checkpoints, and the text equals the uncached request's (cache_prompt false)."""
    s = LiveServer("-m", str(hybrid_pair.target), "--no-spec", "-np", "1", "-c", "1024", "-t", "1",
                   "--ctx-checkpoints", "4")
    try:
        def complete(prompt: str, cache: bool = True):
            code, doc = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                   "ignore_eos": True, "cache_prompt": cache})
            assert code == 200, doc
            return doc["choices"][0]["text"], doc["usage"]
        first, usage = complete("def fibonacci(n):")
        n_first = usage["prompt_tokens"]
        cache = s.get("/slots")[1][0]["cache"]
        assert cache["n_tokens_kept"] == n_first + 11 and cache["checkpoints"][-1] == n_first
        assert cache["checkpoint_bytes"] > 0 and len(cache["checkpoints"]) <= 4
        turn = "def fibonacci(n):" + first[:5] + "\n\ndef g(x):"
        text, usage = complete(turn)
        assert usage["prompt_tokens_details"]["cached_tokens"] >= n_first - 4  # (a checkpoint near its end)
        assert text == complete(turn, cache=False)[0]
        assert s.get("/props")[1]["speculative"]["ctx_checkpoints"] == 4
    finally:
        assert s.stop()[0] == 0


def test_a_prompt_pushed_out_of_its_slot_comes_back_from_host_memory(build_info, refs):
    """One slot, two prompts in turn: the second overwrites the first one's cells, which the
    server saved (--cache-ram); the first prompt's next request loads them and decodes one token,
    and its text is still `ggspec run`'s."""
    s = LiveServer("--pair", PAIR, "-np", "1", "--cache-ram", "64")
    try:
        a, b = PROMPTS[0], PROMPTS[1]
        for p in (a, b):
            assert _complete(s, p, stream=False)[0] == refs[p]
        text, _, usage = _complete(s, a, stream=True)
        assert text == refs[a]
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        assert s.get("/v1/models")[1]["data"][0]["meta"]["cache_ram_mib"] == 64
    finally:
        assert s.stop()[0] == 0


def test_chat_is_the_template_rendered_then_completed(server4, build_info):
    """A model without a chat template gets llama.cpp's chatml (as llama-server): the chat answer
    is `ggspec run`'s greedy continuation of that rendered text; streamed the same. Text parts of
    one message are joined by a newline, as llama.cpp's chat code joins them."""
    rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\ndef add\n(a, b):<|im_end|>\n<|im_start|>assistant\n"
    proc = run_cli("run", "--pair", PAIR, "-p", rendered, "-n", "24", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    want = proc.stdout[len(rendered):-1]
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "def add"}, {"type": "text", "text": "(a, b):"}]}]
    args = dict(model=PAIR, messages=messages, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    r = server4.client.chat.completions.create(**args)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.object == "chat.completion" and r.usage.completion_tokens == 24
    chunks = list(server4.client.chat.completions.create(**args, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_strings_cut_the_text_streamed_or_not(server4, refs):
    p = PROMPTS[0]
    full = refs[p]
    stop = full[len(full) // 2:len(full) // 2 + 3]  # a few characters from the middle
    cut = full[:full.find(stop)]
    for stream in (False, True):
        text, finish, usage = _complete(server4, p, stream, stop=[stop, "never-there"])
        assert (text, finish) == (cut, "stop")
        assert usage["completion_tokens"] <= N


def test_models_health_and_metrics(server4):
    status, models = server4.get("/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == [PAIR]
    meta = models["data"][0]["meta"]
    assert meta["speculative"] and meta["n_max"] == 7 and meta["parallel"] == 4 and meta["n_ctx_slot"] == 1024
    assert server4.client.models.list().data[0].id == PAIR
    h = server4.health()
    assert h["status"] == "ok" and h["slots_idle"] + h["slots_processing"] == 4
    before = {k: server4.metric(f"ggspec:{k}_total", model_name=PAIR) for k in
              ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens", "generation_tokens")}
    pos0 = server4.metric("ggspec:spec_decode_num_accepted_tokens_per_pos_total", position="0")
    _, _, usage = _complete(server4, PROMPTS[2], stream=False)
    after = {k: server4.metric(f"ggspec:{k}_total", model_name=PAIR) for k in before}
    assert after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"] == usage["draft_tokens"]
    assert after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"] == usage["accepted_tokens"]
    assert after["generation_tokens"] - before["generation_tokens"] == N
    assert server4.metric("ggspec:spec_decode_num_accepted_tokens_per_pos_total", position="0") > pos0
    text = server4.get("/metrics")[1]
    for name in ("ggspec:request_success_total", "ggspec:prompt_tokens_total", "ggspec:engine_steps_total",
                 "ggspec:spec_decode_num_drafts_total", "ggspec:spec_decode_num_replays_total",
                 "ggspec:num_requests_running", "ggspec:num_requests_waiting", "ggspec:time_to_first_token_seconds",
                 'ggspec:step_seconds_total{model_name="tiny-coder",phase="verify"}'):
        assert name in text, name


# --- sampling --------------------------------------------------------------------------------------


def test_a_seed_reproduces_a_sampled_answer_alone_or_batched(server4):
    """Sampling over the whole distribution (top-k, top-p, min-p off): the same seed gives the
    same text alone and beside other requests; other seeds give other text."""
    def sampled(seed: int, stream: bool = True) -> str:
        return _complete(server4, PROMPTS[1], stream, seed=seed, temperature=0.9, top_p=1.0,
                         extra_body={"ignore_eos": True, "top_k": 0, "min_p": 0.0})[0]

    alone = sampled(7, stream=False)
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(sampled, [7, 8, 7, 9]))
    assert texts[0] == texts[2] == alone
    assert texts[1] != alone or texts[3] != alone


# --- bad requests: 4xx with OpenAI's error body, and the server goes on ------------------------------


@pytest.mark.parametrize("path, body, status, param, needle", [
    ("/v1/completions", b"{not json", 400, None, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, None, "must be a JSON object"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens", "valid integer"),
    ("/v1/completions", {"prompt": "x", "temperature": True}, 400, "temperature", "valid number"),
    ("/v1/completions", {"prompt": "x", "n": 17}, 400, "n", "less than or equal to 16"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"999999": -5}}, 400, "logit_bias", "outside the vocabulary"),
    ("/v1/completions", {"prompt": "x", "repeat_last_n": -2}, 400, "repeat_last_n", "greater than or equal to -1"),
    ("/v1/completions", {"prompt": "x", "logprobs": 25}, 400, "logprobs", "less than or equal to 20"),
    ("/v1/completions", {"prompt": "x", "grammar": "root ::= nope"}, 400, "grammar", "cannot parse this grammar"),
    ("/v1/completions", {"prompt": "x", "grammar": "root ::= [a-z]+", "json_schema": {}}, 400, "json_schema",
     "not both"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "xml"}}, 400, "response_format.type", "'json_schema'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= [a-z]+", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {}}}]}, 400, "grammar", "with tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": {
        "type": "function", "function": {"name": "g"}}, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {}}}]}, 400, "tool_choice", "not among the tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages", "must contain 'content'"),
    ("/v1/completions", {"prompt": "x", "speculative.n_max": 99}, 400, "speculative.n_max", "within 0..7"),
    ("/v1/completions", {"prompt": "x", "speculative.n_max": 2, "speculative.n_min": 3}, 400, "speculative.n_min",
     "within 0..2"),
    ("/v1/completions", {"prompt": "x", "speculative.type": "draft-simple"}, 400, "speculative.type",
     "drafts with ngram-simple"),
    ("/v1/completions", {"prompt": "x", "speculative.type": "ngram-nope"}, 400, "speculative.type",
     "unknown speculative type"),
    ("/v1/completions", {"prompt": "x", "speculative.p_min": 1.5}, 400, "speculative.p_min", "less than or equal to 1"),
    ("/v1/completions", {"prompt": "x", "speculative": "off"}, 400, "speculative", "valid boolean"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
    ("/v1/completions", {"prompt": [5, 999999]}, 400, "prompt", "outside the vocabulary"),
    ("/v1/completions", {}, 400, "prompt", "'prompt' is required"),
    ("/v1/completions", {"prompt": "x", "seed": -1}, 400, "seed", "greater than or equal to 0"),
    ("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model", "does not exist here"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", "at least 1"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role", "'user'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages.0.content.0.type", "'text'"),
    ("/v1/nope", {}, 404, None, "no route POST /v1/nope"),
    ("/tokenize", {"content": [5, -1]}, 400, "content.1", "greater than or equal to 0"),
    ("/detokenize", {"tokens": [999999]}, 400, "tokens", "outside the vocabulary"),
    ("/completion", {"prompt": "x", "n_predict": -2}, 400, "n_predict", "greater than or equal to -1"),
    ("/completion", {"prompt": "x", "n_probs": 500}, 400, "n_probs", "less than or equal to 100"),
    ("/apply-template", {"messages": []}, 400, "messages", "at least 1"),
])
def test_bad_requests_get_4xx_with_an_error_body(server4, path, body, status, param, needle):
    """llama-server's error body (`code` the HTTP status, llama-server's `type`), with the field
    at fault as OpenAI's `param`."""
    code, reply = server4.post(path, body)
    assert code == status, reply
    err = reply["error"]
    assert needle in err["message"] and err["param"] == param and err["code"] == status, err
    assert err["type"] == {400: "invalid_request_error", 404: "not_found_error"}[status]
    assert server4.health()["status"] == "ok"


def test_fields_the_server_does_not_know_are_ignored(server4, refs):
    """As llama-server (and OpenAI-compatible servers): an unknown field changes nothing."""
    code, reply = server4.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": N, "temperature": 0,
                                                   "ignore_eos": True, "best_of_n": 3, "x_vendor": {"a": 1}})
    assert code == 200 and reply["choices"][0]["text"] == refs[PROMPTS[0]]


def test_context_overflow_is_a_400_before_any_decode(server4):
    steps = server4.metric("ggspec:engine_steps_total", model_name=PAIR)
    code, reply = server4.post("/v1/completions", {"prompt": "def f(x):", "max_tokens": 1020})
    err = reply["error"]
    assert code == 400 and err["type"] == "exceed_context_size_error" and err["n_ctx"] == 1024 and err["n_prompt_tokens"] > 0
    assert re.search(r"needs \d+ prompt \+ 1020 generated \+ 8 draft-block positions, but a slot holds 1024: lower "
                     r"max_tokens to at most \d+", reply["error"]["message"]), reply
    long = "x = 1\n" * 600  # over the 1024-token slot by itself
    code, reply = server4.post("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]})
    assert code == 400 and reply["error"]["param"] == "prompt" and "the context holds 1024" in reply["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        server4.client.completions.create(model=PAIR, prompt="x", max_tokens=5000)
    assert server4.metric("ggspec:engine_steps_total", model_name=PAIR) == steps  # nothing was decoded
    code, _ = server4.post("/v1/completions", {"prompt": "def f(x):", "max_tokens": 8})
    assert code == 200


def test_a_get_on_a_post_route_is_405(server4):
    code, reply = server4.get("/v1/completions")
    assert code == 405 and "GET is not allowed" in reply["error"]["message"]


# --- slots: overload, disconnects, drain -----------------------------------------------------------


def _open_stream(s: LiveServer, max_tokens: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streaming completion whose first chunk has arrived (the connection stays open)."""
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "def f(x):", "max_tokens": max_tokens,
                                                         "temperature": 0, "stream": True, "ignore_eos": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return conn, resp


def _wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    t_end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < t_end, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_overload_is_a_503_and_a_disconnect_frees_the_slot(build_info):
    """One slot, a queue of one: the third concurrent request is refused (503, before any
    decode); a client that hangs up mid-stream frees its slot at the next step (the queued
    request starts), and one that hangs up while queued never starts."""
    s = LiveServer("--pair", PAIR, "-np", "1", "-c", "16384", "--max-queue", "1", "--no-spec")
    try:
        a, ra = _open_stream(s, 16000)
        assert ra.readline().startswith(b"data: ")
        _wait_for(lambda: s.health()["slots_processing"] == 1, "the first request to run")
        b = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        b.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 16000, "stream": True,
                                                          "ignore_eos": True}), {"Content-Type": "application/json"})
        _wait_for(lambda: s.health()["requests_waiting"] == 1, "the second request to queue")
        code, reply = s.post("/v1/completions", {"prompt": "x", "max_tokens": 4})
        err = reply["error"]
        assert code == 503 and err["type"] == "unavailable_error" and "retry later" in err["message"]
        with pytest.raises(openai.InternalServerError):  # the client's class for a 503
            s.client.completions.create(model=PAIR, prompt="x", max_tokens=4)
        assert s.metric("ggspec:request_rejected_total", reason="overloaded") == 2
        a.close()  # hang up mid-stream: the queued request gets the slot
        _wait_for(lambda: s.health()["requests_waiting"] == 0 and s.health()["slots_processing"] == 1,
                  "the queued request to start")
        assert s.metric("ggspec:request_success_total", finished_reason="abort") == 1
        b.close()
        _wait_for(lambda: s.health()["slots_processing"] == 0, "the slot to be freed")
        assert s.metric("ggspec:request_success_total", finished_reason="abort") == 2
        code, reply = s.post("/v1/completions", {"prompt": "def f(x):", "max_tokens": 8, "temperature": 0})
        assert code == 200 and reply["usage"]["completion_tokens"] <= 8
    finally:
        code, err = s.stop()
    assert code == 0, err


def test_sigterm_drains_the_requests_in_progress_then_exits_0(build_info):
    s = LiveServer("--pair", PAIR, "-np", "2")
    conn, resp = _open_stream(s, 600)
    first = resp.readline()
    assert first.startswith(b"data: ")
    s.proc.send_signal(signal.SIGTERM)
    body = first + resp.read()  # the stream goes on to its end
    events = [json.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: {")]
    assert body.rstrip().endswith(b"data: [DONE]") and events[-1]["choices"][0]["finish_reason"] == "length"
    conn.close()
    s.proc.wait(timeout=60)  # it exits by itself (a second SIGTERM, from stop(), would end its teardown)
    code, err = s.stop()
    assert code == 0, err
    assert "stopped: 1 requests answered, 600 tokens generated" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args, needle", [
    (["--port", "0"], "--port 0: expected a port number"),
    (["--max-queue", "-1"], "--max-queue -1: expected 0 or more"),
    (["--cache-ram", "-2"], "--cache-ram -2: expected MiB (-1: no limit, 0: off)"),
    (["--host", "no-such-host.invalid"], "--host no-such-host.invalid: not an IPv4 address"),
    (["--chat-template", "nonesuch"], "unknown built-in chat template 'nonesuch' (llama.cpp has: "),
    (["--chat-template-file", "/nonexistent.jinja"], "cannot read the chat template file /nonexistent.jinja"),
    (["-np", "0"], "-np"),
])
def test_serve_refuses_bad_options_in_one_line(build_info, args, needle):
    proc = run_cli("serve", "--pair", PAIR, *args, timeout=60)
    assert proc.returncode == 1 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_port_in_use_is_one_line(build_info):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = run_cli("serve", "--pair", PAIR, "--port", str(port), timeout=60)
    assert proc.returncode == 1 and f"cannot listen on 127.0.0.1:{port}: the port is in use" in proc.stderr


def test_a_jinja_template_file_renders_the_chat(build_info, tmp_path):
    """--chat-template-file: rendered by llama.cpp's Jinja engine (add_generation_prompt,
    raise_exception), as llama-server; a template that raises is the request's 400 in one line,
    not a 500; /apply-template renders with it too."""
    tmpl = tmp_path / "t.jinja"
    tmpl.write_text("{% for m in messages %}{% if m.content == 'boom' %}{{ raise_exception('no boom') }}"
                    "{% endif %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[bot]"
                    "{% endif %}")
    s = LiveServer("--pair", PAIR, "-np", "1", "--chat-template-file", str(tmpl))
    try:
        rendered = "[user] def add(a, b):\n[bot]"
        proc = run_cli("run", "--pair", PAIR, "-p", rendered, "-n", "16", "--ignore-eos")
        r = s.client.chat.completions.create(model=PAIR, messages=[{"role": "user", "content": "def add(a, b):"}],
                                             max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].message.content == proc.stdout[len(rendered):-1]
        code, reply = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "boom"}]})
        assert code == 400 and reply["error"]["message"] == "the chat template refused these messages: Jinja Exception: no boom"
        code, reply = s.post("/apply-template", {"messages": [{"role": "system", "content": "Be brief."},
                                                             {"role": "user", "content": "hi"}]})
        assert code == 200 and reply["prompt"] == "[system] Be brief.\n[user] hi\n[bot]"
    finally:
        assert s.stop()[0] == 0


def test_load_script_passes_its_checks(build_info):
    """scripts/serve_load.py, small: 8 clients, 48 requests, every greedy output equal to its solo
    run, no errors, memory flat after the warm-up, a clean exit on SIGTERM."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve_load.py"), "--serve", f"--pair {PAIR} -np 4",
                           "--clients", "8", "--requests", "48", "--max-tokens", "24", "--json"],
                          check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["errors"] == 0 and summary["outputs_differing_from_solo"] == 0 and summary["server_exit"] == 0
    assert summary["tokens"] == 48 * 24 and summary["throughput_tps"] > 0


# --- text: UTF-8 and stop strings (no model needed) --------------------------------------------------


def _pieces(*parts: bytes):
    table = dict(enumerate(parts))
    return TextStream(table.__getitem__), list(table)


def test_text_stream_waits_for_a_split_character():
    stream, ids = _pieces("é".encode()[:1], "é".encode()[1:] + b"x")
    assert stream.push([ids[0]]) == "" and stream.push([ids[1]]) == "éx"


def test_text_stream_holds_back_a_possible_stop_string_and_cuts_at_it():
    table = {0: b"Hello, wor", 1: b"ld! END", 2: b"ING more"}
    s = TextStream(table.__getitem__, ["END!", "ld!"])
    assert s.push([0]) == "Hello, wor" and s.push([1]) == "" and s.stopped and s.text == "Hello, wor"
    s = TextStream(table.__getitem__, ["ENDING"])
    out = s.push([0]) + s.push([1])
    assert out == "Hello, world! " and not s.stopped  # "END" held back
    assert s.push([2]) == "" and s.stopped and s.text == "Hello, world! "
    s = TextStream(table.__getitem__, ["END."])
    assert s.push([0, 1]) == "Hello, world! " and s.finish() == "END"  # never completed: released at the end
