"""A rich progress display for `ggspec build`: one line per phase, a live compile count."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ggspec.native.build import Reporter


class RichReporter(Reporter):
    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
            console=console, transient=False,
        )
        self.task = None
        self.phase_name = ""
        self.units = 0

    def __enter__(self) -> "RichReporter":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.task is not None and exc[0] is None:
            self.progress.update(self.task, completed=100, description=f"done ({self.units} units compiled)")
        self.progress.stop()

    def phase(self, name: str) -> None:
        self.phase_name = name
        if self.task is None:
            self.task = self.progress.add_task(name, total=100)
        self.progress.update(self.task, description=name)

    def compile_line(self, percent: int | None, text: str) -> None:
        if text.startswith("Building"):
            self.units += 1
            self.phase_name = "compile"
        elif text.startswith("Linking"):
            self.phase_name = "link"
        if percent is None:
            return
        desc = f"{self.phase_name}: {self.units} units" + (f" · {text.split()[-1]}" if self.phase_name == "link" else "")
        self.progress.update(self.task, completed=percent, description=desc)
