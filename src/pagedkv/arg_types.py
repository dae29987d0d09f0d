"""The value types every option and configuration field shares: ports, endpoints,
durations, counts, probabilities and text. Each ``check_*`` takes a Python value (a config
field) and raises the caller's documented error class; :func:`harden_parser` gives every
argparse option of every subcommand the same rules, so an option added later is covered
without anyone writing a check.

>>> check_port("serve(port)", 8080)
8080
>>> check_port("serve(port)", True)
Traceback (most recent call last):
...
pagedkv.errors.InvalidArgumentError: serve(port) must be a whole number in [1, 65535], got True
>>> check_endpoint("endpoint", "tcp://127.0.0.1:99999")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pagedkv.errors.InvalidArgumentError: endpoint 'tcp://127.0.0.1:99999': the port must be ...
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
import types
import typing
from collections.abc import Callable
from typing import Any

from pagedkv.checks import ErrorClass, check_number, check_text, check_whole
from pagedkv.errors import InvalidArgumentError

__all__ = ["MAX_COUNT", "MAX_SECONDS", "check_endpoint", "check_fields", "check_port",
           "check_probability", "check_seconds", "harden_parser", "is_guarded", "text_problem"]

#: The longest duration any option or field accepts: about 31 years.
MAX_SECONDS = 1e9
#: The largest count (a signed 64-bit integer).
MAX_COUNT = 2**63 - 1
_SCHEMES = ("tcp://", "ipc://", "inproc://")


def text_problem(text: str) -> str | None:
    """What makes ``text`` unusable as text (a NUL, a byte that was not UTF-8 on the
    command line, a lone UTF-16 surrogate), or None."""
    if "\x00" in text:
        return "holds a NUL character"
    for i, ch in enumerate(text):
        if "\udc80" <= ch <= "\udcff":
            return f"holds the byte 0x{ord(ch) - 0xDC00:02x}, not UTF-8, at character {i}"
        if "\ud800" <= ch <= "\udfff":
            return f"holds a lone UTF-16 surrogate U+{ord(ch):04X} at character {i}"
    return None


def check_port(name: str, value: object, *, allow_zero: bool = False,
               error: ErrorClass = InvalidArgumentError) -> int:
    """``value`` if it is an ``int`` (not ``bool``) port in [1, 65535] ([0, ...] with
    ``allow_zero``: any free port)."""
    return check_whole(name, value, minimum=0 if allow_zero else 1, maximum=65535,
                       error=error)


def check_seconds(name: str, value: object, *, allow_zero: bool = False,
                  error: ErrorClass = InvalidArgumentError) -> float:
    """``value`` if it is a finite number of seconds, > 0 (>= 0 with ``allow_zero``), at
    most :data:`MAX_SECONDS`."""
    return check_number(name, value, minimum=0, minimum_exclusive=not allow_zero,
                        maximum=MAX_SECONDS, error=error)


def check_probability(name: str, value: object, *,
                      error: ErrorClass = InvalidArgumentError) -> float:
    """``value`` if it is a finite number in [0, 1]."""
    return check_number(name, value, minimum=0, maximum=1, error=error)


def check_endpoint(name: str, value: object, *, error: ErrorClass = InvalidArgumentError
                   ) -> str:
    """``value`` if it is a ZeroMQ endpoint: ``tcp://HOST:PORT`` (PORT 1-65535 or ``*``),
    ``ipc://PATH`` or ``inproc://NAME``. Whether it may bind beyond loopback is the
    caller's rule (``allow_remote``)."""
    text = check_text(name, value, allow_empty=False, error=error)
    problem = text_problem(text)
    if problem is None and not text.startswith(_SCHEMES):
        problem = "write tcp://HOST:PORT, ipc://PATH or inproc://NAME"
    if problem is None and text.startswith("tcp://"):
        host, sep, port = text[len("tcp://"):].rpartition(":")
        if not sep or not host:
            problem = "write tcp://HOST:PORT"
        elif port != "*" and not (port.isascii() and port.isdigit()
                                  and 1 <= int(port[:6]) <= 65535):
            problem = "the port must be 1 to 65535 (or *)"
        elif host.startswith("[") != host.endswith("]"):
            problem = "an IPv6 address is written in brackets: tcp://[::1]:PORT"
        elif host.startswith("["):
            try:
                ipaddress.IPv6Address(host[1:-1])
            except ValueError:
                problem = f"{host} is not an IPv6 address"
    if problem is not None:
        raise error(f"{name} {text!r}: {problem}")
    return text


