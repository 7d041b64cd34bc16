"""Multi-device runs through llama.cpp's RPC backend: two workers on loopback, started here.

Every llama.cpp client runs in a subprocess (tests/rpc_probe.py or the CLI): a worker serves one
client at a time and a client keeps its connection until its process ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import run_cli
from helpers.rpc import PROBE, free_port, start_worker, stop

from ggspec.catalogue.tiny import write_dflash_draft

PROMPT = "def parse(path):"


@pytest.fixture(scope="module")
def workers(build_info):
    ports = [free_port(), free_port()]
    procs = [start_worker(p) for p in ports]
    yield ",".join(f"127.0.0.1:{p}" for p in ports)
    for p in procs:
        stop(p)


def _probe(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, PROBE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("mode", ["tensor", "layer"])
def test_split_logits_match_one_device(kind, mode, workers, dense_pair, hybrid_pair, tmp_path):
    target = (dense_pair if kind == "dense" else hybrid_pair).target
    one, split = tmp_path / "one.npy", tmp_path / "split.npy"
    assert _probe("logits", str(target), str(one)).returncode == 0
    proc = _probe("logits", str(target), str(split), "--rpc", workers, "-sm", mode)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = np.load(one), np.load(split)
    nmse = float(((a - b) ** 2).mean() / (a ** 2).mean())
    # f32 weights and caches, flash attention on in both runs: only summation order differs
    assert nmse < 1e-6, nmse
    assert (a.argmax(axis=1) == b.argmax(axis=1)).mean() >= 0.95


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("mode", ["tensor", "layer"])
def test_greedy_speculation_is_lossless_across_devices(kind, mode, workers, dense_pair, hybrid_pair):
    pair = dense_pair if kind == "dense" else hybrid_pair
    common = ("--rpc", workers, "-sm", mode, "-n", "24", "--ignore-eos", "-p", PROMPT)
    spec = run_cli("run", "-m", str(pair.target), "-md", str(pair.draft), "--spec-draft-n-max", "7", *common)
    plain = run_cli("run", "-m", str(pair.target), "--no-spec", *common)
    assert spec.returncode == 0 and plain.returncode == 0, spec.stderr[-2000:] + plain.stderr[-2000:]
    assert spec.stdout == plain.stdout and len(spec.stdout) > len(PROMPT)
    assert f"devices (-sm {mode}" in spec.stderr and "RPC0" in spec.stderr and "RPC1" in spec.stderr


def test_draft_with_its_own_head_needs_the_mirror(workers, dense_pair, tmp_path):
    draft = write_dflash_draft(tmp_path / "own-head.gguf", target_kind="dense", seed=0, own_head_vocab=256)
    target = str(dense_pair.target)
    # raw llama.cpp, past ggspec's check: the d2t scatter asserts on a vocab-split head
    raw = _probe("own-head", target, str(draft), "--rpc", workers, "-sm", "tensor")
    assert raw.returncode != 0
    assert "GGML_ASSERT(src_ss[0].axis != GGML_BACKEND_SPLIT_AXIS_1)" in raw.stderr
    ok = _probe("own-head", target, str(draft), "--rpc", workers, "-sm", "tensor", "--mirror")
    assert ok.returncode == 0 and ok.stdout.startswith("drafts"), ok.stderr[-2000:]
    # ggspec itself refuses before loading anything, in one line
    common = ("--rpc", workers, "-sm", "tensor", "-n", "16", "--ignore-eos", "-p", PROMPT)
    refused = run_cli("run", "-m", target, "-md", str(draft), *common)
    assert refused.returncode == 1 and "--mirror-output: the draft has its own output head" in refused.stderr and "Traceback" not in refused.stderr
    spec = run_cli("run", "-m", target, "-md", str(draft), "--mirror-output", *common)
    plain = run_cli("run", "-m", target, "--no-spec", *common)
    assert spec.returncode == 0, spec.stderr[-2000:]
    assert spec.stdout == plain.stdout and "output head mirrored" in spec.stderr
    assert "output head split by vocabulary rows" in plain.stderr


@pytest.mark.parametrize("failure", ["killed", "stopped"])
def test_a_worker_that_fails_mid_run_is_a_clear_error_not_a_hang(failure, dense_pair, build_info):
    """killed: its socket closes and llama.cpp aborts (turned into one line); stopped: alive with its
    socket open, llama.cpp's RPC client would wait forever (the --rpc-timeout watchdog ends it)."""
    ports = [free_port(), free_port()]
    procs = [start_worker(p) for p in ports]
    rpc = ",".join(f"127.0.0.1:{p}" for p in ports)
    try:
        run = subprocess.Popen([sys.executable, "-m", "ggspec.cli", "run", "-m", str(dense_pair.target),
                                "-md", str(dense_pair.draft), "--rpc", rpc, "-sm", "tensor", "-n", "3500",
                                "-c", "4096", "--ignore-eos", "--rpc-timeout", "3", "-p", PROMPT],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert run.stdout.read(len(PROMPT) + 8)  # decoding has started
        if failure == "killed":
            stop(procs[1])
        else:
            os.killpg(procs[1].pid, signal.SIGSTOP)
        try:
            _, err = run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            pytest.fail(f"the run hung on a {failure} worker")
        assert run.returncode == 1 and "Traceback" not in err, err[-2000:]
        want = {"killed": f"error: llama.cpp aborted: an RPC worker stopped answering (--rpc {rpc})",
                "stopped": f"error: no answer from the RPC workers for 3 s (--rpc {rpc})"}[failure]
        assert want in err, err[-2000:]
    finally:
        if procs[1].poll() is None:
            os.killpg(procs[1].pid, signal.SIGCONT)
        for p in procs:
            stop(p)


def test_rpc_server_warns_before_binding_beyond_loopback(build_info):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ggspec.cli", "rpc-server", "-H", "0.0.0.0", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = proc.stderr.readline() + proc.stderr.readline()
        assert "warning: binding 0.0.0.0" in first and "no authentication" in first
    finally:
        stop(proc)


@pytest.mark.parametrize("args, msg", [
    (("--rpc", "localhost"), "expected host:port"),
    (("--rpc", "127.0.0.1:1"), "cannot reach the RPC worker"),
    (("-sm", "tensor"), "-sm: tensor splits a model across devices"),
    (("-sm", "diagonal"), "expected one of none, layer, row, tensor"),
    (("--rpc", "127.0.0.1:1,127.0.0.1:2", "-ts", "1,1,1"), "-ts: 3 proportions for 2 RPC devices"),
    (("--mirror-output",), "--mirror-output: only applies to a tensor split"),
])
def test_bad_device_input_is_one_line(args, msg, dense_pair):
    proc = run_cli("run", "-m", str(dense_pair.target), "--no-spec", "-n", "4", *args)
    assert proc.returncode == 1 and msg in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_bench_runs_on_the_workers(workers, dense_pair):
    proc = run_cli("bench", "-m", str(dense_pair.target), "-md", str(dense_pair.draft), "--spec-draft-n-max", "3",
                   "--rpc", workers, "-sm", "tensor", "-r", "1", "-n", "8", "--no-warmup", "-o", "jsonl", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {r["devices"] for r in rows} == {f"-sm tensor over {workers}"}
    spec = [r for r in rows if r["kind"] == "spec" and r["category"] == "all"]
    assert spec and spec[0]["identical"] == "12/12"
    refused = run_cli("bench", "-m", str(dense_pair.target), "-md", str(dense_pair.draft), "--native", "--rpc", workers)
    assert refused.returncode == 1 and "serves one client at a time" in refused.stderr
