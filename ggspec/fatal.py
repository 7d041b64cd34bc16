"""What happens when llama.cpp cannot go on: a ggml abort, or an RPC worker that stopped answering.

Neither can be turned into an exception: ggml aborts the process once its abort callback returns,
and a call blocked inside the RPC client never returns. The library only reports the reason
(`end`); the application decides how the process ends (`set_handler`): the CLI prints one error
line and exits 1. Without a handler the reason goes to stderr and the process aborts, as llama.cpp
itself would.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

_handler: Callable[[str], None] | None = None


def set_handler(handler: Callable[[str], None] | None) -> None:
    """`handler(reason)` ends the process (it must not return); None restores the default."""
    global _handler
    _handler = handler


def end(reason: str) -> NoReturn:
    """Called on whatever thread found that the process cannot continue."""
    if _handler is not None:
        _handler(reason)
    try:
        sys.stderr.write(f"ggspec: {reason}\n")
        sys.stderr.flush()
    finally:
        os.abort()
