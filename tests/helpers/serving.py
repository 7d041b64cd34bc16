"""A live `ggspec serve` on loopback (driven by OpenAI's Python client and raw HTTP), and the check
that concurrent clients of a speculative server get the target's plain greedy text."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import PROMPTS

from ggspec.bench.serving import NotReady, free_port, wait_ready
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from helpers.drafts import greedy
from helpers.pairs import MTP_CTX


def run_texts(pair: str, prompts: list[str], n: int) -> dict[str, str]:
    """`ggspec run`'s greedy continuation of each prompt, n tokens (what a server must answer)."""
    from conftest import run_cli

    out = {}
    for p in prompts:
        proc = run_cli("run", "--pair", pair, "-p", p, "-n", str(n), "--ignore-eos")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(p) and proc.stdout.endswith("\n")
        out[p] = proc.stdout[len(p):-1]
    return out


def pair_fixtures(pair: str, prompts: list[str], n: int, server_name: str = "server"):
    """A test module's two module fixtures over one pair: `refs` (`ggspec run`'s greedy text of
    each prompt, n tokens) and a speculating `ggspec serve` of it (named `server_name`)."""

    @pytest.fixture(scope="module")
    def refs(build_info) -> dict[str, str]:
        return run_texts(pair, prompts, n)

    @pytest.fixture(scope="module", name=server_name)
    def server(build_info):
        yield from speculating_server(pair)

    return refs, server


def speculating_server(pair: str):
    """A module fixture's body: `ggspec serve` of the pair at -np 4 with a fixed draft length
    (speculation is what is tested), stopped cleanly afterwards."""
    s = LiveServer("--pair", pair, "-np", "4", "--spec-draft-n-max", "7")
    yield s
    code, err = s.stop()
    assert code == 0, err


class LiveServer:
    """`ggspec serve ARGS` in a subprocess on a free loopback port, ready when /health answers."""

    def __init__(self, *args: str, ca: Path | None = None, api_key: str = "unused", env: dict | None = None,
                 ui: bool = False) -> None:
        """`ca`: the server speaks HTTPS with a certificate this file vouches for; `api_key`: the
        key the client and get/post bring; `ui`: with llama.cpp's web UI at / (else --no-ui: a
        server never builds it in a test)."""
        openai = pytest.importorskip("openai")
        self.port = free_port()
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        self.ssl = None if ca is None else ssl.create_default_context(cafile=str(ca))
        self.headers = {"Authorization": f"Bearer {api_key}"}
        cmd = [sys.executable, "-m", "ggspec.cli", "serve", *args, "--port", str(self.port), *([] if ui else ["--no-ui"])]
        self.log = tempfile.TemporaryFile("w+")  # not a pipe: nothing reads it while the server runs
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, text=True,
                                     env=None if env is None else {**os.environ, **env})
        try:
            wait_ready(self.url, self.proc, timeout=120, context=self.ssl)
        except NotReady as exc:
            raise AssertionError(f"{exc}: {self.output()}") from None
        # (the client's own HTTP client, made to trust the test's certificate)
        http_client = getattr(openai, "DefaultHttpx2Client", None) or openai.DefaultHttpxClient
        http = None if ca is None else http_client(verify=self.ssl)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120,
                                    http_client=http)

    def get(self, path: str) -> tuple[int, dict | str]:
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url + path, headers=self.headers), timeout=30,
                                        context=self.ssl) as r:
                body = r.read().decode()
                return r.status, json.loads(body) if r.headers.get_content_type() == "application/json" else body
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def post(self, path: str, body: bytes | dict) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(req, timeout=120, context=self.ssl) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def health(self) -> dict:
        return self.get("/health")[1]

    def metric(self, name: str, **labels) -> float:
        """The value of one Prometheus sample (0 when it is not there yet)."""
        text = self.get("/metrics")[1]
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> tuple[int, str]:
        """SIGTERM; the exit status and what it printed on stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode, self.output()


def serve_equals_plain(target: Path, *server_args: str) -> None:
    """Three concurrent clients of `ggspec serve -m target *server_args` get the target's plain
    greedy text of the first three PROMPTS, and the server drafted."""
    with Engine.open(PairConfig(target=target, ctx=MTP_CTX), plain=True) as eng:
        want = {p: eng.target_model.detokenize(greedy(eng, eng.target_model.tokenize(p), 24)) for p in PROMPTS[:3]}
    s = LiveServer("-m", str(target), *server_args, "-np", "3", "--spec-draft-n-max", "3")
    try:
        def complete(p):
            r = s.client.completions.create(model=target.stem, prompt=p, max_tokens=24, temperature=0,
                                            extra_body={"ignore_eos": True})
            return r.choices[0].text
        with ThreadPoolExecutor(3) as pool:
            got = dict(zip(want, pool.map(complete, want)))
        assert got == want
        assert s.metric("ggspec:spec_decode_num_draft_tokens_total") > 0  # it did draft
    finally:
        code, err = s.stop()
    assert code == 0, err


class NativeServer:
    """llama.cpp's own llama-server of the same build, on a free loopback port (the reference
    ggspec serve is compared with)."""

    def __init__(self, lib_dir: str, model: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ssl, self.headers = None, {}  # (what get and post send: plain HTTP, no key)
        cmd = [str(Path(lib_dir) / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", "2", "--no-warmup", *args]
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        try:
            wait_ready(self.url, self.proc, timeout=120)
        except NotReady as exc:
            self.log.seek(0)
            raise AssertionError(f"{exc}: {self.log.read()[-2000:]}") from None

    get, post = LiveServer.get, LiveServer.post

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
