"""A progress bar for long simulation phases (``rich`` when importable, else a plain
``\\r``-rewritten line on stderr), shown only once a phase has run a while; when stderr
is not a terminal (a pipe, a log), a whole line every few seconds instead."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["PLAIN_EVERY_S", "PROGRESS_AFTER_S", "ProgressReporter", "rich_console"]

#: Runs shorter than this show no progress bar.
PROGRESS_AFTER_S = 2.0
#: Not a terminal: one progress line this often (seconds).
PLAIN_EVERY_S = 5.0


class ProgressReporter:
    """A progress bar that appears only once a phase has run ``PROGRESS_AFTER_S``
    seconds: ``rich`` when importable, else a ``\\r``-rewritten line on stderr.

    Call it as ``reporter(done, total)``; :meth:`phase` starts a new labelled phase;
    :meth:`close` clears it.
    """

    def __init__(self, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.label = ""
        self.t0 = time.monotonic()
        self._rich: Any = None
        self._task: Any = None
        self._last_plain = 0.0
        self._last_done = -1
        self._plain_shown = False
        #: a terminal gets a bar; a pipe or a file gets a line every few seconds
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def phase(self, label: str) -> None:
        self.close()
        self.label = label
        self.t0 = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or time.monotonic() - self.t0 < PROGRESS_AFTER_S:
            return
        if not self._tty:
            self._line(done, total)
            return
        if self._rich is None and self._task is None:
            try:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TimeElapsedColumn,
                )
            except ImportError:
                self._task = False
            else:
                self._rich = Progress(
                    "[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), transient=True,
                    console=rich_console(self.stream),
                )
                self._rich.start()
                self._task = self._rich.add_task(self.label, total=total)
        if self._rich is not None:
            self._rich.update(self._task, completed=done, total=total)
            return
        now = time.monotonic()
        if now - self._last_plain >= 0.5 or done >= total:
            self._last_plain = now
            pct = 100.0 * done / total if total else 100.0
            self.stream.write(f"\r{self.label}: {done}/{total} ({pct:.0f}%)   ")
            self.stream.flush()
            self._plain_shown = True

    def _line(self, done: int, total: int) -> None:
        """Not a terminal: a whole line every :data:`PLAIN_EVERY_S` seconds (and the
        last), which a pipe or a log shows as it comes."""
        now = time.monotonic()
        if now - self._last_plain < PLAIN_EVERY_S and done < total:
            return
        if done >= total and self._last_done == done:
            return
        self._last_plain = now
        self._last_done = done
        pct = 100.0 * done / total if total else 100.0
        elapsed = now - self.t0
        self.stream.write(f"{self.label}: {done:,}/{total:,} ({pct:.0f}%), {elapsed:.0f} s\n")
        self.stream.flush()

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif self._plain_shown:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()
        self._rich = None
        self._task = None
        self._plain_shown = False


def rich_console(stream: TextIO) -> Any:
    from rich.console import Console

    # Not a terminal (a pipe, a file): rich would wrap at 80 columns; lines here are wider.
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(file=stream) if tty else Console(file=stream, width=110)


