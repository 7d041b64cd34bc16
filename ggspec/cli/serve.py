"""`ggspec serve`: the checks before anything is loaded (flags, keys, TLS files), and the
warnings for a public address."""

from __future__ import annotations

from pathlib import Path

from ggspec.cli.console import err
from ggspec.errors import InputError

SERVE_PACKAGES = ("starlette", "uvicorn", "pydantic", "prometheus_client")  # ggspec[serve]


def api_keys(given: list[str], key_file: Path | None) -> tuple[str, ...]:
    """The keys of --api-key (each a comma-separated list, as llama-server reads it) and of
    --api-key-file (one per line, # comments), as llama-server takes them."""
    keys = [k.strip() for value in given for k in value.split(",") if k.strip()]
    if given and not keys:
        raise InputError("--api-key: an empty key (give the key itself)")
    if key_file is not None:
        try:
            lines = key_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--api-key-file {key_file}: cannot read it ({exc.__class__.__name__})") from None
        in_file = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        if not in_file:
            raise InputError(f"--api-key-file {key_file}: it holds no key (one per line)")
        keys += in_file
    return tuple(dict.fromkeys(keys))


def tls_files(key: Path | None, cert: Path | None) -> tuple[Path, Path] | None:
    """(--ssl-key-file, --ssl-cert-file), checked by loading them as the server will; None: plain HTTP."""
    import ssl

    if key is None and cert is None:
        return None
    if key is None or cert is None:
        raise InputError("--ssl-key-file and --ssl-cert-file go together: give both, or neither for plain HTTP")
    for flag, path in (("--ssl-key-file", key), ("--ssl-cert-file", cert)):
        if not path.is_file():
            raise InputError(f"{flag} {path}: no such file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc.__class__.__name__
        raise InputError(f"--ssl-cert-file {cert} / --ssl-key-file {key}: not a PEM certificate and its key ({reason})") from None
    return key, cert


def listen_address(host: str, port: int, *, max_queue: int, drain_timeout: float, cache_ram: int,
                   keyed: bool = False, tls: bool = False, ctx_checkpoints: int = 0, prefill_chunk: int = 0) -> str:
    """The IPv4 address to listen on, once serve's flags are checked (each failure an InputError
    naming its flag), its extra packages are found and the address could be bound; a warning when
    it is reachable beyond this machine without a key, or with keys sent in clear text."""
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
    if ctx_checkpoints < 0:
        raise InputError(f"--ctx-checkpoints {ctx_checkpoints}: expected 0 or more checkpoints per slot")
    if prefill_chunk < 0:
        raise InputError(f"--prefill-chunk {prefill_chunk}: expected 0 or more rows (0: every prompt whole)")
    missing = [m for m in SERVE_PACKAGES if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"`ggspec serve` needs {', '.join(missing)}: pip install 'ggspec[serve]'")
    address = check_bind(host, port, "--host", "the server listens on IPv4", "another server?")
    if not address.startswith("127.") and not keyed:
        err.print(f"[bold yellow]warning:[/] listening on {host}:{port}, beyond this machine, without a key: anyone "
                  "who can reach the port can use it (--api-key or --api-key-file).", soft_wrap=True)
    elif not address.startswith("127.") and not tls:
        err.print(f"[bold yellow]warning:[/] listening on {host}:{port}, beyond this machine, over plain HTTP: keys "
                  "and text cross the network readable (--ssl-key-file and --ssl-cert-file).", soft_wrap=True)
    return address
