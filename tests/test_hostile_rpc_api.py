"""Hostile RPC workers and misuse of the Python API: every case ends in a clear error, fast.

RPC: a worker stopped (SIGSTOP) before the run or at each phase of one (handshake, load, context
creation, decode, logits, memory calls), a port that accepts and never answers, a worker whose
client vanishes (it must survive and serve the next run), `ggspec rpc-server` that cannot listen,
and nonsense timeouts / proportions. API: handles used after close() raise ClosedError.

Every CLI case: exit 1, exactly one `error:` line, no traceback, no signal death, bounded time.
The workers started here are always continued (SIGCONT) and stopped in a `finally`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import run_cli
from helpers.rpc import PROBE, free_port, start_worker, stop

TIMEOUT = "3"  # --rpc-timeout of every hang case
BOUND = 25.0  # seconds any hang case may take in all (start-up + the timeout + slack on a busy machine)


def _assert_one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 1, f"rc={proc.returncode}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert any(n in errors[0] for n in needles), errors[0]


def _timed(fn, *args, **kwargs):
    t0 = time.monotonic()
    proc = fn(*args, **kwargs)
    return proc, time.monotonic() - t0


@pytest.fixture(scope="module")
def worker(build_info):
    """One `ggspec rpc-server` for the module: (endpoint, process). Tests that stop it continue it
    and check it survived its vanished client."""
    port = free_port()
    proc = start_worker(port)
    try:
        yield f"127.0.0.1:{port}", proc
    finally:
        _continue(proc)
        stop(proc)


def _continue(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGCONT)


def _alive_after_continue(proc: subprocess.Popen) -> None:
    """Continue a stopped worker whose client is gone: it must survive the failed reply (SIGPIPE)."""
    _continue(proc)
    time.sleep(0.5)
    assert proc.poll() is None, f"the worker died (rc={proc.returncode}): {proc.stderr.read()[-1000:]}"


# --- stopped workers -------------------------------------------------------------------------------


def test_worker_stopped_before_the_run(worker, dense_pair):
    """Stopped before the run: the handshake would block forever inside ggml_backend_rpc_add_server."""
    endpoint, proc = worker
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        run, took = _timed(run_cli, "run", "-m", str(dense_pair.target), "--no-spec", "--rpc", endpoint,
                           "--rpc-timeout", TIMEOUT, "-n", "8", "-p", "hello", timeout=60)
        # the kernel may still accept the connection (watchdog) or refuse it (a full accept queue)
        _assert_one_line_error(run, "no answer from the RPC workers for 3 s", "cannot reach the RPC worker")
        assert took < BOUND
    finally:
        _alive_after_continue(proc)


# where the probe may block once the worker is stopped before a phase: in that phase's call, except
# that the logits read races the worker. The RPC client's dispatcher thread sends decode's output copy
# (get_tensor_async) while decode returns; a worker that answered it before the stop leaves the
# logits read nothing to wait for, and the next call that needs the worker (the memory clear) blocks.
BLOCKED_AT = {"add": {"add"}, "load": {"load"}, "context": {"context"}, "decode": {"decode"},
              "logits": {"logits", "clear"}, "clear": {"clear"}}


@pytest.mark.parametrize("phase", list(BLOCKED_AT))
def test_worker_stopped_at_each_phase(phase, worker, dense_pair):
    """The probe stops the worker right before a phase and goes on: whichever llama.cpp call waits on
    it (handshake, tensor upload, KV allocation, compute, logits read, memory clear), the watchdog
    ends the process after --rpc-timeout."""
    endpoint, proc = worker
    try:
        run, took = _timed(subprocess.run, [sys.executable, PROBE, "stop", str(dense_pair.target), "--rpc", endpoint,
                                            "--stop-at", phase, "--worker", str(proc.pid), "--rpc-timeout", TIMEOUT],
                           capture_output=True, text=True, timeout=60)
        _assert_one_line_error(run, f"no answer from the RPC workers for 3 s (--rpc {endpoint})")
        last = [ln for ln in run.stderr.splitlines() if ln.startswith("phase")][-1].removeprefix("phase ")
        assert last in BLOCKED_AT[phase], f"stopped before {phase}, blocked after phase {last}"
        assert took < BOUND
    finally:
        _alive_after_continue(proc)


def test_worker_survives_a_vanished_client_and_serves_the_next_run(worker, dense_pair):
    """A client killed while its worker is stopped: the resumed worker's reply fails (it used to die
    of SIGPIPE); it must go back to accepting and serve a new run."""
    endpoint, proc = worker
    common = ("-m", str(dense_pair.target), "--no-spec", "--rpc", endpoint, "--ignore-eos", "-p", "def f(x):")
    client = subprocess.Popen([sys.executable, "-m", "ggspec.cli", "run", *common, "-n", "3000", "-c", "4096"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout.read(9)  # decoding has started
        os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)
        client.kill()
        client.wait(timeout=10)
    finally:
        if client.poll() is None:
            client.kill()
        _alive_after_continue(proc)
    again = run_cli("run", *common, "-n", "8", "--rpc-timeout", "20", timeout=60)
    assert again.returncode == 0 and again.stdout.startswith("def f(x):"), again.stderr[-2000:]
    assert proc.poll() is None


class _SilentServer:
    """A port that accepts connections (or only lets the kernel queue them) and never answers."""

    def __init__(self, accept: bool) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        if accept:
            threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                self.conns.append(self.sock.accept()[0])  # ... and sleep on it
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("accept", [True, False], ids=["accepts", "listens"])
def test_a_port_that_never_answers(accept, dense_pair, build_info):
    server = _SilentServer(accept)
    try:
        run, took = _timed(run_cli, "run", "-m", str(dense_pair.target), "--no-spec", "--rpc",
                           f"127.0.0.1:{server.port}", "--rpc-timeout", TIMEOUT, "-n", "4", timeout=60)
        _assert_one_line_error(run, f"no answer from the RPC workers for 3 s (--rpc 127.0.0.1:{server.port})")
        assert took < BOUND
    finally:
        server.close()


# --- rpc-server that cannot serve, nonsense options -------------------------------------------------


def test_rpc_server_on_a_port_in_use(build_info):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        proc = run_cli("rpc-server", "-p", str(taken.getsockname()[1]), timeout=30)
    _assert_one_line_error(proc, "the port is in use")


@pytest.mark.parametrize("host, msg", [
    ("999.1.2.3", "not an IPv4 address or a name of this machine"),
    ("::1", "not an IPv4 address or a name of this machine"),
    ("192.0.2.1", "not an address of this machine"),  # TEST-NET-1: valid, not ours
])
def test_rpc_server_on_a_bad_host(host, msg, build_info):
    proc = run_cli("rpc-server", "-H", host, "-p", str(free_port()), timeout=30)
    _assert_one_line_error(proc, msg)


@pytest.mark.parametrize("args, msg", [
    (("--rpc-timeout", "nan"), "--rpc-timeout: nan: expected a finite number of seconds > 0"),
    (("--rpc-timeout", "inf"), "--rpc-timeout: inf: expected a finite number of seconds > 0"),
    (("--rpc-timeout", "0"), "--rpc-timeout: 0: expected a finite number of seconds > 0"),
    (("-sm", "layer", "-ts", "nan,1"), "-ts: nan,1: expected up to 16 finite, non-negative proportions"),
    (("-sm", "layer", "-ts", "inf,1"), "-ts: inf,1: expected up to 16 finite, non-negative proportions"),
    (("-sm", "layer", "-ts", "0,0"), "not all zero"),
])
def test_nonsense_device_options(args, msg, dense_pair):
    # workers that do not exist: every option is refused before anything is contacted
    proc = run_cli("run", "-m", str(dense_pair.target), "--no-spec", "-n", "4",
                   "--rpc", "127.0.0.1:1,127.0.0.1:2", *args, timeout=30)
    _assert_one_line_error(proc, msg)


# --- the Python API after close ----------------------------------------------------------------------

API_SCRIPT = textwrap.dedent('''
    import json, sys
    from ggspec.errors import ClosedError
    from ggspec.runtime import Batch, Context, ContextParams, Model
    from ggspec.speculative.driver import generate_greedy, generate_spec
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import PairConfig

    target, draft = sys.argv[1:3]
    params = ContextParams(n_ctx=256)
    results = {}

    def case(name, fn):
        try:
            fn()
            results[name] = "no error"
        except ClosedError as exc:
            results[name] = "ClosedError: " + str(exc)
        except Exception as exc:
            results[name] = f"{type(exc).__name__}: {exc}"

    m = Model(target)
    toks = m.tokenize("def f(x):")
    m.close()
    m.close()  # twice is fine
    case("model_tokenize", lambda: m.tokenize("hello"))
    case("model_detokenize", lambda: m.detokenize([1, 2, 3]))
    case("model_is_eog", lambda: m.is_eog(0))
    case("context_on_closed_model", lambda: Context(m, params))

    m = Model(target)
    ctx, other = Context(m, params), Context(m, params)
    b = Batch(other)
    ctx.close()
    case("context_decode", lambda: ctx.decode(b.add_tokens(toks, 0)))
    case("context_logits", lambda: ctx.logits())
    case("context_memory", lambda: ctx.truncate(0))
    case("batch_on_closed_context", lambda: Batch(ctx))
    other.decode(b.clear().add_tokens(toks, 0))
    m.close()  # while `other` and its batch are alive: they are closed first, not left dangling
    case("context_after_its_model_closed", lambda: other.logits())
    case("batch_after_its_context_closed", lambda: b.clear())

    sp = Engine.open(PairConfig(target=target, draft=draft, ctx=params))
    list(generate_spec(sp, toks, 4, ignore_eos=True))
    sp.close()
    sp.close()
    case("pair_generate_spec", lambda: list(generate_spec(sp, toks, 4, ignore_eos=True)))
    case("pair_generate_greedy", lambda: list(generate_greedy(sp, toks, 4, ignore_eos=True)))
    case("pair_reset", lambda: sp.reset())
    case("pair_tokenize", lambda: sp.target_model.tokenize("x"))
    print(json.dumps(results))
''')

API_CASES = {
    "model_tokenize": "this Model is closed",
    "model_detokenize": "this Model is closed",
    "model_is_eog": "this Model is closed",
    "context_on_closed_model": "this Model is closed",
    "context_decode": "this Context is closed",
    "context_logits": "this Context is closed",
    "context_memory": "this Context is closed",
    "batch_on_closed_context": "this Context is closed",
    "context_after_its_model_closed": "this Context is closed (closed with the Model it uses)",
    "batch_after_its_context_closed": "this Batch is closed (closed with the Context it uses)",
    "pair_generate_spec": "is closed",
    "pair_generate_greedy": "is closed",
    "pair_reset": "is closed",
    "pair_tokenize": "this Model is closed",
}


@pytest.fixture(scope="module")
def api_results(dense_pair, tmp_path_factory):
    """All API cases in one fresh process (a crash there must not take pytest down)."""
    script = tmp_path_factory.mktemp("api") / "after_close.py"
    script.write_text(API_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(dense_pair.target), str(dense_pair.draft)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc={proc.returncode} (a negative one is a signal: a crash in C++)\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", list(API_CASES))
def test_api_after_close_raises_closed_error(case, api_results):
    assert api_results[case].startswith("ClosedError: "), api_results[case]
    assert API_CASES[case] in api_results[case], api_results[case]


def test_api_after_close_in_process(dense_pair):
    """The same errors in the test process itself: nothing reaches llama.cpp."""
    from ggspec.errors import ClosedError, GGSpecError
    from ggspec.runtime import Batch, Context, ContextParams, Model

    with Model(dense_pair.target) as m, Context(m, ContextParams(n_ctx=128)) as ctx:
        pass
    assert issubclass(ClosedError, GGSpecError)
    for use in (lambda: m.tokenize("x"), lambda: m.token_bytes(1), lambda: ctx.pos_max(), lambda: Batch(ctx),
                lambda: ctx.argmax_rows()):
        with pytest.raises(ClosedError):
            use()
