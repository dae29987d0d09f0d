"""JSON read from input files, refused as :class:`~pagedkv.errors.InputFileError` whatever
is wrong with it: malformed, nested deeper than Python's parser recurses (a
``RecursionError`` otherwise), ``NaN``/``Infinity`` (not JSON, though Python's parser
accepts them), or an integer literal too long to convert.

>>> parse_json('{"a": [1, 2]}', "c.json")
{'a': [1, 2]}
>>> parse_json('{"a": NaN}', "c.json")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pagedkv.errors.InputFileError: c.json: not valid JSON (NaN is not a JSON number; ...)
>>> parse_json("[" * 100_000, "t.jsonl", line=3)
Traceback (most recent call last):
...
pagedkv.errors.InputFileError: t.jsonl:3: not valid JSON (nested too deeply)
"""

from __future__ import annotations

import json
from typing import Any

from pagedkv.errors import InputFileError

__all__ = ["parse_json"]


class _NotJson(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON number; write a number or null")


def parse_json(text: str, source: str, *, line: int | None = None, hint: str = "") -> Any:
    """The JSON document ``text`` read from ``source`` (``line``: of a JSON-lines file).

    Raises:
        InputFileError: naming ``source`` (and ``line``) and the problem, with ``hint``
            appended for a syntax error.
    """
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        where = "" if line is not None else f" at line {exc.lineno}"
        problem = f"{exc.msg}{where}"
        raise InputFileError(source, f"not valid JSON ({problem}){hint}",
                             line=line if line is not None else exc.lineno) from None
    except RecursionError:
        problem = "nested too deeply"
    except _NotJson as exc:
        problem = str(exc)
    except ValueError as exc:  # e.g. an integer literal past int_max_str_digits
        problem = " ".join(str(exc).split())
    raise InputFileError(source, f"not valid JSON ({problem})", line=line)
