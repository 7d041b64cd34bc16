"""The `ggspec` console script (and `python -m ggspec`).

Importing the command line (typer, rich, numpy) takes a noticeable moment; a Ctrl-C in that moment
must end like one later, with "interrupted" and exit status 130, not a traceback from whichever
import it hit. Until `ggspec.cli.main` installs its own handler, SIGINT ends the process at once:
nothing has been started that would need cleaning up.
"""

from __future__ import annotations

import os
import signal


def _interrupted_while_starting(signum, frame) -> None:
    try:
        os.write(2, b"interrupted\n")
    finally:
        os._exit(130)


def main() -> None:
    signal.signal(signal.SIGINT, _interrupted_while_starting)
    from ggspec.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
