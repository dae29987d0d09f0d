"""A strict PyYAML loader for input files (imported only when PyYAML is present).

It is ``yaml.SafeLoader`` plus three refusals, each a ``yaml.YAMLError`` carrying the
line: a key written twice in one mapping, an anchor or alias (a few bytes of aliases
expand to gigabytes), and nesting deeper than the limit given.
"""

from __future__ import annotations

import contextlib
from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]

__all__ = ["strict_loader"]


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc, unused-ignore]
    _depth = 0
    max_nesting = 64

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not accepted in input files; "
                "write the value out", event.start_mark)
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "anchors (&name) are not accepted in input files",
                event.start_mark)
        self._depth += 1
        try:
            if self._depth > self.max_nesting:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {self.max_nesting} levels deep; flatten it",
                    event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                duplicate = False
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} written twice in one mapping; keep one",
                    key_node.start_mark)
            with contextlib.suppress(TypeError):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def strict_loader(max_nesting: int) -> type[Any]:
    """The strict loader class refusing nesting deeper than ``max_nesting``, for
    ``yaml.load(text, Loader=strict_loader(64))``."""
    return type("StrictLoader", (_StrictLoader,), {"max_nesting": max_nesting})
