"""Durations as ``simulate``'s SLO flags take them (``--ttft-p99 2s``, ``500ms``)."""

from __future__ import annotations

import math

from pagedkv.errors import InvalidArgumentError

__all__ = ["parse_seconds"]


def parse_seconds(text: str, flag: str = "--ttft-p99") -> float:
    """Seconds in ``text``: ``2s``, ``500ms``, ``2`` (seconds).

    Raises:
        InvalidArgumentError: not a positive duration.
    """
    t = text.strip().lower()
    scale = 1.0
    if t.endswith("ms"):
        t, scale = t[:-2], 1e-3
    elif t.endswith("s"):
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise InvalidArgumentError(f"{flag} {text!r} is not a positive duration; write "
                                   "e.g. 2s or 500ms")
    return value
