"""A Ctrl-C while the command line starts ends like one later: "interrupted", exit status 130.

Importing the command line (typer, rich, numpy) takes a noticeable moment; a Ctrl-C in that moment
must not end in a traceback from whichever import it hit. Until `ggspec.cli.main` installs its own
handler, SIGINT ends the process at once: nothing has been started that would need cleaning up.
Both ways in (`ggspec`, i.e. `ggspec.__main__`, and `python -m ggspec.cli`) install this first.
"""

from __future__ import annotations

import os
import signal


def interrupted_while_starting(signum, frame) -> None:
    """The SIGINT handler until the CLI's own: one line, exit 130, no cleanup needed."""
    try:
        os.write(2, b"interrupted\n")
    finally:
        os._exit(130)


def quiet_ctrl_c() -> None:
    """Install `interrupted_while_starting` (before the slow imports)."""
    signal.signal(signal.SIGINT, interrupted_while_starting)
