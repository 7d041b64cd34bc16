"""Standard streams for the command line: a closed, full or vanished stdout is one clear error.

`ggspec run | head`, `ggspec bench > /dev/full` or `ggspec run >&-` must not end in a traceback
from whichever write hit the problem, nor in "Exception ignored" at exit; and a closed descriptor
must not be reused by a file opened later (llama.cpp prints to fd 1).
"""

from __future__ import annotations

import os
import sys

from ggspec.errors import GGSpecError


class StdoutError(GGSpecError):
    """Standard output is closed, full or gone: what was to be printed cannot be."""

    def __init__(self, message: str, broken_pipe: bool = False) -> None:
        super().__init__(message)
        self.broken_pipe = broken_pipe


class GuardedStdout:
    """sys.stdout as the commands see it: a failing write (`>&-`, `> /dev/full`, a closed pipe)
    raises StdoutError once, at the write that failed, instead of a traceback from wherever it
    happened or an "Exception ignored" at exit. After a failure the descriptor points at
    /dev/null, so the interpreter's last flush has somewhere to go."""

    def __init__(self, stream, closed: bool = False) -> None:
        self._stream = stream
        self.closed_at_start = closed
        self.failed: StdoutError | None = None

    def _fail(self, exc: OSError | None) -> None:
        if self.failed is None:
            if exc is None:
                self.failed = StdoutError("standard output is closed: nowhere to write the results")
            else:
                self.failed = StdoutError(f"cannot write to standard output ({exc.strerror or exc})",
                                          broken_pipe=isinstance(exc, BrokenPipeError))
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self._stream.fileno())
                os.close(devnull)
            except (OSError, ValueError, AttributeError):
                pass
        raise self.failed

    def write(self, text: str) -> int:
        if self.closed_at_start or self.failed is not None:
            self._fail(None)
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._fail(exc)
            raise  # not reached

    def flush(self) -> None:
        if self.failed is not None or self.closed_at_start:
            try:
                self._stream.flush()  # into /dev/null by now
            except (OSError, ValueError):
                pass
            return
        try:
            self._stream.flush()
        except OSError as exc:
            self._fail(exc)

    def isatty(self) -> bool:
        return not self.closed_at_start and self._stream.isatty()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def guard_std_streams(err_console=None) -> None:
    """Give closed standard descriptors a /dev/null (a file opened later must not become fd 1,
    where llama.cpp prints), and route stdout through GuardedStdout."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    for fd in closed:  # lowest free descriptor first: each open lands on the closed one
        got = os.open(os.devnull, os.O_RDWR)
        if got != fd:
            os.dup2(got, fd)
            os.close(got)
    if 2 in closed or sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
        if err_console is not None:
            err_console.file = sys.stderr
    stdout_closed = 1 in closed or sys.stdout is None
    if stdout_closed:
        sys.stdout = open(1, "w", closefd=False)
    if not isinstance(sys.stdout, GuardedStdout):
        sys.stdout = GuardedStdout(sys.stdout, closed=stdout_closed)


def stdout_closed() -> bool:
    return isinstance(sys.stdout, GuardedStdout) and sys.stdout.closed_at_start
