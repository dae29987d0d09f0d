"""A progress bar for long simulation phases (``rich`` when importable, else a plain
``\\r``-rewritten line on stderr), shown only once a phase has run a while; when stderr
is not a terminal (a pipe, a log), a whole line every few seconds instead, with the time
so far and an estimate of the time left::

    replaying 1500 requests: 538/1,500 (36%), 25 s, ETA 45 s

``PAGEDKV_PROGRESS_AFTER_S`` and ``PAGEDKV_PROGRESS_EVERY_S`` (seconds) override
:data:`PROGRESS_AFTER_S` and :data:`PLAIN_EVERY_S` (a test sees lines at once with 0).
Output for a terminal is wrapped at the terminal's width; for a pipe or a file it is not
wrapped at all (:func:`rich_console`), so no figure is split across lines."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, TextIO

__all__ = ["PLAIN_EVERY_S", "PROGRESS_AFTER_S", "ProgressReporter", "is_terminal",
           "line_every_s", "rich_console"]

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
        self._tty = is_terminal(self.stream)
        self._after_s = _seconds_from_env("PAGEDKV_PROGRESS_AFTER_S", PROGRESS_AFTER_S)
        self._every_s = line_every_s()

    def phase(self, label: str) -> None:
        self.close()
        self.label = label
        self.t0 = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or time.monotonic() - self.t0 < self._after_s:
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
        last), which a pipe or a log shows as it comes: done, share, time so far and the
        time left at the rate so far."""
        now = time.monotonic()
        if now - self._last_plain < self._every_s and done < total:
            return
        if done >= total and self._last_done == done:
            return
        self._last_plain = now
        self._last_done = done
        pct = 100.0 * done / total if total else 100.0
        elapsed = now - self.t0
        eta = "" if not 0 < done < total else \
            f", ETA {elapsed / done * (total - done):.0f} s"
        self.stream.write(
            f"{self.label}: {done:,}/{total:,} ({pct:.0f}%), {elapsed:.0f} s{eta}\n")
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


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (not a pipe, a file or a buffer)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def line_every_s() -> float:
    """Seconds between progress lines when not on a terminal (:data:`PLAIN_EVERY_S`, or
    ``PAGEDKV_PROGRESS_EVERY_S``)."""
    return _seconds_from_env("PAGEDKV_PROGRESS_EVERY_S", PLAIN_EVERY_S)


def _seconds_from_env(name: str, default: float) -> float:
    text = os.environ.get(name)
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


#: Not a terminal: the width rich lays out in, wide enough that no line is wrapped.
_UNWRAPPED_WIDTH = 100_000


def rich_console(stream: TextIO) -> Any:
    """A ``rich`` console on ``stream``: wrapped at the terminal's width on a terminal,
    never wrapped on a pipe or a file (tables as wide as their content)."""
    from rich.console import Console

    if is_terminal(stream):
        return Console(file=stream)
    return Console(file=stream, width=_UNWRAPPED_WIDTH, soft_wrap=True)


