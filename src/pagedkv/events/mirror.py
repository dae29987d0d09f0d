"""The mirror of many publishers' prefix indexes, rebuilt from their KV-cache events.

:class:`MirrorIndex` is the state: per publisher, which ``(hash, group, medium)`` blocks
are cached and how many copies; it answers "how many leading blocks of this prompt does
each publisher cache". It has no I/O: :class:`pagedkv.events.transport.Subscriber` feeds
it from ZeroMQ, and anything with the same three methods (:class:`MirrorSink`) can take
its place (the cluster index does).

Dependency-free (block hashes are turned into wire hashes with
:func:`pagedkv.events.wire.wire_hash`, which needs no extra).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from pagedkv.core.records import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.wire import wire_hash

__all__ = ["BlockKey", "MirrorIndex", "MirrorSink", "index_counts"]

BlockKey = tuple[int, int, "str | None"]
"""``(wire hash as u64, group_idx, medium)`` of one cached block."""


class MirrorSink(Protocol):
    """What a subscriber calls to mirror one publisher's events (in stream order)."""

    def add_publisher(self, publisher_id: str) -> None: ...
    def reset(self, publisher_id: str) -> None: ...
    def apply(self, publisher_id: str, events: Iterable[KVCacheEvent]) -> None: ...


def index_counts(stored: Iterable[BlockStored]) -> dict[BlockKey, int]:
    """Block key -> number of copies, as a :class:`MirrorIndex` holds them.

    Use it to compare a publisher's ``prefix_index_snapshot()`` with
    :meth:`MirrorIndex.blocks`. O(total blocks).
    """
    counts: dict[BlockKey, int] = {}
    for record in stored:
        for block_hash in record.block_hashes:
            key = (wire_hash(block_hash), record.group_idx, record.medium)
            counts[key] = counts.get(key, 0) + 1
    return counts


class MirrorIndex:
    """The prefix indexes of many publishers, rebuilt from their events.

    A block stored twice (two requests filled identical blocks) is counted twice and
    stays cached until removed twice. A removal of a block the mirror does not hold is
    ignored and counted in :attr:`num_unmatched_removals` (it happens after joining a
    stream without a snapshot).
    """

    __slots__ = ("_by_publisher", "_holders", "num_unmatched_removals")

    def __init__(self) -> None:
        # publisher -> block key -> copies
        self._by_publisher: dict[str, dict[BlockKey, int]] = {}
        # (hash, group) -> publisher -> copies over all media; drives prefix queries
        self._holders: dict[tuple[int, int], dict[str, int]] = {}
        self.num_unmatched_removals = 0

    @property
    def publisher_ids(self) -> list[str]:
        return sorted(self._by_publisher)

    def add_publisher(self, publisher_id: str) -> None:
        """Make ``publisher_id`` known (with nothing cached) if it is not. O(1)."""
        self._by_publisher.setdefault(publisher_id, {})

    def remove_publisher(self, publisher_id: str) -> None:
        """Forget a publisher and its blocks. O(its blocks)."""
        self.reset(publisher_id)
        self._by_publisher.pop(publisher_id, None)

    def reset(self, publisher_id: str) -> None:
        """Forget every block of one publisher (it stays known). O(its blocks)."""
        blocks = self._by_publisher.get(publisher_id)
        if not blocks:
            self.add_publisher(publisher_id)
            return
        holders_of = self._holders
        for block_hash, group_idx, _ in blocks:
            holders = holders_of.get((block_hash, group_idx))
            if holders is not None and holders.pop(publisher_id, None) is not None and not holders:
                del holders_of[(block_hash, group_idx)]
        blocks.clear()

    def apply(self, publisher_id: str, events: Iterable[KVCacheEvent]) -> None:
        """Apply one publisher's events in order. O(blocks named in ``events``)."""
        blocks = self._by_publisher.setdefault(publisher_id, {})
        holders_of = self._holders
        for event in events:
            if isinstance(event, (BlockStored, BlockRemoved)):
                group_idx = event.group_idx
                medium = event.medium
                stored = type(event) is BlockStored
                for raw_hash in event.block_hashes:
                    block_hash = wire_hash(raw_hash)
                    key = (block_hash, group_idx, medium)
                    copies = blocks.get(key, 0)
                    if not stored and copies == 0:
                        self.num_unmatched_removals += 1
                        continue
                    delta = 1 if stored else -1
                    if copies + delta:
                        blocks[key] = copies + delta
                    else:
                        del blocks[key]
                    holders = holders_of.setdefault((block_hash, group_idx), {})
                    held = holders.get(publisher_id, 0) + delta
                    if held:
                        holders[publisher_id] = held
                    else:
                        del holders[publisher_id]
                        if not holders:
                            del holders_of[(block_hash, group_idx)]
            elif isinstance(event, AllBlocksCleared):
                self.reset(publisher_id)
            else:
                raise InvalidArgumentError(f"not a KV-cache event record: {event!r}")

    def blocks(self, publisher_id: str) -> dict[BlockKey, int]:
        """A copy of one publisher's block key -> copies (empty if unknown). O(its blocks)."""
        return dict(self._by_publisher.get(publisher_id, {}))

    def num_blocks(self, publisher_id: str) -> int:
        """Cached blocks of one publisher, copies counted. O(its distinct blocks)."""
        return sum(self._by_publisher.get(publisher_id, {}).values())

    def longest_prefix(
        self, block_hashes: Sequence[int], *, group_idx: int = 0, medium: str | None = None
    ) -> dict[str, int]:
        """Per known publisher, how many leading ``block_hashes`` it caches.

        ``block_hashes`` are wire hashes (u64 ints) of a prompt's full blocks, first block
        first; a publisher's count stops at its first miss. ``medium=None`` accepts a
        block on any medium. Does not modify the mirror.
        Cost: O(sum over positions of the publishers still matching there).

        Example: publisher "a" caches h1, h2 and "b" caches h1, h3:
        ``longest_prefix([h1, h2, h3])`` is ``{"a": 2, "b": 1}``.
        """
        result = dict.fromkeys(self._by_publisher, 0)
        alive: Iterable[str] = result.keys()
        by_publisher = self._by_publisher
        for position, block_hash in enumerate(block_hashes, start=1):
            holders = self._holders.get((block_hash, group_idx))
            if not holders:
                break
            if medium is None:
                matching = [p for p in alive if p in holders]
            else:
                key = (block_hash, group_idx, medium)
                matching = [p for p in alive if p in holders and key in by_publisher[p]]
            if not matching:
                break
            for publisher_id in matching:
                result[publisher_id] = position
            alive = matching
        return result

    def check_invariants(self) -> None:
        """Assert that the per-publisher tables and the holder table agree. O(size)."""
        rebuilt: dict[tuple[int, int], dict[str, int]] = {}
        for publisher_id, blocks in self._by_publisher.items():
            for (block_hash, group_idx, _medium), copies in blocks.items():
                assert copies > 0, (publisher_id, block_hash, copies)
                holders = rebuilt.setdefault((block_hash, group_idx), {})
                holders[publisher_id] = holders.get(publisher_id, 0) + copies
        assert rebuilt == self._holders, "holder table out of step with publisher tables"
