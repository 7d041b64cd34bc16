"""Tool calls and structured output the way llama-server does them (llama.cpp's chat code through
patch 0017): the model's Jinja template with tools, the lazy or required tool-call grammar,
tool calls parsed into OpenAI's `tool_calls`, whole and streamed.

The real Qwen2.5-Coder pair (its template has Hermes-style <tool_call> tools) against llama-server
of the same build: speculating with its 0.5B draft, ggspec gives the same messages. The tiny pair
checks the library pieces (grammar triggers, parser deltas, the schema converter) and that a lazy
grammar changes nothing in greedy speculation's losslessness.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.pairs import CPP_CTX, DRAFT, STACK, TARGET
from helpers.serving import LiveServer, NativeServer

from ggspec.catalogue.pairs import check_files, get_entry, resolve
from ggspec.runtime.chat import ChatError, ChatParser, ChatTemplates, grammar_spec, json_schema_to_grammar
from ggspec.runtime.grammar import Grammar, GrammarSpec
from ggspec.speculative.driver import drive
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request

CODER = "qwen2.5-coder-1.5b"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# the 1.5B coder answers a tool question in a JSON code block; an assistant turn begun with
# <tool_call> (llama-server's assistant prefill) makes it call the tool
CALL = [{"role": "user", "content": "Weather in Paris and in Rome?"}, {"role": "assistant", "content": "<tool_call>\n"}]


# --- the library, on the tiny pair ------------------------------------------------------------------


def test_a_lazy_grammar_waits_for_its_trigger_then_constrains():
    with Engine.open(PairConfig(TARGET, ctx=CPP_CTX), plain=True) as e:
        model = e.target_model
        spec = GrammarSpec('root ::= "CALL(" [a-z]+ ")"', lazy=True, trigger_patterns=("CALL\\(",))
        g = Grammar(model, spec)
        free = model.tokenize(" x = 1\n", add_special=False).tolist()
        assert g.cut(free) == len(free)  # anything goes before the trigger
        for t in free + model.tokenize(" CALL(", add_special=False).tolist():
            g.accept(t)
        assert g.allows(model.tokenize("abc", add_special=False)[0])
        assert not g.allows(model.tokenize("123", add_special=False)[0])  # woken: constrained
        g.close()


def test_greedy_speculation_under_a_lazy_grammar_equals_plain():
    """Draft-simple at n_max 6 under a lazy grammar that wakes inside the text: the plain greedy
    tokens under the same grammar, and where it woke, the grammar's shape to the end."""
    spec = GrammarSpec('root ::= "self." [a-z_]{1,12} (" " [a-z=_.()\\[\\]]{1,12}){0,6} "\\n"', lazy=True,
                       trigger_patterns=("self\\.",))
    prompts = [STACK, STACK + "        return self.items.pop()\n\n"]

    def decode(engine):
        ids = [engine.target_model.tokenize(p) for p in prompts]
        out = {i: [] for i in range(len(prompts))}
        for ev in drive(engine, [Request(x, 40, tag=i, grammar=spec) for i, x in enumerate(ids)]):
            out[ev.tag] += ev.tokens
        return [out[i] for i in range(len(prompts))]

    with Engine.open(PairConfig(TARGET, ctx=CPP_CTX), plain=True) as e:
        want = decode(e)
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=6, parallel=2, ctx=CPP_CTX)) as e:
        got = decode(e)
        texts = [e.target_model.detokenize(t) for t in got]
    assert got == want
    woken = [t for t in texts if "self." in t]  # (the grammar ends the text once it is complete)
    assert woken and all(re.search(r"self\.[a-z_]{1,12}( [a-z=_.()\[\]]{1,12}){0,6}\n$", t) for t in woken), texts


