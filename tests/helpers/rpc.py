"""llama.cpp RPC workers (`ggspec rpc-server`) on loopback, and the probe that runs a client in a
subprocess (tests/rpc_probe.py: a worker serves one client at a time, who keeps it till it exits)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PROBE = str(Path(__file__).resolve().parents[1] / "rpc_probe.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(port: int, host: str = "127.0.0.1") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "ggspec.cli", "rpc-server", "-H", host, "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group: stop it and its ggml-rpc-server
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.1)
    else:
        stop(proc)
        raise RuntimeError(f"RPC worker on port {port} did not start")
    # the probe connection above was this worker's one client: let it go back to accepting
    time.sleep(0.2)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
