"""The one stderr console of the command line, and its three kinds of line: error, note, warning.

Every command writes its notes, warnings, progress bars and error lines to `err`; stdout carries
only the results (generated text, benchmark tables). The package's docstring lists which module
prints what.
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