def test_the_schema_converter_is_llama_cpps():
    gbnf = json_schema_to_grammar({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    # llama-server's rules (its C++ converter; the Python port puts the space after the "}")
    assert 'root ::= "{" space n-kv space "}"\n' in gbnf and 'n-kv ::= "\\"n\\"" space ":" space integer' in gbnf
    with pytest.raises(ChatError, match="cannot turn this JSON schema into a grammar"):
        json_schema_to_grammar({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})


def test_the_parser_reads_tool_calls_and_streams_their_deltas():
    """Hermes-style tool calls from Qwen2.5-Coder's own template, parsed whole and as deltas that
    add up to the whole."""
    coder = _coder_or_skip()
    with Engine.open(PairConfig(coder.target, ctx=CPP_CTX), plain=True) as e:
        model = e.target_model
        t = ChatTemplates(model)
        p = t.apply({"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]})
        assert p.grammar_lazy and p.grammar_triggers and "<tool_call>" in p.preserved_tokens
        spec = grammar_spec(model, p)
        assert spec.lazy and spec.trigger_patterns and not spec.prefill
        answer = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        whole = ChatParser(p.parser_params("deepseek", True))
        whole.update(answer, partial=False)
        call = whole.message["tool_calls"][0]
        assert whole.message["content"] == "Let me check.\n" and call["function"] == {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}
        streamed = ChatParser(p.parser_params("deepseek", True))
        deltas = [d for i in range(0, len(answer), 7) for d in streamed.update(answer[i:i + 7], partial=True)]
        deltas += streamed.update("", partial=False)
        args = "".join(tc["function"].get("arguments", "") for d in deltas for tc in d.get("tool_calls", []))
        content = "".join(d.get("content", "") for d in deltas)
        assert args == '{"city": "Paris"}' and content == "Let me check.\n"
        ids = {tc["id"] for d in deltas for tc in d.get("tool_calls", []) if "id" in tc}
        assert len(ids) == 1 and len(next(iter(ids))) == 32  # one call, llama-server's id shape
        t.close()


# --- against llama-server, on the real Qwen2.5-Coder pair -----------------------------------------


def _coder_or_skip():
    entry = get_entry(CODER)
    if check_files(entry, None) != "ok":
        pytest.skip(f"{CODER} is not pulled: run `ggspec models pull {CODER}`")
    return resolve(entry)


@pytest.fixture(scope="module")
def servers(build_info):
    """ggspec serve speculating with the pair (draft-simple, a fixed length: speculation is what
    is tested) and llama-server on the target, flash attention off in both."""
    yield from _both_servers(build_info, _coder_or_skip())


def _both_servers(build_info, coder, *extra: str):
    """A fixture's body: ggspec serve on the pair (fixed length 3) and llama-server on its target,
    one slot, -c 4096, flash attention off in both, with `extra` flags for both; stopped after."""
    args = ("-np", "1", "-c", "4096", "-fa", "off", *extra)
    ours = LiveServer("--pair", CODER, "--spec-draft-n-max", "3", *args)
    try:
        theirs = NativeServer(build_info.lib_dir, coder.target, *args)
    except BaseException:
        ours.stop()
        raise
    yield ours, theirs
    theirs.stop()
    code, err = ours.stop()
    assert code == 0, err


def _without_ids(message: dict) -> dict:
    return {**message, "tool_calls": [{k: v for k, v in c.items() if k != "id"} for c in message.get("tool_calls", [])]}


def _events(server, body: dict) -> list[dict]:
    import urllib.request

    req = urllib.request.Request(server.url + "/v1/chat/completions", json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        text = r.read().decode()
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


@pytest.mark.real
@pytest.mark.parametrize("body", [
    {"messages": CALL, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 48},
    {"messages": CALL[:1], "tools": [WEATHER], "max_tokens": 24},
    {"messages": [{"role": "user", "content": "Describe a cat as JSON."}], "max_tokens": 16,
     "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "schema": {
         "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
         "required": ["name", "age"]}}}},
], ids=["tool-required", "tools-auto", "json-schema"])
def test_chat_with_tools_equals_llama_servers(servers, body):
    """Greedy, speculating: the same message (content, tool calls but their random ids), finish
    reason and usage as llama-server; the rendered prompt the same; streamed, the deltas add up
    to the whole message, tool calls with one id each, and the same finish reason."""
    ours, theirs = servers
    body = {**body, "temperature": 0}
    (c1, a), (c2, b) = ours.post("/v1/chat/completions", body), theirs.post("/v1/chat/completions", body)
    assert c1 == c2 == 200, (a, b)
    x, y = a["choices"][0], b["choices"][0]
    assert _without_ids(x["message"]) == _without_ids(y["message"]) and x["finish_reason"] == y["finish_reason"]
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    assert ours.post("/apply-template", body) == theirs.post("/apply-template", body)

    events = _events(ours, body)
    deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
    assert "".join(d.get("content") or "" for d in deltas) == x["message"]["content"]
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            c = calls.setdefault(tc["index"], {"ids": set(), "name": "", "arguments": ""})
            c["ids"] |= {tc["id"]} if "id" in tc else set()
            c["name"] += tc.get("function", {}).get("name", "")
            c["arguments"] += tc.get("function", {}).get("arguments", "")
    want = [c["function"] for c in x["message"].get("tool_calls", [])]
    assert [{"name": c["name"], "arguments": c["arguments"]} for _, c in sorted(calls.items())] == want
    assert all(len(c["ids"]) == 1 for c in calls.values())
    assert [e for e in events if e.get("choices")][-1]["choices"][0]["finish_reason"] == x["finish_reason"]
    if body.get("tool_choice") == "required":
        assert x["finish_reason"] == "tool_calls" and len(want) == 2 and a["usage"]["accepted_tokens"] > 0


@pytest.mark.real
def test_openais_client_calls_tools_and_gets_structured_output(servers):
    """OpenAI's Python client, unchanged: tool calls as objects, then the tool's result sent
    back in the conversation; a JSON schema's answer parses as that schema."""
    ours, _ = servers
    r = ours.client.chat.completions.create(model=CODER, messages=CALL, tools=[WEATHER], tool_choice="required",
                                            max_tokens=48, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_weather"] * 2
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    follow = [CALL[0], {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
              *({"role": "tool", "tool_call_id": c.id, "content": '{"temp_c": 21}'} for c in calls)]
    r = ours.client.chat.completions.create(model=CODER, messages=follow, tools=[WEATHER], max_tokens=24, temperature=0)
    assert r.choices[0].message.content  # the tools' results rendered by the template, answered in text
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
              "required": ["name", "legs"], "additionalProperties": False}
    r = ours.client.chat.completions.create(
        model=CODER, messages=[{"role": "user", "content": "A cat as JSON with its name and legs."}], max_tokens=48,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}})
    cat = json.loads(r.choices[0].message.content)
    assert set(cat) == {"name", "legs"} and isinstance(cat["legs"], int)


NODE_CLIENT = Path(__file__).resolve().parent / "node"  # package.json pins OpenAI's Node client


@pytest.mark.real
def test_openais_node_client(servers):
    """OpenAI's Node client (npm's `openai`, tests/node/openai_client.mjs), unchanged: tool calls
    whole and streamed, their results sent back, a JSON schema's answer, text whole and streamed,
    a legacy completion and a 400's field, the same as the same requests over plain HTTP."""
    node = shutil.which("node")
    if node is None or not (NODE_CLIENT / "node_modules" / "openai").is_dir():
        pytest.skip("OpenAI's Node client is not installed: `npm ci --prefix tests/node` (.ci/run does)")
    ours, _ = servers
    proc = subprocess.run([node, str(NODE_CLIENT / "openai_client.mjs"), ours.url + "/v1", CODER], check=False,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    greedy = {"temperature": 0, "model": CODER}
    code, tools = ours.post("/v1/chat/completions", {**greedy, "messages": CALL, "tools": [WEATHER],
                                                     "tool_choice": "required", "max_tokens": 48})
    assert code == 200
    want = [c["function"] for c in tools["choices"][0]["message"]["tool_calls"]]
    assert got["tool_calls"] == got["streamed_calls"] == want and len(want) == 2
    assert got["tool_finish"] == got["streamed_finish"] == "tool_calls" and got["follow_up"]
    assert set(json.loads(got["cat"])) == {"name", "legs"}
    haiku = ours.post("/v1/chat/completions", {**greedy, "max_tokens": 24, "messages": [
        {"role": "user", "content": "Write a haiku about the sea."}]})[1]["choices"][0]["message"]["content"]
    assert got["text"] == got["text_streamed"] == haiku
    legacy = ours.post("/v1/completions", {**greedy, "prompt": "def fibonacci(n):", "max_tokens": 16})[1]
    assert got["completion"] == legacy["choices"][0]["text"]
    assert got["error"] == {"status": 400, "param": "max_tokens", "type": "BadRequestError"}


# --- thinking: llama.cpp's reasoning budget, against llama-server ------------------------------------


@pytest.fixture(scope="module")
def thinking_servers(build_info, tmp_path_factory):
    """Both servers on the Qwen2.5-Coder pair with QwQ's template (llama.cpp's test copy), its
    generation prompt ending at "<think>" so that the prompt opens the thinking block in tokens the
    start tag matches (Qwen2.5 has no <think> token: "<think>\\n" would end in one ">\\n" token)."""
    coder = _coder_or_skip()
    source = Path(build_info.root) / "llama.cpp" / "models" / "templates" / "Qwen-QwQ-32B.jinja"
    text = source.read_text()
    assert text.count("'<|im_start|>assistant\\n<think>\\n'") == 1
    template = tmp_path_factory.mktemp("thinking") / "qwq-think.jinja"
    template.write_text(text.replace("'<|im_start|>assistant\\n<think>\\n'", "'<|im_start|>assistant\\n<think>'"))
    yield from _both_servers(build_info, coder, "--chat-template-file", str(template))


THINK = [{"role": "user", "content": "What is 17 * 23? Think step by step."}]
PARIS = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.mark.real
@pytest.mark.parametrize("extra", [
    {}, {"reasoning_budget_tokens": 6}, {"reasoning_budget_tokens": 0},
    {"thinking_budget_tokens": 4, "reasoning_budget_message": " Enough."},
    {"messages": PARIS, "tools": [WEATHER]}, {"messages": PARIS, "tools": [WEATHER], "reasoning_budget_tokens": 5},
    {"reasoning_budget_tokens": 6, "stream": True},
], ids=["free", "budget-6", "budget-0", "thinking-budget-message", "tools", "tools-budget-5", "budget-6-streamed"])
def test_a_reasoning_budget_equals_llama_servers(thinking_servers, extra):
    """Speculating under llama.cpp's reasoning budget (a sampler constraint like a grammar, every
    verified row judged at its state there), with the lazy tool-call grammar held back inside the
    thinking block: the same reasoning, content and token count as llama-server; an answer whose
    parse is empty is its raw text, as there."""
    ours, theirs = thinking_servers
    body = {"messages": THINK, "max_tokens": 40, "temperature": 0, **extra}
    if body.get("stream"):
        events = _events(ours, body)
        deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
        got = {k: "".join(d.get(k) or "" for d in deltas) for k in ("content", "reasoning_content")}
        _, b = theirs.post("/v1/chat/completions", {**body, "stream": False})
        want = b["choices"][0]["message"]
        assert got == {k: want.get(k) or "" for k in got}
        return
    (c1, a), (c2, b) = ours.post("/v1/chat/completions", body), theirs.post("/v1/chat/completions", body)
    assert c1 == c2 == 200, (a, b)
    assert _without_ids(a["choices"][0]["message"]) == _without_ids(b["choices"][0]["message"])
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
    if "reasoning_budget_tokens" in extra or "thinking_budget_tokens" in extra:
        assert len(a["choices"][0]["message"].get("reasoning_content") or "") < 60  # cut where the budget ran out


@pytest.mark.real
def test_a_thinking_block_ended_from_outside(thinking_servers):
    """llama-server's POST /v1/chat/completions/control {"id", "action": "reasoning_end"}: a
    streamed answer asked with reasoning_control has its thinking ended mid-stream (the end tag
    forced at the next step, speculating as before); the same refusals as llama-server otherwise."""
    import http.client
    import urllib.request

    ours, theirs = thinking_servers
    for body in ({"action": "reasoning_end"}, {"id": "chatcmpl-x", "action": "nope"}, {"id": "chatcmpl-x", "action": "reasoning_end"}):
        (c1, a), (c2, b) = ours.post("/v1/chat/completions/control", body), theirs.post("/v1/chat/completions/control", body)
        assert c1 == c2, (body, a, b)
        assert (a.get("success"), a.get("message")) == (b.get("success"), b.get("message")) if c1 == 200 else \
            a["error"]["message"] == b["error"]["message"], (body, a, b)

    body = {"messages": THINK, "max_tokens": 48, "temperature": 0, "reasoning_control": True, "stream": True}
    free = ours.post("/v1/chat/completions", {**body, "stream": False})[1]["choices"][0]["message"]
    conn = http.client.HTTPConnection("127.0.0.1", ours.port, timeout=300)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    reasoning, content, answered = "", "", None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        delta = (event.get("choices") or [{}])[0].get("delta", {})
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
        if answered is None and reasoning:
            req = urllib.request.Request(ours.url + "/v1/chat/completions/control", json.dumps(
                {"id": event["id"], "action": "reasoning_end"}).encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                answered = json.loads(r.read())
    conn.close()
    assert answered == {"success": True}
    assert len(reasoning) < len(free["reasoning_content"]) and content  # cut short, then answered
