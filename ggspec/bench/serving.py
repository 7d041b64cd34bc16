"""A load generator for OpenAI-compatible servers (ggspec serve, llama-server).

`clients` closed-loop clients each stream one completion at a time (`/v1/completions`, SSE) until
`requests` are done. Every request records when its chunks arrived: time to first token (TTFT),
time per output token after the first (TPOT = (last - first) / (tokens - 1): speculative servers
send a step's tokens in one chunk, so gaps between chunks are not comparable across servers),
and the text, so outputs can be checked against solo runs. Standard library only (http.client in
threads): the client must not be what is measured.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np


class NotReady(RuntimeError):
    """A server that exited, or did not answer /health in time."""


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 180.0, context=None) -> None:
    """Return once url + /health answers 200; NotReady when `proc` exits first or time runs out.
    `context`: the ssl.SSLContext an https url is checked with."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if proc is not None and proc.poll() is not None:
            raise NotReady(f"the server exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise NotReady(f"the server at {url} was not ready within {timeout:.0f} s")


@dataclass
class Reply:
    """One streamed completion."""

    index: int  # which prompt
    text: str = ""
    tokens: int = 0  # from the usage chunk, else the request's max_tokens
    t_start: float = 0.0
    t_first: float | None = None  # first chunk with text
    t_end: float = 0.0
    finish: str | None = None
    usage: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def ttft(self) -> float:
        return (self.t_first or self.t_end) - self.t_start

    @property
    def tpot(self) -> float | None:
        if self.t_first is None or self.tokens < 2:
            return None
        return (self.t_end - self.t_first) / (self.tokens - 1)


def stream_completion(url: str, body: dict, index: int = 0, timeout: float = 600.0) -> Reply:
    """POST `body` (stream forced on) to url + /v1/completions and read the events."""
    parts = urlsplit(url)
    reply = Reply(index, t_start=time.perf_counter())
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}).encode(),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            reply.error = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace')}"
            return reply
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                reply.error = str(event["error"].get("message", event["error"]))
                break
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    reply.text += choice["text"]
                    now = time.perf_counter()
                    reply.t_first = reply.t_first or now
                if choice.get("finish_reason"):
                    reply.finish = choice["finish_reason"]
            if event.get("usage"):
                reply.usage = event["usage"]
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
        reply.error = f"{exc.__class__.__name__}: {exc}"
    finally:
        conn.close()
        reply.t_end = time.perf_counter()
    reply.tokens = int(reply.usage.get("completion_tokens", body.get("max_tokens", 0)))
    return reply


@dataclass
class Load:
    """What one load run measured."""

    replies: list[Reply]
    seconds: float  # wall time of the whole run

    @property
    def errors(self) -> list[Reply]:
        return [r for r in self.replies if r.error]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.replies if not r.error)

    @property
    def throughput(self) -> float:
        """Aggregate generated tokens per second."""
        return self.tokens / self.seconds if self.seconds else 0.0

    def percentile(self, what: str, q: float) -> float:
        values = [getattr(r, what) for r in self.replies if not r.error]
        values = [v for v in values if v is not None]
        return float(np.percentile(values, q)) if values else float("nan")


def run_load(url: str, prompts: list[str], *, clients: int, requests: int, max_tokens: int,
             extra: dict | None = None, timeout: float = 600.0) -> Load:
    """`requests` streamed completions, `clients` at a time, prompts in turn (request i gets
    prompt i mod len(prompts)); greedy unless `extra` says otherwise."""
    body = {"max_tokens": max_tokens, "temperature": 0.0, **(extra or {})}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(stream_completion, url, {**body, "prompt": prompts[i % len(prompts)]},
                               i % len(prompts), timeout) for i in range(requests)]
        replies = [f.result() for f in futures]
    return Load(replies, time.perf_counter() - t0)


def solo(url: str, prompts: list[str], max_tokens: int, extra: dict | None = None) -> list[Reply]:
    """Each prompt alone on an idle server: the references of a load run's outputs."""
    body = {"max_tokens": max_tokens, "temperature": 0.0, **(extra or {})}
    return [stream_completion(url, {**body, "prompt": p}, i) for i, p in enumerate(prompts)]


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
