"""The dependency rule: a module imports only from its own layer or below.

The layers, bottom to top (``docs/architecture.md`` draws them):

==========  ===============================================================
0 base      ``pagedkv.errors``, and the input checks every layer shares:
            ``pagedkv.checks`` (field checks), ``pagedkv.cli_args`` (option types),
            ``pagedkv.json_input`` (the JSON reader)
1 core      ``pagedkv.core`` — the exact engine (knows no feature), and ``pagedkv``
            itself, the public surface, which re-exports the core
2 features  ``pagedkv.events``, ``pagedkv.planner``, ``pagedkv.retention``,
            ``pagedkv.host``, ``pagedkv.observe``
3 apps      ``pagedkv.sim``, ``pagedkv.cluster``, ``pagedkv.torch``, ``pagedkv.vllm``,
            ``pagedkv.bench``, ``pagedkv.sweep``
4 shell     ``pagedkv.cli``, ``pagedkv.__main__``
==========  ===============================================================

Every import counts: module level, inside functions and under ``TYPE_CHECKING``. Within
a layer imports may go either way, but no two modules may import each other through any
chain (no circles), and a few apps never import a sibling (:data:`FORBIDDEN`): what runs
in production (``pagedkv.cluster``: index, ingest, router, service) knows nothing of the
simulator; the multi-replica simulation lives in ``pagedkv.sim.replicas`` and imports the
cluster's router, never the other way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

LAYERS: dict[str, int] = {
    "pagedkv.errors": 0,
    "pagedkv.checks": 0,
    "pagedkv.doctor": 0,  # install hints for every message (its report reads the core lazily)
    "pagedkv.cli_args": 0,
    "pagedkv.json_input": 0,
    "pagedkv.yaml_loader": 0,
    "pagedkv.input_files": 0,
    "pagedkv.arg_types": 0,
    "pagedkv._moved": 1,
    "pagedkv.core": 1,
    "pagedkv.events": 2,
    "pagedkv.planner": 2,
    "pagedkv.retention": 2,
    "pagedkv.host": 2,
    "pagedkv.observe": 2,
    "pagedkv.sim": 3,
    "pagedkv.cluster": 3,
    "pagedkv.torch": 3,
    "pagedkv.vllm": 3,
    "pagedkv.bench": 3,
    "pagedkv.sweep": 3,
    "pagedkv.cli": 4,
    "pagedkv.__main__": 4,
}
#: Same-layer packages that must not import each other: importer -> forbidden targets.
FORBIDDEN: dict[str, tuple[str, ...]] = {"pagedkv.cluster": ("pagedkv.sim",)}
#: The package itself (its ``__init__``): the public surface, at the core's layer.
ROOT_LAYER = 1


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "pagedkv").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    """The layer of ``module``: that of its longest listed prefix."""
    if module == "pagedkv":
        return ROOT_LAYER
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        layer = LAYERS.get(".".join(parts[:n]))
        if layer is not None:
            return layer
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def imports_of(module: str) -> set[str]:
    """The pagedkv modules ``module`` imports (any import statement anywhere in it)."""
    path = MODULES[module]
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_pkg]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target
                     for a in node.names]
        else:
            continue
        found.update(n for n in names if n in MODULES and n != module)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_upward_import(module: str) -> None:
    mine = layer_of(module)
    upward = sorted(t for t in GRAPH[module] if layer_of(t) > mine)
    assert not upward, f"{module} (layer {mine}) imports from above: {upward}"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_forbidden_sibling_import(module: str) -> None:
    for importer, targets in FORBIDDEN.items():
        if _within(module, importer):
            bad = sorted(t for t in GRAPH[module] if any(_within(t, p) for p in targets))
            assert not bad, f"{module} imports {bad}: {importer} must not import {targets}"


def test_the_sibling_rule_can_fail() -> None:
    """The multi-replica simulation imports the cluster's router; the rule sees the
    edge when it points the forbidden way."""
    assert "pagedkv.cluster.router" in GRAPH["pagedkv.sim.replicas.driver"]
    saved = GRAPH["pagedkv.cluster.router"]
    try:
        GRAPH["pagedkv.cluster.router"] = {*saved, "pagedkv.sim.engine"}
        with pytest.raises(AssertionError, match="must not import"):
            test_no_forbidden_sibling_import("pagedkv.cluster.router")
    finally:
        GRAPH["pagedkv.cluster.router"] = saved


def _find_cycle() -> list[str] | None:
    """One import circle, or None (iterative DFS over GRAPH)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    for start in sorted(GRAPH):
        if start in state:
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(GRAPH[start]))]
        state[start] = 1
        while stack:
            node, todo = stack[-1]
            if not todo:
                state[node] = 2
                stack.pop()
                continue
            nxt = todo.pop()
            if state.get(nxt) == 1:
                path = [n for n, _ in stack]
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                state[nxt] = 1
                stack.append((nxt, sorted(GRAPH[nxt])))
    return None


def test_no_import_circles() -> None:
    cycle = _find_cycle()
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_rule_can_fail() -> None:
    """The checker sees an upward import and a circle when they exist."""
    assert layer_of("pagedkv.core.pool") == 1 and layer_of("pagedkv.sim.engine") == 3
    assert "pagedkv.core.pool" in GRAPH["pagedkv.core.managers.base"]
    fake = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    saved = dict(GRAPH)
    try:
        GRAPH.clear()
        GRAPH.update(fake)
        assert _find_cycle() == ["a", "b", "c", "a"]
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_old_module_paths_are_the_moved_modules() -> None:
    """For one release the old paths import the moved modules (same objects), warning."""
    import importlib
    import warnings

    from pagedkv._moved import MOVED

    for old, new in MOVED.items():
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert module.__spec__ is not None and module.__spec__.name == new
    with pytest.warns(DeprecationWarning, match="pagedkv.core.managers.full"):
        import pagedkv.managers.full  # noqa: F401
