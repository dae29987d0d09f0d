"""Size limits: every module of ``src/pagedkv`` at most 450 lines, every function at most
80 lines of code.

A module counts all its lines. A function counts the lines from its ``def`` to its last
line, except its docstring and lines that are blank or hold only a comment (a nested
function counts in its parent too). What is over would be listed in ``ALLOWED`` with the
reason (nothing is today); a new offender fails :func:`test_no_new_offender`, and an entry
that is no longer over fails :func:`test_allowlist_is_current` (drop it from the list).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80

#: Offenders that stay for now, each with why. Keys: a module's path under src/pagedkv,
#: or "path:function" for a function (its name; nested names are not qualified).
ALLOWED: dict[str, str] = {}


def code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """Lines of ``node`` that hold code: its docstring, blank lines and comment-only lines
    left out."""
    skip: set[int] = set()
    doc = ast.get_docstring(node, clean=False)
    if doc is not None and node.body and isinstance(node.body[0], ast.Expr):
        first = node.body[0]
        skip = set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    n = 0
    for i in range(node.lineno, (node.end_lineno or node.lineno) + 1):
        if i in skip:
            continue
        text = lines[i - 1].strip()
        if text and not text.startswith("#"):
            n += 1
    return n


def offenders_in(source: str, name: str) -> dict[str, int]:
    """``{key: size}`` of what in ``source`` (the module ``name``) is over a limit."""
    lines = source.splitlines()
    out: dict[str, int] = {}
    if len(lines) > MAX_MODULE_LINES:
        out[name] = len(lines)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = code_lines(node, lines)
            if n > MAX_FUNCTION_LINES:
                out[f"{name}:{node.name}"] = n
    return out


def all_offenders() -> dict[str, int]:
    root = SRC / "pagedkv"
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        out.update(offenders_in(path.read_text(), path.relative_to(root).as_posix()))
    return out


OFFENDERS = all_offenders()


def test_no_new_offender() -> None:
    new = {k: v for k, v in OFFENDERS.items() if k not in ALLOWED}
    assert not new, (
        f"over the limits ({MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} lines "
        f"of code a function): {new}; split by responsibility"
    )


def test_allowlist_is_current() -> None:
    stale = sorted(k for k in ALLOWED if k not in OFFENDERS)
    assert not stale, f"no longer over the limits, drop from ALLOWED: {stale}"


def test_the_count_can_fail() -> None:
    """The counter sees a long function and a long module, and skips docstrings, blank
    and comment lines."""
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    padding = '    """doc\n\n    more doc\n    """\n\n    # a comment\n'
    at_limit = f"def f():\n{padding}{body}"  # the def line + 79: exactly the limit
    assert offenders_in(at_limit, "m.py") == {}
    over = f"{at_limit}    y = 1\n"
    assert offenders_in(over, "m.py") == {"m.py:f": MAX_FUNCTION_LINES + 1}
    module = "x = 1\n" * (MAX_MODULE_LINES + 1)
    assert offenders_in(module, "big.py") == {"big.py": MAX_MODULE_LINES + 1}
