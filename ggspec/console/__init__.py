"""What the command line shows: everything a command prints besides its own results.

`err` is the one stderr console every command writes its notes, warnings, progress bars and error
lines to (stdout carries only the results: generated text, benchmark tables). The modules here
turn library results into those lines:

- `config`: run's and serve's PairConfig from their flags (with a note for a target-only pair);
- `run`: `ggspec run`'s decode of its prompts, printed in order (`printer`), then the verdict;
- `printer`: the ordered output of several prompts and each one's stats line;
- `verdict`: run's last line (speculation against plain decoding) and `--check`;
- `build`, `models`, `distill`: the progress bars and result lines of those commands.
"""

from __future__ import annotations

from rich.console import Console

err = Console(stderr=True, highlight=False)


def error(message: str) -> None:
    """One error line (the message is text, not markup)."""
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def note(message: str) -> None:
    """One note line: how it runs, not a problem (the message is text, not markup)."""
    from rich.markup import escape

    err.print(f"[cyan]note:[/] {escape(message)}", soft_wrap=True)


def warn(message: str) -> None:
    """One warning line (the message may carry markup)."""
    err.print(f"[yellow]warning:[/] {message}", soft_wrap=True)
