"""`ggspec serve` for a shared machine: API keys and TLS as llama-server spells them, and
failures that stay with their request (each case here broke or leaked before it was fixed)."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import run_cli
from helpers.serving import LiveServer

openai = pytest.importorskip("openai")
PAIR = "tiny-coder"
KEYS = ("key-one", "key-two", "ключ-три")  # (a key may be any UTF-8 text)
UNAUTHORIZED = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
# every route a client can reach, with a body that would be valid (a 401 comes before any check)
ROUTES = [("GET", "/v1/models"), ("GET", "/models"), ("GET", "/props"), ("GET", "/slots"), ("GET", "/metrics"),
          ("POST", "/v1/completions"), ("POST", "/completion"), ("POST", "/v1/chat/completions"),
          ("POST", "/v1/chat/completions/control"), ("POST", "/tokenize"), ("POST", "/detokenize"),
          ("POST", "/apply-template"), ("GET", "/no-such-route"), ("GET", "/")]


def _raw(port: int, method: str, path: str, headers: list[tuple[str, bytes]], body: bytes = b"") -> tuple[int, bytes]:
    """One request with exactly these headers (http.client would merge or refuse some)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, build_info):
    """A server with three keys: two from --api-key (a comma list), one from --api-key-file
    (beside a comment)."""
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# the third key\n{KEYS[2]}\n", encoding="utf-8")
    s = LiveServer("--pair", PAIR, "-np", "2", "--spec-draft-n-max", "4", "--api-key", f"{KEYS[0]},{KEYS[1]}",
                   "--api-key-file", str(key_file), api_key=KEYS[0])
    yield s
    code, err = s.stop()
    assert code == 0, err


def test_every_route_but_health_refuses_a_missing_or_wrong_key(keyed):
    port = keyed.port
    for method, path in ROUTES:
        for headers in ([], [("Authorization", b"Bearer nope")], [("X-Api-Key", b"nope")],
                        [("Authorization", b"Bearer ")], [("Authorization", KEYS[0].encode() + b"x")]):
            status, body = _raw(port, method, path, headers, b"{}" if method == "POST" else b"")
            assert status == 401 and json.loads(body) == UNAUTHORIZED, (method, path, headers, status, body[:200])
    for path in ("/health", "/v1/health"):
        assert _raw(port, "GET", path, [])[0] == 200
    # a browser's CORS preflight carries no credentials: it is not refused
    assert _raw(port, "OPTIONS", "/v1/chat/completions", [])[0] != 401


def test_each_key_opens_it_by_either_header(keyed):
    port = keyed.port
    for key in KEYS:
        raw = key.encode("utf-8")
        for headers in ([("Authorization", b"Bearer " + raw)], [("X-Api-Key", raw)], [("Authorization", raw)]):
            status, body = _raw(port, "GET", "/v1/models", headers)
            assert status == 200, (headers, body[:200])
    # llama-server reads Authorization first and X-Api-Key only without it
    assert _raw(port, "GET", "/props", [("Authorization", b"Bearer nope"), ("X-Api-Key", KEYS[1].encode())])[0] == 401


def test_hostile_key_headers_get_a_clean_401(keyed):
    """Empty, huge, binary and doubled headers: each a 401 (or the server's own limit), never a
    5xx, and the server goes on answering."""
    port = keyed.port
    cases = [[("Authorization", b"")], [("Authorization", b"Bearer " + b"k" * 60_000)],
             [("Authorization", "Bearer ключ".encode())], [("Authorization", b"Bearer \xff\xfe")],
             [("X-Api-Key", b"\x00")], [("Authorization", b"Bearer nope"), ("Authorization", b"Bearer " + KEYS[0].encode())],
             [("Authorization", b"Basic " + KEYS[0].encode())]]
    for headers in cases:
        status, _ = _raw(port, "POST", "/v1/completions", headers, b'{"prompt": "x", "max_tokens": 1}')
        assert status in (400, 401, 431), (headers[0][1][:40], status)
    # the first of two Authorization headers is the one read, as llama-server reads it
    doubled = [("Authorization", b"Bearer " + KEYS[0].encode()), ("Authorization", b"Bearer nope")]
    assert _raw(port, "GET", "/v1/models", doubled)[0] == 200
    assert keyed.get("/health")[0] == 200


