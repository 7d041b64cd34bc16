"""The `ggspec` console script (and `python -m ggspec`): a Ctrl-C during the command line's
imports ends quietly (ggspec.startup), then ggspec.cli runs."""

from __future__ import annotations

from ggspec.startup import quiet_ctrl_c


def main() -> None:
    quiet_ctrl_c()
    from ggspec.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
