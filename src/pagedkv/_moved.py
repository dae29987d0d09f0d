"""Old module paths, kept for one release: ``import pagedkv.pool`` still works and gives
the module that now lives at ``pagedkv.core.pool`` (the same object), with a
``DeprecationWarning`` naming the new path.

>>> import warnings
>>> with warnings.catch_warnings():
...     warnings.simplefilter("ignore")
...     import pagedkv.pool
>>> import pagedkv.core.pool
>>> pagedkv.pool is pagedkv.core.pool
True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

_CORE = ("cached_tokens", "cbor", "config", "coordinator", "coordinator_base",
         "coordinator_hybrid", "coordinator_simple", "free_queue", "hashing",
         "hashing_lookahead", "manager", "metrics", "partial_hits", "pool", "request",
         "specs", "validation", "managers")

#: Old module path -> new one (a package moves with its submodules).
MOVED: dict[str, str] = {
    **{f"pagedkv.{m}": f"pagedkv.core.{m}" for m in _CORE},
    "pagedkv.events.recorder": "pagedkv.core.recorder",
    "pagedkv.events.records": "pagedkv.core.records",
    "pagedkv.observe.manager": "pagedkv.observe.observer",
    "pagedkv.observe.sim_cli": "pagedkv.sim.observe_cli",
    "pagedkv.observe.sim_observe": "pagedkv.sim.observe_engine",
    "pagedkv.observe.sim_support": "pagedkv.sim.observe_support",
    "pagedkv.observe.index_metrics": "pagedkv.cluster.index_metrics",
    "pagedkv.retention.replay": "pagedkv.sim.retention_replay",
    "pagedkv.retention.sim_support": "pagedkv.sim.retention_support",
}


def _new_name(fullname: str) -> str | None:
    if fullname in MOVED:
        return MOVED[fullname]
    if not fullname.startswith("pagedkv."):
        return None
    head = fullname.rpartition(".")[0]
    while head:
        if head in MOVED:
            return f"{MOVED[head]}.{fullname[len(head) + 1:]}"
        head = head.rpartition(".")[0]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at its new path."""

    def __init__(self) -> None:
        self._real_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = _new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=False)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _new_name(spec.name)
        assert new is not None
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path "
                      "goes in the next release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._real_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new path's, already executed: only its own spec is put
        back (the import system set the old path's)."""
        name = module.__spec__.name if module.__spec__ is not None else ""
        module.__spec__ = self._real_specs.pop(name, module.__spec__)


def install() -> None:
    """Serve the old paths (idempotent)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())  # before the path finder: no second copy
