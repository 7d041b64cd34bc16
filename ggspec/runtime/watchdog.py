"""A watchdog for llama.cpp calls that wait on RPC workers.

The pinned RPC client has no timeout: a worker whose host vanished or that stopped (without
closing its socket) leaves `llama_process` blocked forever. When RPC devices are in use, a
daemon thread watches every llama.cpp compute call; one that runs longer than the limit ends
the process with one line (the blocked C call cannot be interrupted from Python).
"""

from __future__ import annotations

import os
import sys
import threading
import time

_limit: float | None = None  # seconds; None: no watchdog
_what = ""
_busy_since: float | None = None
_thread: threading.Thread | None = None


def arm(limit: float, what: str) -> None:
    """Watch every later call between begin() and end(); `what` names the workers in the message."""
    global _limit, _what, _thread
    _limit, _what = limit, what
    if _thread is None:
        _thread = threading.Thread(target=_watch, name="ggspec-rpc-watchdog", daemon=True)
        _thread.start()


def begin() -> None:
    """A llama.cpp call that may wait on RPC workers starts (cheap: one clock read)."""
    global _busy_since
    _busy_since = time.monotonic()


def end() -> None:
    global _busy_since
    _busy_since = None


def _watch() -> None:
    while True:
        time.sleep(0.5)
        since = _busy_since
        if _limit is not None and since is not None and time.monotonic() - since > _limit:
            sys.stderr.write(f"error: no answer from the RPC workers for {_limit:g} s ({_what}); "
                             "a worker stopped or its host is unreachable (raise --rpc-timeout for slow links)\n")
            sys.stderr.flush()
            os._exit(1)
