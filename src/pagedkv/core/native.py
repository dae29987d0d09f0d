"""Which core runs: the compiled one (``pagedkv.core._ccore``, a C extension built by
``pip install`` where a C compiler exists) or the pure-Python reference.

The compiled core replaces per-block loops only (the kernels, :mod:`pagedkv.core.kernels`,
which picks the set an object runs; and the steady-state allocation,
:mod:`pagedkv.core.fast_paths`); every public call, every check and every error stays in
Python, so both cores return the same values and raise the same errors.
Objects pick their core when they are built: ``PAGEDKV_PURE=1`` in the environment (read at
import) forces the pure core, and :func:`forced_pure` builds pure objects in a process that
has the compiled one (tests drive the two side by side).

>>> CORE in ("compiled", "pure")
True
>>> with forced_pure():
...     active() is None
True
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

__all__ = ["CORE", "IMPORT_ERROR", "active", "forced_pure", "module"]

#: Why the compiled core is not in use (``None`` when it is).
IMPORT_ERROR: str | None = None
_module: ModuleType | None = None

if os.environ.get("PAGEDKV_PURE", "") not in ("", "0"):
    IMPORT_ERROR = "PAGEDKV_PURE is set"
else:
    try:
        from pagedkv.core import _ccore as _module
    except ImportError as exc:  # not built (no C compiler at install time) or stale
        IMPORT_ERROR = f"not built ({exc})"

#: ``"compiled"`` or ``"pure"``: the core new objects get by default.
CORE: str = "pure" if _module is None else "compiled"
_pure_depth = 0


def module() -> ModuleType | None:
    """The compiled extension when it is available (even inside :func:`forced_pure`)."""
    return _module


def active() -> ModuleType | None:
    """The compiled extension for an object being built now, ``None`` for the pure core."""
    return None if _pure_depth else _module


@contextmanager
def forced_pure() -> Iterator[None]:
    """Objects built inside use the pure core (nests; not for concurrent use)."""
    global _pure_depth
    _pure_depth += 1
    try:
        yield
    finally:
        _pure_depth -= 1
