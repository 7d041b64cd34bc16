"""`ggspec serve`: the checks before anything is loaded, and the warning for a public address."""

from __future__ import annotations

from ggspec.cli.console import err
from ggspec.errors import InputError

SERVE_PACKAGES = ("starlette", "uvicorn", "pydantic", "prometheus_client")  # ggspec[serve]


def listen_address(host: str, port: int, *, max_queue: int, drain_timeout: float, cache_ram: int) -> str:
    """The IPv4 address to listen on, once serve's flags are checked (each failure an InputError
    naming its flag), its extra packages are found and the address could be bound; a warning when
    it is reachable beyond this machine."""
    import importlib.util

    from ggspec.bind import check_bind

    if not 0 < port < 65536:
        raise InputError(f"--port {port}: expected a port number (1..65535)")
    if max_queue < 0:
        raise InputError(f"--max-queue {max_queue}: expected 0 or more")
    if drain_timeout < 0:
        raise InputError(f"--drain-timeout {drain_timeout}: expected 0 or more seconds")
    if cache_ram < -1:
        raise InputError(f"--cache-ram {cache_ram}: expected MiB (-1: no limit, 0: off)")
    missing = [m for m in SERVE_PACKAGES if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"`ggspec serve` needs {', '.join(missing)}: pip install 'ggspec[serve]'")
    address = check_bind(host, port, "--host", "the server listens on IPv4", "another server?")
    if not address.startswith("127."):
        err.print(f"[bold yellow]warning:[/] listening on {host}:{port}, beyond this machine: the server has no "
                  "authentication; anyone who can reach the port can use it.", soft_wrap=True)
    return address
