"""`ggspec rpc-server`: run this build's ggml-rpc-server in the foreground and watch over it.

The worker serves forever, so any exit of its own (even with status 0) is a failure; a SIGTERM or
SIGHUP to this process, or a Ctrl-C, stops the worker too and counts as a clean stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from ggspec.errors import GGSpecError

OPEN_WARNING = ("[bold yellow]warning:[/] binding {where}: llama.cpp's RPC protocol has no authentication or "
                "encryption; anyone who can reach this port can run code on this worker's memory. Only do this "
                "on a trusted network.")


class WorkerError(GGSpecError):
    """The worker is not built, could not start, or stopped on its own."""


def executable() -> Path:
    """This build's ggml-rpc-server."""
    from ggspec.native.bindings import library_path

    exe = library_path() / "ggml-rpc-server"
    if not exe.is_file():
        raise WorkerError("ggml-rpc-server is not built: run `ggspec build`")
    return exe


def supervise(exe: Path, where: str, address: str, port: int, threads: int, cache: bool,
              log: Callable[[str], None]) -> None:
    """Run the worker on `address` (an IPv4 literal, checked bindable: ggml-rpc-server takes no
    names and exits 0 when it cannot bind) until it is stopped; `where` is host:port as the user
    gave it, for the lines `log` gets. Raises WorkerError when the worker ends on its own."""
    if not address.startswith("127."):  # beyond loopback
        log(OPEN_WARNING.format(where=where))
    cmd = [str(exe), "-H", address, "-p", str(port), "-t", str(threads)] + (["-c"] if cache else [])
    log(f"RPC worker on {where} ({threads} thread{'s' if threads != 1 else ''}); Ctrl-C stops it")
    # restore_signals=False: the worker inherits Python's ignored SIGPIPE, so a client that vanishes
    # mid-reply (killed, timed out) costs it a failed send (it then serves the next client) instead
    # of its life
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python's default already; inherited through exec
    try:
        proc = subprocess.Popen(cmd, env=dict(os.environ), restore_signals=False)
    except OSError as exc:
        raise WorkerError(f"cannot start ggml-rpc-server: {exc.strerror or exc}") from None
    stopping: list[int] = []

    def stop_worker(signum, _frame) -> None:  # `kill PID` stops the worker too, not just this wrapper
        stopping.append(signum)
        proc.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_worker)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=5)  # the terminal sent SIGINT to the whole group
        except subprocess.TimeoutExpired:
            proc.kill()
        return
    if stopping or rc in (-signal.SIGINT, 130):
        return
    raise WorkerError(f"ggml-rpc-server on {where} stopped ({f'signal {-rc}' if rc < 0 else f'exit status {rc}'})")
