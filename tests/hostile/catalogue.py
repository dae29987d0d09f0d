"""The hostile values the generic attack tests feed every option and field, and the
checks on what a parser or constructor may accept."""

from __future__ import annotations

import math
import typing
from typing import Any

#: Command-line text: what a hostile user can type (non-UTF-8 bytes arrive in argv as
#: lone surrogates, ``\udcff`` for the byte 0xff, under Python's surrogateescape).
CLI_VALUES: tuple[str, ...] = (
    "nan", "NaN", "inf", "-inf", "1e999", "-1", "0", "-0", "1.5", "1e300",
    "9" * 5000, "18446744073709551616", "True", "x", "", " ", "\udcff", "\ud800",
    "a\x00b", "0x10", "1_000",
)

#: Python values for configuration fields.
API_VALUES: tuple[Any, ...] = (
    math.nan, math.inf, -math.inf, -1, 0, -0.5, 1e300, 2**64, 2**200,
    True, False, "x", "", "\ud800", b"\xff", bytearray(b"ab"), None, [], {}, (), 1.5,
    object(),
)

MAX_MAGNITUDE = 2**63 - 1
MAX_SECONDS = 1e9


def insane(value: Any) -> str | None:
    """Why an accepted value is unusable (non-finite, out of 64-bit range, text that
    cannot be encoded), looking inside lists/tuples/dicts; None when fine."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return f"non-finite {v!r}"
        if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > MAX_MAGNITUDE:
            return f"{v!r:.40} beyond 2**63 - 1"
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return f"text {v!r} that is not valid Unicode"
            if "\x00" in v:
                return "text with a NUL"
        if isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
    return None


def _conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotated type ``hint`` (shallow, bool is not int)."""
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_conforms(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin is not None:
        try:
            return isinstance(value, origin)
        except TypeError:
            return True
    if hint is float:
        return type(value) in (int, float)
    if hint is int:
        return type(value) is int
    if isinstance(hint, type):
        try:
            return isinstance(value, hint)
        except TypeError:  # a protocol not checkable at run time
            return True
    return True  # a callable, a TypeVar, a protocol: not judged here


def field_problem(name: str, value: Any, hint: Any) -> str | None:
    """Why accepting ``value`` for field ``name`` (annotated ``hint``) is wrong, or None."""
    if not _conforms(value, hint):
        return f"accepted {type(value).__name__} {value!r:.40} for a {hint} field"
    why = insane(value)
    if why is not None:
        return f"accepted {why}"
    if name.endswith("_s") and isinstance(value, (int, float)) and not isinstance(value, bool) \
            and abs(value) > MAX_SECONDS:
        return f"accepted a duration of {value!r} s (more than 1e9 s)"
    return None
