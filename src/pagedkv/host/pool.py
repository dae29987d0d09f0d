"""The host block pool: a second, larger pool of blocks in CPU memory, keyed by
``(block hash, group)`` with its own LRU.

State per key (an entry): its host block id, whether it is *ready* (its store completed:
loadable and evictable) and its *pin* count (loads in flight reading it). Host block ids
are ``0 .. num_blocks - 1`` (no null block), the lowest free one handed out first. A block
id is either free or owned by exactly one entry.

* ``reserve`` gives a new (not ready) entry a block, evicting the least recently used
  ready, unpinned entry when no block is free; it never evicts an entry that is not ready
  or pinned, and reports what it evicted.
* ``commit`` makes an entry ready (most recently used); ``rollback`` drops a not-ready
  entry and frees its block.
* ``pin``/``unpin`` protect a ready entry from eviction (its LRU position is kept, so a
  pin that is undone leaves the order unchanged).

>>> pool = HostBlockPool(2)
>>> a, b, c = (b"a", 0), (b"b", 0), (b"c", 0)
>>> pool.reserve(a), pool.reserve(b)
((0, None), (1, None))
>>> pool.commit(a); pool.commit(b); pool.pin(a)
>>> pool.reserve(c)             # a is pinned: b, the oldest evictable, goes
(1, ((b'b', 0), None))
>>> pool.check_invariants()
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from pagedkv.errors import InvalidArgumentError
from pagedkv.host.plans import HostKey, LookupState

__all__ = ["HostBlockPool", "HostEntry"]


class HostEntry:
    """One key's host block. ``meta``: what a CPU ``BlockStored`` event needs (``None``
    when events are off)."""

    __slots__ = ("block_id", "meta", "pins", "ready")

    def __init__(self, block_id: int, meta: Any) -> None:
        self.block_id = block_id
        self.ready = False
        self.pins = 0
        self.meta = meta


class HostBlockPool:
    """``num_blocks`` host blocks, an index by key, and an LRU of ready entries.

    Complexity: every call is O(1) per key, except eviction, which skips pinned entries at
    the LRU front (O(pinned) at worst).
    """

    def __init__(self, num_blocks: int) -> None:
        if type(num_blocks) is not int or num_blocks < 1:
            raise InvalidArgumentError(
                f"the host tier needs an int >= 1 of blocks, got {num_blocks!r}; size it "
                "with pagedkv.host.host_blocks_for_bytes"
            )
        self.num_blocks = num_blocks
        # Free ids as a min-heap: the lowest free id is handed out first.
        self._free: list[int] = list(range(num_blocks))
        self.entries: dict[HostKey, HostEntry] = {}
        #: Ready entries, least recently used first (pinned ones stay in place).
        self.lru: OrderedDict[HostKey, None] = OrderedDict()
        self.num_evicted_blocks = 0

    # ------------------------------------------------------------------ queries

    @property
    def num_free(self) -> int:
        """Host blocks owned by no entry."""
        return len(self._free)

    @property
    def num_ready(self) -> int:
        return len(self.lru)

    def state(self, key: HostKey) -> LookupState:
        """MISS, HIT (ready) or HIT_PENDING (its store has not completed). O(1)."""
        e = self.entries.get(key)
        if e is None:
            return LookupState.MISS
        return LookupState.HIT if e.ready else LookupState.HIT_PENDING

    # ------------------------------------------------------------------ changes

    def reserve(self, key: HostKey, meta: Any = None) -> tuple[int, tuple[HostKey, Any] | None]:
        """A not-ready entry for ``key`` (absent) with a block; returns ``(block id,
        (evicted key, its meta) or None)``, or ``(-1, None)`` when every block is owned by
        a pinned or not-ready entry (nothing changed)."""
        assert key not in self.entries, f"host key {key!r} reserved twice"
        evicted: tuple[HostKey, Any] | None = None
        if self._free:
            b = heapq.heappop(self._free)
        else:
            victim = self._oldest_evictable()
            if victim is None:
                return -1, None
            old = self.entries.pop(victim)
            del self.lru[victim]
            self.num_evicted_blocks += 1
            b = old.block_id
            evicted = (victim, old.meta)
        self.entries[key] = HostEntry(b, meta)
        return b, evicted

    def _oldest_evictable(self) -> HostKey | None:
        entries = self.entries
        for key in self.lru:
            if not entries[key].pins:
                return key
        return None

    def commit(self, key: HostKey) -> None:
        """The store of ``key`` completed: it is ready and most recently used."""
        e = self.entries[key]
        assert not e.ready, f"host key {key!r} committed twice"
        e.ready = True
        self.lru[key] = None

    def rollback(self, key: HostKey) -> None:
        """The store of ``key`` failed: drop the entry, free its block."""
        e = self.entries.pop(key)
        assert not e.ready and not e.pins, f"host key {key!r} rolled back while ready"
        heapq.heappush(self._free, e.block_id)

    def pin(self, key: HostKey) -> None:
        """A load reads ``key``: it cannot be evicted until unpinned."""
        e = self.entries[key]
        assert e.ready, f"host key {key!r} pinned before its store completed"
        e.pins += 1

    def unpin(self, key: HostKey) -> None:
        e = self.entries[key]
        assert e.pins > 0, f"host key {key!r} unpinned more often than pinned"
        e.pins -= 1

    def touch(self, keys: Iterable[HostKey]) -> None:
        """Mark ready keys most recently used, in the given order (the last is the most
        recent); others are ignored."""
        lru = self.lru
        for key in keys:
            if key in lru:
                lru.move_to_end(key)

    def drop_unpinned(self) -> list[tuple[HostKey, Any]]:
        """Drop every ready, unpinned entry (a cache reset); returns them, oldest first."""
        gone = [(k, self.entries[k].meta) for k in self.lru if not self.entries[k].pins]
        for k, _ in gone:
            e = self.entries.pop(k)
            del self.lru[k]
            heapq.heappush(self._free, e.block_id)
        return gone

    # ------------------------------------------------------------------ checks

    def debug_state(self) -> dict[str, Any]:
        """A copy of all state, for tests and bug reports. O(num_blocks)."""
        return {
            "free": sorted(self._free),
            "entries": {k: (e.block_id, e.ready, e.pins) for k, e in self.entries.items()},
            "lru": list(self.lru),
        }

    def check_invariants(self) -> None:
        """Every block id free or owned by one entry; the LRU holds exactly the ready
        entries; pins only on ready entries. O(num_blocks)."""
        owned = [e.block_id for e in self.entries.values()]
        free = self._free
        assert all(free[(i - 1) // 2] <= free[i] for i in range(1, len(free))), (
            "the free host ids are not a heap")
        assert len(set(free)) == len(free), "a host block is free twice"
        assert len(set(owned)) == len(owned), "a host block is owned by two entries"
        assert not set(free) & set(owned), "a host block is both free and owned"
        assert len(free) + len(owned) == self.num_blocks, "host blocks lost or invented"
        assert all(0 <= b < self.num_blocks for b in owned + free), "host block id out of range"
        ready = {k for k, e in self.entries.items() if e.ready}
        assert ready == set(self.lru), "the host LRU and the ready entries differ"
        for k, e in self.entries.items():
            assert e.pins >= 0, f"host key {k!r} has {e.pins} pins"
            assert e.ready or not e.pins, f"host key {k!r} is pinned but not ready"
