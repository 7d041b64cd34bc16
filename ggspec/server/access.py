"""Who may use the server: API keys, as llama-server checks them.

With keys set (`--api-key`, `--api-key-file`, `LLAMA_API_KEY`) every request but the health check
(and a browser's CORS preflight, which carries no credentials) must bring one, as `Authorization:
Bearer KEY` or `X-Api-Key: KEY` (Anthropic's header, which llama-server also reads when there is no
Authorization); otherwise it is answered 401 with llama-server's body, before any route runs.
Keys are compared in constant time (each one, whatever the first comparisons found), and neither
a key nor anything a request sent is logged.
"""

from __future__ import annotations

import hmac
import json
import logging

log = logging.getLogger("ggspec.server")
OPEN_PATHS = frozenset({"/health", "/v1/health"})  # llama-server's public endpoints
BEARER = b"Bearer "
UNAUTHORIZED = json.dumps({"error": {"message": "Invalid API Key", "type": "authentication_error",
                                     "code": 401}}).encode()


class ApiKeys:
    """ASGI middleware: requests without one of `keys` get a 401 (module docstring)."""

    def __init__(self, app, keys: tuple[str, ...], open_paths: frozenset[str] = frozenset(), on_refused=None) -> None:
        self.app = app
        self.keys = [k.encode("utf-8") for k in keys]
        self.open_paths = OPEN_PATHS | open_paths  # and the web UI's files (a page loads before its key is typed)
        self.on_refused = on_refused  # called once per refused request (the metrics' count)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        log.warning("unauthorized: invalid API key (%s %s)", scope.get("method"), scope.get("path"))
        if self.on_refused is not None:
            self.on_refused()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json; charset=utf-8"),
                                (b"content-length", str(len(UNAUTHORIZED)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": UNAUTHORIZED})

    def allowed(self, scope) -> bool:
        if scope.get("method") == "OPTIONS" or scope.get("path") in self.open_paths:
            return True
        return self.matches(presented(scope["headers"]))

    def matches(self, key: bytes) -> bool:
        """Whether `key` is one of the keys; every key is compared, each in constant time."""
        found = False
        for k in self.keys:
            found |= hmac.compare_digest(k, key)
        return found and bool(key)


def presented(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The key a request brings: its first Authorization header's (less "Bearer "), else its
    first X-Api-Key header's; empty where it brings none."""
    found = {}
    for name, value in headers:
        found.setdefault(name.lower(), value)
    key = found.get(b"authorization") or found.get(b"x-api-key") or b""
    return key[len(BEARER):] if key.startswith(BEARER) else key
