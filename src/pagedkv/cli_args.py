"""Argument types shared by every ``pagedkv`` subcommand's numeric options, and the exit
code of every command (:func:`exit_code`). Memory sizes and GPU names are
:mod:`pagedkv.planner.args` (the planner's units and GPU table).

argparse's ``type=float`` accepts ``nan``, ``inf`` and ``1e999``; these types refuse them
as usage errors (exit 2, one line: argparse names the flag, the type says what it
accepts), with the same range rules as the
configuration fields (:mod:`pagedkv.checks`).

>>> seconds = number_arg("--request-timeout", minimum=0, minimum_exclusive=True)
>>> seconds("0.5")
0.5
>>> seconds("nan")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: must be a finite number > 0, got 'nan'
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from pagedkv.checks import describe_range
from pagedkv.errors import InvalidArgumentError

__all__ = ["MAX_SECONDS", "exit_code", "number_arg",
           "seconds_arg", "whole_arg"]

#: The longest duration any option accepts: about 31 years (beyond it, sleeps overflow).
MAX_SECONDS = 1e9


def number_arg(
    flag: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    minimum_exclusive: bool = False,
    maximum_exclusive: bool = False,
) -> Callable[[str], float]:
    """An argparse ``type`` for a finite decimal number within the bounds (``flag`` names
    the option in the parser's ``invalid ... value`` fallback)."""
    rng = describe_range(minimum, maximum, minimum_exclusive=minimum_exclusive,
                         maximum_exclusive=maximum_exclusive)
    what = "a finite number" + ("" if rng == "any" else " " + rng)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        bad = (not math.isfinite(value)
               or (minimum is not None and (value < minimum
                                            or (minimum_exclusive and value == minimum)))
               or (maximum is not None and (value > maximum
                                            or (maximum_exclusive and value == maximum))))
        if bad:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = f"{flag} number"
    return parse


def seconds_arg(flag: str, *, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a duration in seconds: finite, > 0 (>= 0 with
    ``allow_zero``), at most :data:`MAX_SECONDS`."""
    return number_arg(flag, minimum=0, minimum_exclusive=not allow_zero, maximum=MAX_SECONDS)


def whole_arg(flag: str, *, minimum: int | None = 0,
              maximum: int | None = 2**63 - 1) -> Callable[[str], int]:
    """An argparse ``type`` for a whole number in ``[minimum, maximum]`` (decimal)."""
    rng = describe_range(minimum, None if maximum == 2**63 - 1 else maximum)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or (minimum is not None and value < minimum) or (
                maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be a whole number {rng}, got {text!r}")
        return value

    parse.__name__ = f"{flag} whole number"
    return parse


def exit_code(exc: BaseException) -> int:
    """The exit code of every ``pagedkv`` command for an expected failure: 2 for a
    caller's mistake (:class:`~pagedkv.errors.InvalidArgumentError`: a value out of range,
    options that contradict, an unknown name), 1 for a run that cannot be done or failed
    (any other :class:`~pagedkv.errors.PagedKVError`, a file that cannot be read).

    >>> exit_code(InvalidArgumentError("--tp must be >= 1")), exit_code(OSError("disk"))
    (2, 1)
    """
    return 2 if isinstance(exc, InvalidArgumentError) else 1
