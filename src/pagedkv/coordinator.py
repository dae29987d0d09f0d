"""Coordinators: how the groups of one model agree on a prefix-cache hit.

* :class:`NoPrefixCacheCoordinator` — caching off: every lookup misses.
* :class:`UnitaryCoordinator` — one group: that group's longest hit.
* :class:`HybridCoordinator` — several groups: a hit must be valid for *every* group.
  Full-attention groups go first (their hit is a plain prefix); every other group then
  verifies and possibly shortens it; this repeats until the length stops changing (a fixed
  point). Lengths are kept multiples of the least common multiple of the block sizes so
  every group's hit ends on one of its block boundaries.

A coordinator only decides lookups; it never changes state.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.managers.base import SingleTypeManager
from pagedkv.managers.full import FullAttentionManager
from pagedkv.specs import lcm_block_size

__all__ = ["Coordinator", "HybridCoordinator", "NoPrefixCacheCoordinator", "UnitaryCoordinator"]


class Coordinator:
    """Finds the longest prefix-cache hit across a model's groups (no state change)."""

    def __init__(self, managers: Sequence[SingleTypeManager]) -> None:
        self.managers = list(managers)
        self._empty: tuple[list[int], ...] = tuple([] for _ in self.managers)

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[tuple[list[int], ...], int]:
        """Per-group hit block ids and the hit length in tokens (``<= max_length``)."""
        raise NotImplementedError


class NoPrefixCacheCoordinator(Coordinator):
    """Caching off: always a miss."""

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[tuple[list[int], ...], int]:
        return tuple([] for _ in self.managers), 0


class UnitaryCoordinator(Coordinator):
    """One group: its own longest hit."""

    def __init__(self, managers: Sequence[SingleTypeManager]) -> None:
        super().__init__(managers)
        assert len(self.managers) == 1
        self._manager = self.managers[0]

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[tuple[list[int], ...], int]:
        m = self._manager
        blocks = m.find_longest_cache_hit(block_hashes, max_length)
        return (blocks,), len(blocks) * m.block_size


class HybridCoordinator(Coordinator):
    """Several groups: the longest hit valid for all of them, found as a fixed point."""

    def __init__(self, managers: Sequence[SingleTypeManager]) -> None:
        super().__init__(managers)
        # Full attention first: its hit is a plain prefix, the best starting bound.
        self._order = sorted(
            range(len(self.managers)),
            key=lambda i: not isinstance(self.managers[i], FullAttentionManager),
        )
        self.lcm_block_size = lcm_block_size([m.spec for m in self.managers])

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[tuple[list[int], ...], int]:
        lcm = self.lcm_block_size
        length = max_length // lcm * lcm
        hits: list[list[int]] = [[] for _ in self.managers]
        while True:
            changed = False
            for i in self._order:
                m = self.managers[i]
                blocks = m.find_longest_cache_hit(block_hashes, length)
                hits[i] = blocks
                got = len(blocks) * m.block_size
                if got < length:
                    length = got // lcm * lcm
                    changed = True
            if not changed:
                break
        out = tuple(
            hits[i][: length // m.block_size] for i, m in enumerate(self.managers)
        )
        return out, length