def test_openai_client_with_and_without_the_key(keyed):
    r = keyed.client.completions.create(model=PAIR, prompt="def add(a, b):", max_tokens=8, temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens == 8
    stranger = openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        stranger.completions.create(model=PAIR, prompt="x", max_tokens=1)
    refused = keyed.metric("ggspec:request_rejected_total", reason="unauthorized")
    assert refused >= 1
    log = keyed.output()
    assert not any(k in log for k in KEYS), "a key reached the server's log"
    assert "def add" not in log  # nor a prompt


def _certificate(tmp) -> tuple:
    """A self-signed certificate for 127.0.0.1 and its key, made with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (it makes the test's certificate)")
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return key, cert


def test_tls_with_the_openai_client(tmp_path, build_info):
    """HTTPS with a key: the OpenAI client (trusting the test's certificate) streams an answer
    equal to the plain one; plain HTTP on that port gets no answer."""
    key, cert = _certificate(tmp_path)
    s = LiveServer("--pair", PAIR, "-np", "1", "--ssl-key-file", str(key), "--ssl-cert-file", str(cert),
                   env={"LLAMA_API_KEY": "secret"}, ca=cert, api_key="secret")
    try:
        args = dict(model=PAIR, prompt="class Stack:", max_tokens=12, temperature=0)
        whole = s.client.completions.create(**args).choices[0].text
        streamed = "".join(c.choices[0].text for c in s.client.completions.create(**args, stream=True) if c.choices)
        assert whole and streamed == whole
        with pytest.raises((http.client.HTTPException, ConnectionError, socket.timeout)):
            _raw(s.port, "GET", "/health", [])
        assert "https://" in s.output()
    finally:
        code, err = s.stop()
    assert code == 0, err


@pytest.mark.parametrize("args, needle", [
    (("--ssl-key-file", "{key}"), "--ssl-key-file and --ssl-cert-file go together"),
    (("--ssl-key-file", "{cert}", "--ssl-cert-file", "{cert}"), "not a PEM certificate and its key"),
    (("--ssl-key-file", "{tmp}/none.pem", "--ssl-cert-file", "{cert}"), "--ssl-key-file"),
    (("--api-key-file", "{tmp}/none.txt"), "--api-key-file"),
    (("--api-key-file", "{comments}"), "it holds no key"),
    (("--api-key", ","), "--api-key: an empty key"),
])
def test_bad_key_and_tls_flags_are_one_line(tmp_path, build_info, args, needle):
    key, cert = _certificate(tmp_path)
    comments = tmp_path / "comments.txt"
    comments.write_text("# nothing but a comment\n\n")
    filled = [a.format(key=key, cert=cert, tmp=tmp_path, comments=comments) for a in args]
    proc = run_cli("serve", "--pair", PAIR, *filled, "--port", "1")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr, proc.stderr


# --- failures stay with their request -------------------------------------------------------------


@pytest.fixture(scope="module")
def server(build_info):
    s = LiveServer("--pair", PAIR, "-np", "4", "--spec-draft-n-max", "4")
    yield s
    code, err = s.stop()
    assert code == 0, err


def test_a_grammar_nested_too_deeply_is_a_400_not_a_crash(server):
    """llama.cpp's GBNF parser recurses once per group: 200,000 nested groups killed the process."""
    deep = "root ::= " + "(" * 200_000 + '"x"' + ")" * 200_000
    for path, body in (("/completion", {"prompt": "x", "n_predict": 4, "grammar": deep}),
                       ("/v1/completions", {"prompt": "x", "max_tokens": 4, "grammar": deep})):
        status, r = server.post(path, body)
        assert status == 400 and "nests 200000 groups deep" in r["error"]["message"], (path, status, r)
    ok = "root ::= " + "(" * 50 + '"x"' + ")" * 50  # within the bound: parsed and followed
    status, r = server.post("/completion", {"prompt": "x", "n_predict": 3, "grammar": ok})
    assert status == 200 and r["content"] == "x"
    assert server.get("/health")[0] == 200


def test_a_dead_end_grammar_fails_alone(server):
    """A grammar that allows nothing (its one token forbidden by a bias) ends its own request with
    a 500, as llama-server; the streams decoding beside it finish with their whole answers."""
    prompts = ["def fibonacci(n):", "The quick brown fox", "import os\nimport sys\n\n"]
    alone = [server.client.completions.create(model=PAIR, prompt=p, max_tokens=24, temperature=0,
                                              extra_body={"ignore_eos": True}).choices[0].text for p in prompts]
    q = server.post("/tokenize", {"content": "Q"})[1]["tokens"]
    dead = {"prompt": "x", "n_predict": 8, "grammar": 'root ::= "Q"', "logit_bias": [[t, False] for t in q]}

    def streamed(p: str) -> str:
        chunks = server.client.completions.create(model=PAIR, prompt=p, max_tokens=24, temperature=0, stream=True,
                                                  extra_body={"ignore_eos": True})
        return "".join(c.choices[0].text for c in chunks if c.choices)

    with ThreadPoolExecutor(4) as pool:
        texts = [pool.submit(streamed, p) for p in prompts]
        # sampled (llama-server's default temperature) and greedy
        failed = [pool.submit(server.post, "/completion", body) for body in (dead, dead, {**dead, "temperature": 0})]
        assert [t.result() for t in texts] == alone
        for f in failed:
            status, r = f.result()
            assert status == 500 and "grammar" in r["error"]["message"], (status, r)
    slots = server.get("/slots")[1]
    assert all(not s["is_processing"] for s in slots)  # every slot freed


@pytest.mark.parametrize("body, needle", [
    (b'{"prompt": "x", "max_tokens": 2, "logit_bias": {"5": NaN}}', "NaN is not JSON"),
    (b'{"prompt": "x", "max_tokens": 2, "temperature": Infinity}', "Infinity is not JSON"),
    (b'{"prompt": "x", "max_tokens": 2, "logit_bias": {"5": 1e999}}', "finite"),
    (b'{"prompt": "x", "max_tokens": 2, "json_schema": {"minimum": -Infinity}}', "-Infinity is not JSON"),
])
def test_numbers_that_are_not_json_are_400(server, body, needle):
    status, r = server.post("/v1/completions", body)
    assert status == 400 and needle in r["error"]["message"], (status, r)


def test_the_control_route_refuses_deep_json_with_a_400(server):
    status, r = server.post("/v1/chat/completions/control", b"[" * 10_000 + b"]" * 10_000)
    assert status == 400 and "nested too deeply" in r["error"]["message"], (status, r)
    status, r = server.post("/v1/chat/completions/control", b'{"id": NaN, "action": "reasoning_end"}')
    assert status == 400


def test_top_logprobs_needs_logprobs(server):
    messages = [{"role": "user", "content": "hi"}]
    status, r = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 2, "top_logprobs": 3})
    assert status == 400 and "top_logprobs requires logprobs to be set to true" in r["error"]["message"]
    status, r = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 2, "logprobs": True,
                                                     "top_logprobs": 3})
    assert status == 200 and len(r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 3
