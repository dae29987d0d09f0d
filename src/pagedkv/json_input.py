"""Structured documents (JSON, YAML, TOML) parsed from input text, refused as
:class:`~pagedkv.errors.InputFileError` whatever is wrong with them: malformed, a key
written twice in one object, nested deeper than :data:`MAX_NESTING` levels, or an integer
longer than :data:`MAX_INT_DIGITS` digits. Every error names the source, the line where
it is known, and the key.

``NaN`` and ``Infinity`` are read (Python's ``json`` writes them, and real model configs
hold them, e.g. ``"time_step_limit": [0.0, Infinity]``); a field that needs a finite
number refuses them itself.

>>> parse_json('{"a": [1, 2], "b": Infinity}', "c.json")
{'a': [1, 2], 'b': inf}
>>> parse_json('{"a": 1,\\n "a": 2}', "c.json")
Traceback (most recent call last):
...
pagedkv.errors.InputFileError: c.json:2: key 'a' written twice in one object; keep one
>>> parse_json("[" * 100_000, "t.jsonl", line=3)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pagedkv.errors.InputFileError: t.jsonl:3: not valid JSON (nested more than 64 levels deep...)
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from pagedkv.errors import InputFileError, MissingDependencyError

__all__ = ["MAX_INT_DIGITS", "MAX_NESTING", "check_tree", "parse_json", "parse_toml",
           "parse_yaml"]

#: Deepest nesting of lists/objects any input document may have.
MAX_NESTING = 64
#: Most decimal digits an integer in an input document may have.
MAX_INT_DIGITS = 100
_INT_BOUND = 10**MAX_INT_DIGITS
_TOO_LONG = f"an integer too long to read (the limit is {MAX_INT_DIGITS} digits)"


class _Refused(ValueError):
    """A document-level problem found while parsing (``key``: the key concerned)."""

    def __init__(self, problem: str, key: str | None = None) -> None:
        super().__init__(problem)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"key {key!r} written twice in one object; keep one", key)
        out[key] = value
    return out


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-+"))
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {digits} digits (the limit is {MAX_INT_DIGITS})")
    return int(text)


def check_tree(data: Any, fmt: str = "data") -> None:
    """Refuse ``data`` nested more than :data:`MAX_NESTING` deep or holding an integer
    of more than :data:`MAX_INT_DIGITS` digits (iteratively: no recursion to exhaust).

    Raises:
        ValueError: (internal ``_Refused``) naming the problem and the key.
    """
    stack: list[tuple[Any, int, str | None]] = [(data, 0, None)]
    while stack:
        node, depth, key = stack.pop()
        if isinstance(node, dict):
            items: list[tuple[str | None, Any]] = [(str(k), v) for k, v in node.items()]
        elif isinstance(node, list):
            items = [(key, v) for v in node]
        else:
            if isinstance(node, int) and not isinstance(node, bool) and abs(node) >= _INT_BOUND:
                raise _Refused(f"an integer of more than {MAX_INT_DIGITS} digits", key)
            continue
        if depth >= MAX_NESTING:
            raise _Refused(f"nested more than {MAX_NESTING} levels deep; flatten it", key)
        stack.extend((v, depth + 1, k) for k, v in items)


def _line_of_key(text: str, key: str | None) -> int | None:
    """The line of the last occurrence of ``key`` written as a key (1-based), if found."""
    if key is None:
        return None
    for quoted in (json.dumps(key), repr(key), key):
        at = text.rfind(quoted)
        if at >= 0:
            return text.count("\n", 0, at) + 1
    return None


def _refuse(source: str, fmt: str, exc: _Refused, text: str, line: int | None) -> InputFileError:
    where = line if line is not None else _line_of_key(text, exc.key)
    problem = str(exc)
    if exc.key is not None and repr(exc.key) not in problem:
        problem += f" (at key {exc.key!r})"
    if not problem.startswith("key "):
        problem = f"not valid {fmt} ({problem})"
    return InputFileError(source, problem, line=where)


def parse_json(text: str, source: str, *, line: int | None = None, hint: str = "") -> Any:
    """The JSON document ``text`` read from ``source`` (``line``: of a JSON-lines file).

    Raises:
        InputFileError: naming ``source`` (and the line) and the problem, with ``hint``
            appended for a syntax error.
    """
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_parse_int)
        check_tree(data)
        return data
    except json.JSONDecodeError as exc:
        where = "" if line is not None else f" at line {exc.lineno}"
        raise InputFileError(source, f"not valid JSON ({exc.msg}{where}){hint}",
                             line=line if line is not None else exc.lineno) from None
    except RecursionError:
        refused = _Refused(f"nested more than {MAX_NESTING} levels deep; flatten it")
    except _Refused as exc:
        refused = exc
    except ValueError:  # defensive: an int() the hook did not see
        refused = _Refused(_TOO_LONG)
    raise _refuse(source, "JSON", refused, text, line)


def parse_toml(text: str, source: str) -> Any:
    """The TOML document ``text`` (TOML itself refuses a key written twice).

    Raises:
        InputFileError: malformed, too deep, too long an integer.
        MissingDependencyError: Python 3.10 without ``tomli``.
    """
    toml: Any
    try:
        toml = importlib.import_module("tomllib")
    except ModuleNotFoundError:  # Python 3.10
        try:
            toml = importlib.import_module("tomli")
        except ModuleNotFoundError:
            raise MissingDependencyError("TOML files on Python 3.10 need tomli: "
                                         "pip install tomli (or write JSON)") from None
    try:
        data = toml.loads(text)
        check_tree(data)
        return data
    except toml.TOMLDecodeError as exc:
        lineno = getattr(exc, "lineno", None)
        raise InputFileError(source, f"not valid TOML ({exc})", line=lineno) from None
    except RecursionError:
        refused = _Refused(f"nested more than {MAX_NESTING} levels deep; flatten it")
    except _Refused as exc:
        refused = exc
    except ValueError:  # an integer past Python's digit limit
        refused = _Refused(_TOO_LONG)
    raise _refuse(source, "TOML", refused, text, None)


def parse_yaml(text: str, source: str) -> Any:
    """The YAML document ``text`` read safely: no anchors/aliases (a few bytes of them
    expand to gigabytes), no key written twice, bounded nesting and integers.

    Raises:
        InputFileError: malformed or refused, naming the line and key.
        MissingDependencyError: PyYAML not installed.
    """
    try:
        import yaml  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        from pagedkv.doctor import install_command

        raise MissingDependencyError(f"{source}: reading YAML needs PyYAML: "
                                     f"{install_command('yaml')} (or write the file as JSON)"
                                     ) from None
    from pagedkv.yaml_loader import strict_loader

    try:
        data = yaml.load(text, Loader=strict_loader(MAX_NESTING))
        check_tree(data)
        return data
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = mark.line + 1 if mark is not None else None
        raise InputFileError(source, f"not valid YAML ({getattr(exc, 'problem', exc)})",
                             line=where) from None
    except RecursionError:
        refused = _Refused(f"nested more than {MAX_NESTING} levels deep; flatten it")
    except _Refused as exc:
        refused = exc
    except ValueError:  # an integer past Python's digit limit
        refused = _Refused(_TOO_LONG)
    raise _refuse(source, "YAML", refused, text, None)
