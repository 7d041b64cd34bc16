"""A soak of `ggspec serve` (or any llama-server-compatible server): clients mixing every kind of
request, faults included, for a while; then every greedy answer is checked against the same
request's answer from a fresh server alone.

Each client loops until the time is up, picking a kind of request at random (`KINDS`): completions
and chat, whole and streamed, tools, JSON schemas, grammars (some dead-ending on purpose), `n` > 1,
logprobs, speculation per request (off, `none`, an n-gram type), streams the client drops after a
few chunks, and bodies that are not valid requests. A kind says which statuses it provokes (a
dead-end grammar's 500, garbage's 400); any other status is an unprovoked error. What is checked
(`Soak.verdict`): no unprovoked error, every greedy answer equal to its request's lone answer, the
server's resident memory flat after the warm-up, and no slot left busy once the clients are gone.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from ggspec.bench.serving import rss_bytes

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "The quick brown fox",
           "import os\nimport sys\n\n", "for i in range(10):\n    print(i)", "Once upon a time, there was"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
GARBAGE = [b"{", b"[]", b'{"prompt": 5}', b'{"prompt": "x", "max_tokens": -3}', b'{"prompt": "x", "temperature": NaN}',
           b"\xff\xfe", b'{"messages": []}', b'{"prompt": "x", "grammar": "root ::= ("}', b"[" * 5000 + b"]" * 5000]
MAX_TOKENS = 24


@dataclass(frozen=True)
class Call:
    """One request: where, what, and what a fault it provokes looks like."""

    kind: str
    path: str
    body: dict | bytes
    stream: bool = False
    greedy: bool = False  # its answer must equal the lone answer to the same body
    provoked: frozenset[int] = frozenset({200})  # the statuses this kind may get
    drop_after: int | None = None  # chunks read before the client hangs up

    @property
    def key(self) -> str:
        """The request, as its lone answer is looked up (streaming or not: the same text)."""
        body = self.body if isinstance(self.body, bytes) else json.dumps({**self.body, "stream": False}, sort_keys=True)
        return f"{self.path} {body!s}"


@dataclass
class Answer:
    call: Call
    status: int = 0
    text: str = ""
    seconds: float = 0.0
    error: str | None = None

    @property
    def unprovoked(self) -> bool:
        return self.error is not None or self.status not in self.call.provoked


def _completion(prompt: str, **extra) -> dict:
    return {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


def _chat(prompt: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


# name -> how to make one (from a random generator and a prompt), and its weight in the mix
KINDS: dict[str, tuple[Callable[[random.Random, str], Call], int]] = {
    "completion": (lambda r, p: Call("completion", "/v1/completions", _completion(p), greedy=True), 3),
    "completion-stream": (lambda r, p: Call("completion-stream", "/v1/completions", _completion(p), stream=True,
                                            greedy=True), 3),
    "chat": (lambda r, p: Call("chat", "/v1/chat/completions", _chat(p), greedy=True), 2),
    "chat-stream": (lambda r, p: Call("chat-stream", "/v1/chat/completions", _chat(p), stream=True, greedy=True), 2),
    "tools": (lambda r, p: Call("tools", "/v1/chat/completions", _chat(p, tools=TOOLS), greedy=True), 1),
    "json-schema": (lambda r, p: Call("json-schema", "/v1/completions", _completion(
        p, json_schema={"type": "object", "properties": {"a": {"type": "integer"}}}), greedy=True), 1),
    "grammar": (lambda r, p: Call("grammar", "/completion", {"prompt": p, "n_predict": 16, "temperature": 0,
                                                             "grammar": 'root ::= ("yes" | "no") " " [a-z ]{1,20}'},
                                  greedy=True), 1),
    # a grammar no token can follow (its one token forbidden): a 500 for it alone (a vocabulary
    # that can spell "Q" another way, as Gemma's byte tokens do, answers it: a 200 is no fault)
    "dead-end": (lambda r, p: Call("dead-end", "/completion", {"prompt": p, "n_predict": 8, "grammar": 'root ::= "Q"',
                                                               "logit_bias": [["Q", False]]},
                                   provoked=frozenset({500, 200})), 1),
    "n2": (lambda r, p: Call("n2", "/v1/completions", _completion(p, n=2), greedy=True), 1),
    "logprobs": (lambda r, p: Call("logprobs", "/v1/chat/completions", _chat(p, logprobs=True, top_logprobs=2),
                                   greedy=True), 1),
    "spec-off": (lambda r, p: Call("spec-off", "/v1/completions", _completion(p, speculative=False), greedy=True), 1),
    "spec-ngram": (lambda r, p: Call("spec-ngram", "/v1/completions", _completion(p, **{"speculative.type": "ngram-simple"}),
                                     greedy=True), 1),
    "spec-none": (lambda r, p: Call("spec-none", "/v1/completions", _completion(p, **{"speculative.type": "none"}),
                                    greedy=True), 1),
    "sampled": (lambda r, p: Call("sampled", "/v1/completions", _completion(p, temperature=0.8, seed=r.randrange(1000))), 1),
    "drop": (lambda r, p: Call("drop", "/v1/completions", _completion(p, max_tokens=64), stream=True,
                               drop_after=r.randrange(1, 4)), 2),
    "garbage": (lambda r, p: Call("garbage", r.choice(["/v1/completions", "/v1/chat/completions", "/completion"]),
                                  r.choice(GARBAGE), provoked=frozenset({400, 404})), 2),
}


def pick(rng: random.Random, kinds: dict = KINDS) -> Call:
    names = list(kinds)
    name = rng.choices(names, weights=[kinds[n][1] for n in names])[0]
    return kinds[name][0](rng, rng.choice(PROMPTS))


def send(url: str, call: Call, headers: dict | None = None, timeout: float = 300.0) -> Answer:
    """One call; the answer's text is every choice's (content, tool calls) joined."""
    parts = urlsplit(url)
    answer, t0 = Answer(call), time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    body = call.body if isinstance(call.body, bytes) else json.dumps({**call.body, "stream": call.stream}).encode()
    try:
        conn.request("POST", call.path, body, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        answer.status = resp.status
        if resp.status != 200 or not call.stream:
            answer.text = _whole_text(resp.read()) if resp.status == 200 else ""
        else:
            answer.text = _streamed_text(resp, call.drop_after)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        answer.error = f"{exc.__class__.__name__}: {exc}"
    finally:
        conn.close()
        answer.seconds = time.perf_counter() - t0
    return answer


def _choice_text(c: dict) -> str:
    msg = c.get("message") or c.get("delta") or {}
    calls = msg.get("tool_calls")
    return (c.get("text") or msg.get("content") or "") + (json.dumps(calls, sort_keys=True) if calls else "")


def _whole_text(raw: bytes) -> str:
    doc = json.loads(raw)
    if "content" in doc and "choices" not in doc:  # llama-server's /completion
        return doc["content"]
    return "\x00".join(_choice_text(c) for c in sorted(doc["choices"], key=lambda c: c["index"]))


def _streamed_text(resp, drop_after: int | None) -> str:
    texts: dict[int, str] = {}
    for n, line in enumerate(line for line in resp if line.startswith(b"data: ")):
        if drop_after is not None and n >= drop_after:
            return ""  # the client hangs up here (closing the connection)
        payload = line[6:].strip()
        if payload == b"[DONE]":
            break
        event = json.loads(payload)
        if "error" in event:
            raise ValueError(f"stream error: {event['error'].get('message')}")
        for c in event.get("choices") or []:
            delta = c.get("delta") or {}
            part = c.get("text") or delta.get("content") or ""
            texts[c["index"]] = texts.get(c["index"], "") + part
    return "\x00".join(texts[i] for i in sorted(texts))


@dataclass
class Soak:
    answers: list[Answer]
    seconds: float
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds since the start, bytes)
    warmup_s: float = 60.0
    lone: dict[str, str] = field(default_factory=dict)  # request key -> its answer from a fresh server alone
    busy_slots_after: int = 0

    @property
    def unprovoked(self) -> list[Answer]:
        return [a for a in self.answers if a.unprovoked]

    def mismatches(self) -> list[Answer]:
        return [a for a in self.answers if a.call.greedy and not a.unprovoked and a.call.key in self.lone
                and a.text != self.lone[a.call.key]]

    def rss_growth(self) -> float | None:
        """Resident memory at the end over that at the end of the warm-up, less one (None: too short)."""
        after = [b for t, b in self.rss if t >= self.warmup_s]
        return None if len(after) < 2 else after[-1] / after[0] - 1.0

    def latency(self) -> dict[str, tuple[float, float]]:
        """Per kind: p50 and p99 seconds of its answered requests."""
        out = {}
        for kind in sorted({a.call.kind for a in self.answers}):
            s = [a.seconds for a in self.answers if a.call.kind == kind and not a.unprovoked]
            if s:
                out[kind] = (float(np.percentile(s, 50)), float(np.percentile(s, 99)))
        return out

    def verdict(self, max_growth: float = 0.05) -> list[str]:
        """What failed (empty: the soak passed)."""
        problems = [f"{len(self.unprovoked)} unprovoked errors"] if self.unprovoked else []
        if self.mismatches():
            problems.append(f"{len(self.mismatches())} greedy answers differ from their lone answers")
        growth = self.rss_growth()
        if growth is not None and growth > max_growth:
            problems.append(f"resident memory grew {growth:.1%} after the warm-up (at most {max_growth:.0%})")
        if self.busy_slots_after:
            problems.append(f"{self.busy_slots_after} slots still busy after the load")
        return problems

    def summary(self) -> dict:
        kinds: dict[str, dict] = {}
        for a in self.answers:
            k = kinds.setdefault(a.call.kind, {"requests": 0, "statuses": {}})
            k["requests"] += 1
            k["statuses"][str(a.status or a.error)] = k["statuses"].get(str(a.status or a.error), 0) + 1
        return {"seconds": round(self.seconds, 1), "requests": len(self.answers), "kinds": kinds,
                "unprovoked": [{"kind": a.call.kind, "status": a.status, "error": a.error} for a in self.unprovoked][:20],
                "greedy_checked": sum(1 for a in self.answers if a.call.greedy and a.call.key in self.lone
                                      and not a.unprovoked),
                "mismatches": [{"kind": a.call.kind, "key": a.call.key[:200]} for a in self.mismatches()][:20],
                "rss_mib": [(round(t), round(b / 2**20, 1)) for t, b in self.rss[::max(1, len(self.rss) // 20)]],
                "rss_growth_after_warmup": self.rss_growth(), "busy_slots_after": self.busy_slots_after,
                "latency_p50_p99_s": self.latency(), "verdict": self.verdict()}


def run(url: str, *, clients: int, seconds: float, pid: int | None = None, seed: int = 0,
        warmup_s: float = 60.0, headers: dict | None = None) -> Soak:
    """`clients` threads, each sending random calls until `seconds` are up; the server's resident
    memory sampled every second (`pid`)."""
    t0 = time.perf_counter()
    answers: list[Answer] = []
    lock, stop = threading.Lock(), threading.Event()
    soak = Soak(answers, 0.0, warmup_s=warmup_s)

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while time.perf_counter() - t0 < seconds:
            a = send(url, pick(rng), headers)
            with lock:
                answers.append(a)

    def watch() -> None:
        while not stop.is_set():
            soak.rss.append((time.perf_counter() - t0, rss_bytes(pid)))
            stop.wait(1.0)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    watcher = threading.Thread(target=watch, daemon=True) if pid is not None else None
    for t in [*threads, *([watcher] if watcher else [])]:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    soak.seconds = time.perf_counter() - t0
    return soak


def lone_answers(url: str, soak: Soak, headers: dict | None = None) -> None:
    """Each distinct greedy request of the soak, sent alone (one at a time) to `url`: a fresh
    server. Fills `soak.lone`."""
    seen: dict[str, Call] = {}
    for a in soak.answers:
        if a.call.greedy and not a.unprovoked:
            seen.setdefault(a.call.key, a.call)
    for key, call in seen.items():
        a = send(url, Call(call.kind, call.path, call.body, greedy=True), headers)
        if not a.unprovoked:
            soak.lone[key] = a.text


def _get_json(url: str, path: str, headers: dict | None = None):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def kept(url: str, headers: dict | None = None) -> dict | None:
    """What the server's drafters keep across requests (/props speculative.kept: suffix's global
    trie): memory that grows by design, up to its bound."""
    return (_get_json(url, "/props", headers).get("speculative") or {}).get("kept")


def busy_slots(url: str, headers: dict | None = None) -> int:
    """Slots still processing (llama-server's /slots), once the load is over."""
    return sum(1 for s in _get_json(url, "/slots", headers) if s.get("is_processing"))
