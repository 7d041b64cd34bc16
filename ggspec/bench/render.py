"""`ggspec bench`'s output: progress while a session measures, then the results in one format.

Whatever happens (Ctrl-C, a failed run, a save that fails), the table of what was measured is
printed before the error, and the last lines say how to continue (--resume) or where the results are.
"""

from __future__ import annotations

import json
import sys

from ggspec.bench import report
from ggspec.cli.console import err
from ggspec.errors import GGSpecError
from ggspec.streams import StdoutError

FORMATS = ("md", "csv", "json", "jsonl")
INTERRUPTED = 130  # the exit status after Ctrl-C


def measure_and_print(session, output: str, plot: bool) -> int:
    """Measure, saving after every configuration, then print the rows as `output` (one of FORMATS)
    and write plots next to the saved file. The exit status: 0, or INTERRUPTED; a failure is
    re-raised after the table."""
    interrupted, failure = False, None
    try:
        _measure(session)
    except KeyboardInterrupt:
        interrupted = True
    except Exception as exc:  # a failed run or save: report it after the table of what was measured
        failure = exc
    finally:
        session.close()
    try:
        doc = session.save()
    except GGSpecError as exc:  # the save failed (again): the table below is all there is
        doc = session.document()
        failure = failure or exc
    except KeyboardInterrupt:
        doc = session.document()
        interrupted = True
    rows, path, saved = doc["rows"], session.plan.save_path, session.saved
    try:
        sys.stdout.write(render(doc, output, session.settings))
        sys.stdout.flush()
    except StdoutError:
        if saved and rows:
            err.print(f"the results are saved in {path}", soft_wrap=True)
        raise
    if path is not None and plot and rows and saved:
        _plots(doc, path)
    if failure is not None:
        if rows:
            err.print(f"the table shows what was measured before the error"
                      f"{f'; --resume {path} continues it' if saved else ''}", soft_wrap=True)
        raise failure
    if interrupted:
        _say_interrupted(session, path, saved)
        return INTERRUPTED
    return 0


def _measure(session) -> None:
    """The warnings and skipped configurations, then every configuration to do under progress bars."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    for w in session.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    for s in session.skipped:
        err.print(f"[yellow]skipped:[/] {escape(s.label)}: {escape(s.reason)}", soft_wrap=True)
    todo = session.todo()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        overall = progress.add_task(f"{len(todo)} configurations", total=session.remaining_pairs())
        for cfg in todo:
            task = progress.add_task(f"  {cfg.label}", total=session.missing(cfg))
            for run in session.config_runs(cfg):
                if run.paired_with:  # the second run of a pair: one step done
                    progress.advance(task)
                    progress.advance(overall)
            progress.remove_task(task)
            session.save()


def render(doc: dict, output: str, settings) -> str:
    """The document's rows as `output`: md (a table, empty without rows), csv, jsonl, or the whole document as json."""
    rows = doc["rows"]
    if output == "md":
        return report.to_markdown(rows, settings) if rows else ""
    if output == "csv":
        return report.to_csv(rows)
    if output == "jsonl":
        return report.to_jsonl(rows)
    return json.dumps(doc, indent=1) + "\n"


def _plots(doc: dict, path) -> None:
    from ggspec.bench.plots import write_plots

    try:
        for png in write_plots(doc, path):
            err.print(f"plot: {png}", soft_wrap=True)
    except OSError as exc:
        err.print(f"[yellow]warning:[/] no plots next to {path}: {exc.strerror or exc}", soft_wrap=True)


def _say_interrupted(session, path, saved: bool) -> None:
    if saved:
        where = f"; continue with --resume {path}"
    elif path is not None:
        where = f" (nothing new measured: {path} is unchanged)" if path.exists() else " (nothing measured yet)"
    else:
        where = " (nothing saved: use --save FILE)"
    err.print(f"interrupted: {sum(1 for c in session.configs if c not in session.todo())} of "
              f"{len(session.configs)} configurations complete{where}", soft_wrap=True)
