"""Whether this process can listen on host:port, asked before anything is loaded or started.

`ggspec serve` and `ggspec rpc-server` both listen on IPv4 only; a name is resolved and the
address bound once (and closed again), so a listener that cannot start fails in one line instead
of after a model load, or (ggml-rpc-server) with a message and exit status 0.
"""

from __future__ import annotations

import socket

from ggspec.errors import InputError

_WHY = {98: "the port is in use ({in_use})", 99: "not an address of this machine",
        13: "permission denied (ports below 1024 need privileges)"}


def check_bind(host: str, port: int, flag: str, ipv4_note: str, in_use: str) -> str:
    """The IPv4 address of `host` once a socket could bind it with `port`. `flag` (the option that
    gave the host), `ipv4_note` and `in_use` (a guess at who holds the port) word the errors."""
    try:
        address = socket.gethostbyname(host)
    except (OSError, UnicodeError):
        raise InputError(f"{flag} {host}: not an IPv4 address or a name of this machine ({ipv4_note})") from None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listeners do
            probe.bind((address, port))
    except OSError as exc:
        why = _WHY[exc.errno].format(in_use=in_use) if exc.errno in _WHY else (exc.strerror or str(exc))
        raise InputError(f"cannot listen on {host}:{port}: {why}") from None
    return address
