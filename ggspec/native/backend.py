"""ctypes declarations for the ggml backend and RPC functions ggspec calls directly.

llama-cpp-python's bindings cover libllama only. Device selection for multi-device runs needs a
few plain-C functions of libggml-base / libggml-rpc (the same objects libllama already loaded),
and a ggml abort callback: llama.cpp aborts the process when an RPC worker dies, and the user
should see one line saying so rather than a core dump.
"""

from __future__ import annotations

import ctypes
from ctypes import CFUNCTYPE, POINTER, c_char_p, c_size_t, c_void_p
from functools import cache
from types import SimpleNamespace

from ggspec import fatal
from ggspec.native.bindings import library_path, load

_ABORT_CB = CFUNCTYPE(None, c_char_p)
_abort_callback = None  # keeps the ctypes callback alive
_hint = ""  # what the abort message names (the --rpc workers in use)


@cache
def ggml() -> SimpleNamespace:
    """The ggml backend / RPC functions, declared once (loads llama.cpp if needed)."""
    load()  # libllama first: it pulls in libggml*, which the CDLLs below then share
    lib_dir = library_path()
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    rpc = ctypes.CDLL(str(lib_dir / "libggml-rpc.so"))

    def fn(lib, name, argtypes, restype):
        f = getattr(lib, name)
        f.argtypes, f.restype = argtypes, restype
        return f

    return SimpleNamespace(
        rpc_add_server=fn(rpc, "ggml_backend_rpc_add_server", [c_char_p], c_void_p),
        reg_dev_count=fn(base, "ggml_backend_reg_dev_count", [c_void_p], c_size_t),
        reg_dev_get=fn(base, "ggml_backend_reg_dev_get", [c_void_p, c_size_t], c_void_p),
        dev_name=fn(base, "ggml_backend_dev_name", [c_void_p], c_char_p),
        dev_description=fn(base, "ggml_backend_dev_description", [c_void_p], c_char_p),
        dev_memory=fn(base, "ggml_backend_dev_memory", [c_void_p, POINTER(c_size_t), POINTER(c_size_t)], None),
        set_abort_callback=fn(base, "ggml_set_abort_callback", [_ABORT_CB], _ABORT_CB),
    )


def install_abort_handler(hint: str) -> None:
    """Turn a ggml abort (an assertion, a lost RPC worker) into one reason handed to
    ggspec.fatal, whose handler ends the process (the CLI: one line, exit 1).

    Runs on whatever thread aborted (e.g. the RPC dispatcher); the process cannot continue."""
    global _abort_callback, _hint
    _hint = hint
    if _abort_callback is not None:
        return

    def on_abort(message: bytes | None) -> None:
        text = (message or b"").decode(errors="replace").strip().splitlines()
        why = text[-1] if text else "unknown error"
        if "RPC server" in why or "Failed to connect" in why or "RPC handshake" in why:
            why = f"an RPC worker stopped answering ({_hint}): {why.rsplit(': ', 1)[-1]}"
        fatal.end(f"llama.cpp aborted: {why}")

    _abort_callback = _ABORT_CB(on_abort)
    ggml().set_abort_callback(_abort_callback)
