"""A watchdog for everything that waits on RPC workers.

The pinned RPC client has no timeouts: a worker that stopped (SIGSTOP, a frozen host) or a port
that accepts connections and never answers leaves llama.cpp blocked forever, in whichever call
happened to need the worker: the handshake inside `ggml_backend_rpc_add_server`, a model load,
context creation, a decode, a logits or layer-input read, a memory/state call, a free. A blocked C
call cannot be interrupted from Python, so the watchdog ends the process (ggspec.fatal)
with one line instead.

One mechanism covers all of those calls, without wrapping any of them: from before the first
contact with a worker (`arm`, called by ggspec.runtime.devices) a daemon thread looks at what
every thread of the process is doing (Linux: /proc/self/task/*/syscall). A thread blocked in one
socket call (connect, send, recv, ...) on a connection to a worker's port, with no progress at all
(not scheduled once) for longer than the limit, means that worker stopped answering. Waiting for a
worker that computes or streams data is progress, and an idle process waits on no worker, so
neither is mistaken for a hang. Where /proc cannot be read this way, the watchdog falls back to
the calls bracketed by `begin()` / `end()` (the decode).
"""

from __future__ import annotations

import math
import os
import platform
import threading
import time

from ggspec import fatal

_limit: float | None = None  # seconds; None: not armed
_what = ""
_ports: set[int] = set()  # the workers' ports: connections to them are watched
_busy_since: float | None = None  # fallback: the bracketed call in progress
_thread: threading.Thread | None = None
_lock = threading.Lock()

# calls that block on a socket given as their first argument: read write readv writev connect
# sendto recvfrom sendmsg recvmsg accept4 recvmmsg sendmmsg (system call numbers per architecture)
_SOCKET_SYSCALLS = {
    "x86_64": {0, 1, 19, 20, 42, 44, 45, 46, 47, 288, 299, 307},
    "aarch64": {63, 64, 65, 66, 203, 206, 207, 211, 212, 242, 243, 269},
}.get(platform.machine())


def arm(limit: float | None, what: str, endpoints=()) -> None:
    """Watch every connection to these "host:port" workers from now on, ending the process after
    `limit` seconds without an answer; `what` names them in the message. Call before the first
    contact (the handshake can block too). limit None: add the workers, keep the limit and names."""
    global _limit, _what, _thread
    if limit is not None and not (isinstance(limit, (int, float)) and math.isfinite(limit) and limit > 0):
        raise ValueError(f"RPC timeout {limit!r}: expected a finite number of seconds > 0")
    with _lock:
        if limit is not None:
            _limit, _what = float(limit), what
        for e in endpoints:
            _ports.add(int(str(e).rpartition(":")[2]))
        if _thread is None:
            _thread = threading.Thread(target=_watch, name="ggspec-rpc-watchdog", daemon=True)
            _thread.start()


def armed() -> bool:
    return _limit is not None


def begin() -> None:
    """A llama.cpp call that may wait on RPC workers starts (used only where /proc can't be read)."""
    global _busy_since
    _busy_since = time.monotonic()


def end() -> None:
    global _busy_since
    _busy_since = None


def _fire() -> None:
    fatal.end(f"no answer from the RPC workers for {_limit:g} s ({_what}); "
              "a worker stopped or its host is unreachable (raise the RPC timeout for slow links)")


# --- /proc inspection ------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _proc_usable() -> bool:
    """Whether this kernel shows a thread's current system call to the process itself."""
    if _SOCKET_SYSCALLS is None:
        return False
    me = _read(f"/proc/self/task/{threading.get_native_id()}/syscall")
    return bool(me) and _read("/proc/net/tcp") is not None


def _blocked_threads() -> dict[int, tuple[int, str]]:
    """tid -> (fd, what identifies this one wait) for threads blocked in a socket call on an fd."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        line = _read(f"/proc/self/task/{tid}/syscall")
        if not line:
            continue
        fields = line.split()
        if len(fields) < 2 or not fields[0].lstrip("-").isdigit() or int(fields[0]) not in _SOCKET_SYSCALLS:
            continue
        fd = int(fields[1], 16)
        # the same call, never scheduled since: identical syscall line and run count
        runs = (_read(f"/proc/self/task/{tid}/schedstat") or _read(f"/proc/self/task/{tid}/status") or "").split()
        out[int(tid)] = (fd, line.strip() + "|" + (runs[-1] if runs else ""))
    return out


def _worker_sockets() -> set[str]:
    """Inodes of this network namespace's TCP sockets whose remote port is a worker's."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        text = _read(table) or ""
        for row in text.splitlines()[1:]:
            cols = row.split()
            if len(cols) > 9 and int(cols[2].rpartition(":")[2], 16) in _ports:
                inodes.add(cols[9])
    return inodes


def _is_worker_fd(fd: int, inodes: set[str]) -> bool:
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    return link.startswith("socket:[") and link[8:-1] in inodes


def _watch() -> None:
    use_proc = _proc_usable()
    waits: dict[int, tuple[str, float]] = {}  # tid -> (wait key, first seen)
    while True:
        limit = _limit or 1.0
        time.sleep(min(0.5, max(0.02, limit / 6)))
        try:
            waits = _check(use_proc, limit, waits)
        except Exception:  # noqa: BLE001 - a surprise in /proc must not end the watch
            waits = {}


def _check(use_proc: bool, limit: float, waits: dict[int, tuple[str, float]]) -> dict[int, tuple[str, float]]:
    now = time.monotonic()
    if _limit is None:
        return {}
    if not use_proc:
        since = _busy_since
        if since is not None and now - since > limit:
            _fire()
        return waits
    blocked = _blocked_threads()
    inodes = _worker_sockets() if blocked else set()
    current = {}
    for tid, (fd, key) in blocked.items():
        if not _is_worker_fd(fd, inodes):
            continue
        seen = waits.get(tid)
        current[tid] = seen if seen is not None and seen[0] == key else (key, now)
        if now - current[tid][1] > limit:
            _fire()
    return current
