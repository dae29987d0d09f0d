"""Field checks shared by every configuration object: one rule per kind of value.

Each function returns the value when it is acceptable and otherwise raises the error class
it is given (:class:`~pagedkv.errors.InvalidArgumentError` by default) with a message that
names the field, the accepted range and the value received. The rules:

* a **whole number** is an ``int`` (``bool`` is refused: ``True`` is not 1 block), within
  ``[minimum, maximum]``; ``maximum`` defaults to :data:`MAX_INT` (int64), so a huge value
  is refused before it reaches a socket option, a sleep or an allocation;
* a **number** is an ``int`` or ``float`` (not ``bool``), finite (NaN and infinities are
  refused), within the given bounds (each inclusive unless ``*_exclusive``);
* a **flag** is ``True`` or ``False`` (not ``0``/``1``, not ``None``);
* a **text** is a ``str`` (``bytes`` are refused) without NUL characters;
* a **clock** is a callable (it is called later, for seconds).

Strings, ``bytes``, lists, dicts and arbitrary objects never pass a numeric check.

>>> check_number("rate_scale", 2.0, minimum=0, minimum_exclusive=True)
2.0
>>> check_number("rate_scale", float("nan"), minimum=0, minimum_exclusive=True)
Traceback (most recent call last):
...
pagedkv.errors.InvalidArgumentError: rate_scale must be a finite number > 0, got nan
>>> check_whole("num_blocks", True, minimum=2)
Traceback (most recent call last):
...
pagedkv.errors.InvalidArgumentError: num_blocks must be a whole number >= 2, got True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pagedkv.errors import InvalidArgumentError, PagedKVError

__all__ = ["MAX_INT", "check_clock", "check_fits_memory", "check_flag", "check_number",
           "check_text", "check_whole", "describe_range", "physical_memory_bytes"]

#: Largest whole number any field accepts (int64): beyond it C APIs overflow.
MAX_INT = 2**63 - 1

ErrorClass = type[PagedKVError]


def describe_range(
    minimum: float | None,
    maximum: float | None,
    *,
    minimum_exclusive: bool = False,
    maximum_exclusive: bool = False,
) -> str:
    """``">= 0"``, ``"in (0, 1]"``... for messages.

    >>> describe_range(0, 1, minimum_exclusive=True)
    'in (0, 1]'
    """
    def fmt(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    lo = "(" if minimum_exclusive else "["
    hi = ")" if maximum_exclusive else "]"
    if minimum is not None and maximum is not None:
        return f"in {lo}{fmt(minimum)}, {fmt(maximum)}{hi}"
    if minimum is not None:
        return f"{'>' if minimum_exclusive else '>='} {fmt(minimum)}"
    if maximum is not None:
        return f"{'<' if maximum_exclusive else '<='} {fmt(maximum)}"
    return "any"


def _in_range(value: float, minimum: float | None, maximum: float | None,
              minimum_exclusive: bool, maximum_exclusive: bool) -> bool:
    if minimum is not None and (value < minimum or (minimum_exclusive and value == minimum)):
        return False
    return not (maximum is not None
                and (value > maximum or (maximum_exclusive and value == maximum)))


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_whole(
    name: str,
    value: object,
    *,
    minimum: int | None = 0,
    maximum: int | None = MAX_INT,
    error: ErrorClass = InvalidArgumentError,
    hint: str = "",
) -> int:
    """``value`` if it is an ``int`` (not ``bool``) in ``[minimum, maximum]``."""
    if type(value) is not int or not _in_range(value, minimum, maximum, False, False):
        rng = describe_range(minimum, None if maximum == MAX_INT else maximum)
        rng = "" if rng == "any" else " " + rng
        raise error(f"{name} must be a whole number{rng}, got {_shown(value)}{hint}")
    return value


def check_number(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    minimum_exclusive: bool = False,
    maximum_exclusive: bool = False,
    error: ErrorClass = InvalidArgumentError,
    hint: str = "",
) -> float:
    """``value`` if it is a finite ``int`` or ``float`` (not ``bool``) within the bounds."""
    ok = (type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]
          and _in_range(value, minimum, maximum,  # type: ignore[arg-type]
                        minimum_exclusive, maximum_exclusive))
    if not ok:
        rng = describe_range(minimum, maximum, minimum_exclusive=minimum_exclusive,
                             maximum_exclusive=maximum_exclusive)
        rng = "" if rng == "any" else " " + rng
        raise error(f"{name} must be a finite number{rng}, got {_shown(value)}{hint}")
    return value  # type: ignore[return-value]


def check_flag(name: str, value: object, *, error: ErrorClass = InvalidArgumentError) -> bool:
    """``value`` if it is ``True`` or ``False``."""
    if type(value) is not bool:
        raise error(f"{name} must be True or False, got {_shown(value)}")
    return value


def check_text(name: str, value: object, *, allow_empty: bool = True,
               error: ErrorClass = InvalidArgumentError) -> str:
    """``value`` if it is a ``str`` (not ``bytes``) without NUL characters and valid
    Unicode (no lone UTF-16 surrogate: such text cannot be encoded or sent)."""
    if type(value) is not str or "\x00" in value or (not allow_empty and not value):
        what = "a string" if allow_empty else "a non-empty string"
        raise error(f"{name} must be {what} without NUL characters, got {_shown(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{name} holds a lone UTF-16 surrogate (U+{ord(value[exc.start]):04X} at "
                    f"character {exc.start}); give valid Unicode text") from None
    return value


def physical_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the system does not say."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_memory(what: str, count: int, bytes_each: int, hint: str,
                      *, error: ErrorClass = InvalidArgumentError) -> None:
    """Refuse ``count`` items of ``bytes_each`` host bytes when they pass this machine's
    physical memory (a huge count would fail later with MemoryError, or swap)."""
    total = physical_memory_bytes()
    need = count * bytes_each
    if total is not None and need > total:
        raise error(
            f"{what}={count:,} needs about {need / 2**30:,.0f} GiB of host memory "
            f"({bytes_each} bytes each), but this machine has {total / 2**30:,.0f} GiB; "
            f"{hint}")


def check_clock(name: str, value: object, *,
                error: ErrorClass = InvalidArgumentError) -> Callable[[], Any]:
    """``value`` if it is callable (a clock returning seconds, e.g. ``time.monotonic``)."""
    if not callable(value):
        raise error(f"{name} must be a callable returning seconds (e.g. time.monotonic), "
                    f"got {_shown(value)}")
    return value
