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
    """Several groups: the longest hit valid for all of them, found as a fixed point.

    Lengths are kept multiples of ``lcm_block_size`` (the least common multiple of the
    group block sizes) so every group's hit ends on one of its own block boundaries.

    1. Full-attention groups (MLA and sinks included) go first. Their hit is downward
       closed (any shorter block-aligned prefix of a hit is a hit), so each is looked up
       once and later only truncated. The candidate length ``C`` becomes the shortest of
       their hits, rounded down to the lcm.
    2. Every other group is asked for its hit within ``C``; a shorter answer lowers ``C``
       (rounded down to the lcm) and the pass repeats until one pass changes nothing.
       ``C`` only decreases, so this ends. Windowed hits are not downward closed (a
       sliding-window hit of 80 tokens says nothing about 64), which is why they are asked
       again rather than truncated.

    Worked case: full attention (block 32) + sliding window 32 (block 16), hashes at 16,
    lcm 32, a 129-token prompt whose first 128 tokens are cached except sliding-window
    blocks 5 and 6 (tokens 80..111): full attention hits 128; sliding window within 128
    scans blocks 7, 6 (miss), 5 (miss), 4, 3 -> run ``b3 b4``, 80 tokens; C = 64; full
    attention truncates to 2 blocks; sliding window within 64 -> ``[0, 0, b2, b3]``, 64;
    stable: 4 x 16 tokens, not 5 x 16.

    Speculative decoding (``drop_last_hit``): each manager's rule already drops its last
    hit block (its answer is at most its bound minus one block), so a group is asked
    within ``min(C + block_size, max_length)``: it looks one block past ``C`` and drops
    it, landing at ``C`` when the block after ``C`` matched. Asking within ``C`` instead
    would drop one block per pass and shrink every hit to 0.

    A group that can never hit (Mamba without checkpoints, cross attention) makes every
    lookup miss, without any lookup.
    """

    def __init__(self, managers: Sequence[SingleTypeManager]) -> None:
        super().__init__(managers)
        self.lcm_block_size = lcm_block_size([m.spec for m in self.managers])
        self._full = [i for i, m in enumerate(self.managers)
                      if isinstance(m, FullAttentionManager)]
        self._others = [i for i, m in enumerate(self.managers)
                        if not isinstance(m, FullAttentionManager)]
        self._never_hits = any(not m.cacheable for m in self.managers)
        self._drop = [m.drop_last_hit for m in self.managers]

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[tuple[list[int], ...], int]:
        """Per-group hit blocks and the common hit length (class docstring). Does not
        modify any state. Cost: one scan per full-attention group, plus one scan per other
        group and pass; passes are few (each one lowers the length by at least the lcm)."""
        managers = self.managers
        if self._never_hits:
            return tuple([] for _ in managers), 0
        lcm = self.lcm_block_size
        drop = self._drop
        length = max_length // lcm * lcm
        hits: list[list[int]] = [[] for _ in managers]

        def ask(i: int, length: int) -> int:
            """Group i's hit within ``length`` (one block more under drop_last_hit, since
            the group drops it again); returns the new common length."""
            m = managers[i]
            bound = min(length + m.block_size, max_length) if drop[i] else length
            hits[i] = m.find_longest_cache_hit(block_hashes, bound)
            got = len(hits[i]) * m.block_size
            return got // lcm * lcm if got < length else length

        for i in self._full:
            length = ask(i, length)
        changed = True
        while changed and length:
            changed = False
            for i in self._others:
                shorter = ask(i, length)
                changed = changed or shorter != length
                length = shorter
        if not length:
            return tuple([] for _ in managers), 0
        for i in self._full:
            m = managers[i]
            del hits[i][length // m.block_size :]
        for i in self._others:
            assert len(hits[i]) * managers[i].block_size == length, "hybrid hit not stable"
        return tuple(hits), length
