"""The bounded reader is the only way into the package: no module outside
``pagedkv.input_files`` / ``pagedkv.json_input`` / ``pagedkv.yaml_loader`` opens a file for
reading, reads a path's text or bytes, or parses JSON, YAML or TOML itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "pagedkv"
READERS = {"input_files.py", "json_input.py", "yaml_loader.py"}
#: Attribute calls that read or parse: ``x.read_text()``, ``json.loads()``, ...
_READ_ATTRS = {"read_text", "read_bytes", "load", "loads", "safe_load", "full_load",
               "unsafe_load", "load_all", "safe_load_all"}
_PARSER_MODULES = {"json", "yaml", "tomllib", "tomli", "pickle", "marshal", "gzip", "bz2",
                   "lzma"}


def _mode(call: ast.Call, position: int) -> str:
    """The literal mode of an ``open``-like call ("r" when left out, "?" when computed)."""
    node = call.args[position] if len(call.args) > position else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    if node is None:
        return "r"
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "?"


def _writes(mode: str) -> bool:
    return mode != "?" and any(c in mode for c in "wax") and "+" not in mode


def offences(tree: ast.AST) -> list[str]:
    """Each read-by-other-means in ``tree``, as ``line: what``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id == "open" and not _writes(_mode(node, 1)):
            found.append(f"{node.lineno}: open() for reading")
        elif isinstance(fn, ast.Attribute):
            owner = fn.value.id if isinstance(fn.value, ast.Name) else None
            modules = ("os", "io", "gzip", "bz2", "lzma", "codecs")
            position = 1 if owner in modules else 0
            if fn.attr in ("open", "fdopen") and not _is_self_call(fn) \
                    and not _writes(_mode(node, position)):
                found.append(f"{node.lineno}: .{fn.attr}() for reading")
            elif fn.attr in ("read_text", "read_bytes"):
                found.append(f"{node.lineno}: .{fn.attr}()")
            elif fn.attr in _READ_ATTRS and owner in _PARSER_MODULES:
                found.append(f"{node.lineno}: {owner}.{fn.attr}()")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in _PARSER_MODULES:
            names = {a.name for a in node.names}
            if names & (_READ_ATTRS | {"open"}):
                found.append(f"{node.lineno}: from {node.module} import {sorted(names)}")
    return found


#: Objects whose ``open()`` is the project's own method, not a file's.
_OWN_OPEN = {"self", "ray_backend"}


def _is_self_call(fn: ast.Attribute) -> bool:
    """``self.open()`` / ``ray_backend.open()``: a method of the project's own."""
    return isinstance(fn.value, ast.Name) and fn.value.id in _OWN_OPEN


MODULES = sorted(p for p in SRC.rglob("*.py") if p.name not in READERS or p.parent != SRC)


def test_the_scan_covers_the_package() -> None:
    assert len(MODULES) > 100


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_module_reads_only_through_the_bounded_reader(path: Path) -> None:
    bad = offences(ast.parse(path.read_text(encoding="utf-8")))
    assert not bad, (f"{path.relative_to(SRC)} reads a file or parses a document itself "
                     f"({'; '.join(bad)}); use pagedkv.input_files instead")


@pytest.mark.parametrize("source", [
    "open(p)", "open(p, 'rb')", "p.open()", "p.read_text()", "p.read_bytes()",
    "json.loads(t)", "json.load(f)", "yaml.safe_load(t)", "tomllib.loads(t)",
    "gzip.open(p)", "os.fdopen(fd)", "from json import loads",
])
def test_the_check_sees_each_way_of_reading(source: str) -> None:
    assert offences(ast.parse(source)), source


@pytest.mark.parametrize("source", ["open(p, 'w')", "p.open('w')", "os.fdopen(fd, 'w')",
                                    "self.open()", "json.dumps(x)"])
def test_writing_is_not_an_offence(source: str) -> None:
    assert not offences(ast.parse(source)), source
