"""How a `ggspec` command ends: every expected failure is one line on stderr and a non-zero exit.

A GGSpecError (bad input, llama.cpp refusing a request, a failed build or save) is `error: ...`,
prefixed with the flag of the field it names (options.error_text), exit 1; a pair not pulled
yet says how to pull it; a closed or full stdout is one line (a closed pipe, `| head`, none: exit
141); Ctrl-C is "interrupted", exit 130; and when llama.cpp cannot go on (a ggml abort, a silent
RPC worker) the process ends at once with one line, exit 1 (ggspec.fatal).
"""

from __future__ import annotations

import sys
from typing import NoReturn

from ggspec import fatal
from ggspec.cli.console import err, error
from ggspec.cli.options import error_text
from ggspec.errors import GGSpecError
from ggspec.streams import StdoutError, guard_std_streams

INTERRUPTED, BROKEN_PIPE = 130, 141


def run_app(app) -> NoReturn:
    """Run the typer `app` on sys.argv and exit with its status, or with one line per failure."""
    import signal

    from ggspec.catalogue.pairs import NotPulledError
    from ggspec.native.bindings import NotBuiltError, interrupt_outside_callbacks
    from ggspec.native.build import BuildError

    guard_std_streams(err)
    fatal.set_handler(die)  # llama.cpp cannot go on (a ggml abort, a silent RPC worker): one line, exit 1
    try:
        signal.signal(signal.SIGINT, interrupt_outside_callbacks)  # Ctrl-C is never lost in a llama.cpp callback
        try:
            app()
            code = 0
        except SystemExit as exc:
            code = exc.code
        sys.stdout.flush()  # a full disk shows here, not as "Exception ignored" at exit
    except StdoutError as exc:
        if exc.broken_pipe:  # `| head`: the reader has all it wanted
            sys.exit(BROKEN_PIPE)
        error(str(exc))
        sys.exit(1)
    except NotPulledError as exc:
        error(f"{exc}: run `ggspec models pull {exc.name}`")
        sys.exit(1)
    except (GGSpecError, NotBuiltError, BuildError) as exc:
        error(error_text(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(INTERRUPTED)
    sys.exit(code)


def die(reason: str) -> None:
    """Runs on whatever thread found that the process cannot continue: say why, end it now."""
    import os

    try:
        sys.stderr.write(f"error: {reason}\n")
        sys.stderr.flush()
    finally:
        os._exit(1)
