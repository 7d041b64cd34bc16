"""`python -m ggspec.cli`: a Ctrl-C during the command line's imports ends quietly (ggspec.startup),
then the command runs."""

from __future__ import annotations

if __name__ == "__main__":
    from ggspec.startup import quiet_ctrl_c

    quiet_ctrl_c()

    from ggspec.cli import main

    main()