# ---------------------------------------------------------------- argparse, every option

_GUARD = "__pagedkv_guarded__"


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _whole(text: str) -> int:
    if len(text) > 30:
        raise ValueError(text)
    value = int(text)
    if abs(value) > MAX_COUNT:
        raise ValueError(text)
    return value


def _guarded(flag: str, inner: Callable[[str], Any] | None) -> Callable[[str], Any]:
    """``inner`` behind the checks every option's text passes first: valid Unicode, not
    too long; ``int``/``float`` replaced by bounded, finite versions."""
    base: Callable[[str], Any] = str
    if inner is int:
        base = _whole
    elif inner is float:
        base = _finite
    elif inner is not None:
        base = inner

    def parse(text: str) -> Any:
        problem = text_problem(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{problem}; give valid UTF-8 text")
        if len(text) > 1_000_000:
            raise argparse.ArgumentTypeError("longer than 1,000,000 characters")
        try:
            value = base(text)
        except OverflowError:
            raise argparse.ArgumentTypeError(f"{text!r:.40} is out of range") from None
        except ValueError as exc:
            if isinstance(exc, argparse.ArgumentTypeError):
                raise
            what = ("a whole number (at most 2**63 - 1)" if base is _whole
                    else "a finite number" if base is _finite else None)
            if what is None:
                raise
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        _check_result(text, value)
        return value

    parse.__name__ = getattr(inner, "__name__", flag)
    setattr(parse, _GUARD, True)
    return parse


def _check_result(text: str, value: Any) -> None:
    """Refuse what any option's own type let through: a number beyond 64 bits or not
    finite."""
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r:.40}")
    if isinstance(value, (int, float)) and abs(value) > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r:.40} is beyond 2**63 - 1")


def is_guarded(action: argparse.Action) -> bool:
    """Whether ``action``'s values pass the shared checks (flags take no value)."""
    return action.nargs == 0 or getattr(action.type, _GUARD, False)


def harden_parser(parser: argparse.ArgumentParser) -> None:
    """Put every option and positional of ``parser`` and its subcommands behind the shared
    text and number checks (idempotent)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                harden_parser(sub)
        elif action.nargs != 0 and not getattr(action.type, _GUARD, False) \
                and (action.type is None or callable(action.type)):
            flag = action.option_strings[0] if action.option_strings else action.dest
            action.type = _guarded(flag, action.type)


# ---------------------------------------------------------- config objects, every field

_HINTS: dict[type, dict[str, Any]] = {}


def _conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotated type ``hint`` (shallow; bool is not a number;
    an int is a float)."""
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_conforms(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin is not None:
        return not isinstance(origin, type) or isinstance(value, origin)
    if hint is float:
        return type(value) in (int, float)
    if hint is int:
        return type(value) is int
    if hint is bool:
        return type(value) is bool
    try:
        return not isinstance(hint, type) or isinstance(value, hint)
    except TypeError:  # a protocol that cannot be checked at run time: not judged
        return True


def _field_problem(name: str, value: Any, hint: Any) -> str | None:
    if not _conforms(value, hint):
        return f"must be {getattr(hint, '__name__', str(hint))}, got {value!r:.60}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if abs(value) > MAX_COUNT:
            return f"must be at most 2**63 - 1 in size, got {value!r:.40}"
        if name.endswith("_s") and abs(value) > MAX_SECONDS:
            return f"must be at most {MAX_SECONDS:.0e} seconds, got {value!r}"
    if isinstance(value, str):
        problem = text_problem(value)
        if problem is not None:
            return problem
    return None


def check_fields(obj: Any, *, error: ErrorClass = InvalidArgumentError) -> None:
    """Check every field of the dataclass instance ``obj`` against its annotation: of that
    type (bool is not a number), numbers finite and within 64 bits, durations (``*_s``)
    at most :data:`MAX_SECONDS`, text valid Unicode. Range rules stay the class's own.

    Raises:
        error: naming ``Class.field``, the rule, and the value.
    """
    cls = type(obj)
    hints = _HINTS.get(cls)
    if hints is None:
        try:
            hints = typing.get_type_hints(cls)
        except NameError:  # an annotation imported for type checking only: not judged
            hints = {}
        _HINTS[cls] = hints
    for field in dataclasses.fields(obj):
        problem = _field_problem(field.name, getattr(obj, field.name),
                                 hints.get(field.name, Any))
        if problem is not None:
            raise error(f"{cls.__name__}.{field.name} {problem}")
