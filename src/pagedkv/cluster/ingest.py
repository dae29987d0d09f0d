"""Ingest: turn each publisher's event stream into presence changes in a cluster index.

:class:`IndexIngest` is a :class:`pagedkv.events.mirror.MirrorSink`, so the ZeroMQ
subscriber (:class:`pagedkv.events.transport.Subscriber`) drives it with its gap repair
unchanged. Per publisher it keeps the exact copy counts of every ``(group, hash, tier)``
(a block stored twice stays until removed twice) and writes to the index only the
blocks whose presence changed in a batch — one index update per batch.

Recovery rules (the subscriber's repair decides which applies):

* a gap repaired by **replay** is invisible here: the missing batches arrive in order;
* a **snapshot** (pagedkv publishers; also after a publisher restart, i.e. a sequence
  reset) arrives as ``reset`` + the stored blocks: the replica is cleared and rewritten;
* ``AllBlocksCleared`` clears the replica;
* a gap **nobody can repair** (no replay socket, or the batches left the buffer and no
  snapshot is served): :meth:`IndexIngest.mark_rebuilding` clears the replica's entries
  and marks it ``rebuilding``; the events that follow rebuild it, so a router never
  serves a block that a lost batch removed (it may miss blocks stored before the gap);
* the **index unreachable** (Redis down or restarted empty): counts keep being updated in
  memory; :meth:`IndexIngest.heal` (called periodically) notices — a failed write, or a
  replica missing from the index's registry — and rewrites each replica from its counts.

Memory: one dict entry per cached block reference per replica, whatever the backlog.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from pagedkv.cluster.index import BlockRef, ClusterIndex, IndexUnavailableError, Replica
from pagedkv.core.records import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.wire import wire_hash

__all__ = ["IndexIngest"]

logger = logging.getLogger("pagedkv.cluster")

NO_TIER = "-"


class _Feed:
    """One publisher: its replica, copy counts and sync state."""

    __slots__ = ("counts", "replica", "state")

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.counts: dict[BlockRef, int] = {}
        self.state = "synced"


class IndexIngest:
    """Feeds ``index`` from publishers' events (module docstring).

    ``replica_of(publisher_id)`` names the replica a publisher's events belong to; it is
    asked again before every batch, so a DP rank learned from the payloads moves the
    entries (default: the publisher id is the pod, no DP rank).
    """

    def __init__(
        self,
        index: ClusterIndex,
        *,
        replica_of: Callable[[str], Replica] | None = None,
    ) -> None:
        self.index = index
        self._replica_of = replica_of or (lambda publisher_id: Replica(pod=publisher_id))
        self._feeds: dict[str, _Feed] = {}
        self.dirty = False
        self.num_index_failures = 0
        self.num_batches = 0
        self.num_block_events = 0

    # --- MirrorSink ---------------------------------------------------------------------

    def add_publisher(self, publisher_id: str) -> None:
        self._feed(publisher_id)

    def reset(self, publisher_id: str) -> None:
        feed = self._feed(publisher_id)
        feed.counts.clear()
        self._write(lambda: self.index.clear_replica(feed.replica))

    def apply(self, publisher_id: str, events: Iterable[KVCacheEvent]) -> None:
        feed = self._feed(publisher_id)
        counts = feed.counts
        before: dict[BlockRef, bool] = {}  # presence before this batch, of touched refs
        num_blocks = 0
        for event in events:
            if isinstance(event, (BlockStored, BlockRemoved)):
                group_idx = event.group_idx
                tier = event.medium or NO_TIER
                delta = 1 if type(event) is BlockStored else -1
                for raw_hash in event.block_hashes:
                    ref = (group_idx, wire_hash(raw_hash), tier)
                    copies = counts.get(ref, 0)
                    if delta < 0 and copies == 0:
                        continue  # removal of a block stored before we joined
                    before.setdefault(ref, copies > 0)
                    if copies + delta:
                        counts[ref] = copies + delta
                    else:
                        del counts[ref]
                num_blocks += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self._flush(feed, before)
                before = {}
                counts.clear()
                self._write(lambda: self.index.clear_replica(feed.replica))
            else:
                raise InvalidArgumentError(f"not a KV-cache event record: {event!r}")
        self._flush(feed, before)
        self.num_batches += 1
        self.num_block_events += num_blocks

    # --- state --------------------------------------------------------------------------

    def mark_rebuilding(self, publisher_id: str, *, clear: bool = True) -> None:
        """A gap could not be repaired: clear the replica (unless ``clear`` is False: it
        joined mid-stream and holds only what followed) and rebuild from what follows."""
        feed = self._feed(publisher_id)
        if clear:
            logger.warning("replica %s lost events for good: cleared, rebuilding",
                           feed.replica.key)
            feed.counts.clear()
            self._write(lambda: self.index.clear_replica(feed.replica))
        feed.state = "rebuilding"
        self._write(lambda: self.index.set_state(feed.replica, "rebuilding"))

    def mark_synced(self, publisher_id: str) -> None:
        """The subscriber is back in step (a snapshot arrived)."""
        feed = self._feed(publisher_id)
        feed.state = "synced"
        self._write(lambda: self.index.set_state(feed.replica, "synced"))

    def remove_publisher(self, publisher_id: str) -> None:
        """Forget a publisher and its replica's entries."""
        feed = self._feeds.pop(publisher_id, None)
        if feed is not None:
            self._write(lambda: self.index.remove_replica(feed.replica))

    def replica(self, publisher_id: str) -> Replica:
        return self._feed(publisher_id).replica

    def num_blocks(self, publisher_id: str) -> int:
        """Distinct block references the publisher holds (copies not counted)."""
        return len(self._feed(publisher_id).counts)

    def expected_blocks(self, publisher_id: str) -> set[BlockRef]:
        """What the index should hold for the publisher's replica."""
        return set(self._feed(publisher_id).counts)

    def heal(self) -> bool:
        """Rewrite every replica whose index entries may be missing; True when the index
        is known complete afterwards. Costs one registry read (with each replica's block
        count) when nothing is wrong."""
        try:
            if not self.dirty:
                # A replica counts as intact when it is registered with exactly the blocks
                # counted for it: a restarted, empty Redis that a write reached before this
                # check registers the replica again, but with fewer blocks.
                registered = self.index.replicas()
                if all(f.replica in registered
                       and registered[f.replica].num_blocks == len(f.counts)
                       for f in self._feeds.values()):
                    return True
                logger.warning("cluster index lost its entries (restarted?): rewriting")
            for feed in self._feeds.values():
                self.index.clear_replica(feed.replica)
                self.index.update(feed.replica, added=list(feed.counts), removed=[])
                self.index.set_state(feed.replica, feed.state)
        except IndexUnavailableError:
            self.dirty = True
            return False
        if self.dirty:
            logger.info("cluster index rewritten from %d replicas' counts", len(self._feeds))
        self.dirty = False
        return True

    def check_invariants(self) -> None:
        """Counts are positive; unless dirty, the index holds exactly the counted refs."""
        for feed in self._feeds.values():
            assert all(c > 0 for c in feed.counts.values()), feed.replica
            if not self.dirty:
                held = self.index.blocks_of(feed.replica)
                assert held == set(feed.counts), (
                    f"{feed.replica.key}: index has {len(held)} refs, counts "
                    f"{len(feed.counts)}; first differences {sorted(held ^ set(feed.counts))[:3]}"
                )

    # --- internals ----------------------------------------------------------------------

    def _feed(self, publisher_id: str) -> _Feed:
        replica = self._replica_of(publisher_id)
        feed = self._feeds.get(publisher_id)
        if feed is None:
            feed = self._feeds[publisher_id] = _Feed(replica)
            self._write(lambda: self.index.set_state(replica, "synced"))
        elif feed.replica != replica:  # e.g. the DP rank became known
            old = feed.replica
            feed.replica = replica
            self._write(lambda: self.index.remove_replica(old))
            self._write(lambda: self.index.update(replica, added=list(feed.counts), removed=[]))
            self._write(lambda: self.index.set_state(replica, feed.state))
        return feed

    def _flush(self, feed: _Feed, before: dict[BlockRef, bool]) -> None:
        if not before:
            return
        counts = feed.counts
        added = [ref for ref, was in before.items() if not was and ref in counts]
        removed = [ref for ref, was in before.items() if was and ref not in counts]
        if added or removed:
            self._write(lambda: self.index.update(feed.replica, added=added, removed=removed))

    def _write(self, operation: Callable[[], None]) -> None:
        if self.dirty:
            return  # heal() rewrites everything from the counts
        try:
            operation()
        except IndexUnavailableError as exc:
            self.num_index_failures += 1
            self.dirty = True
            logger.warning("cluster index write failed (%s); will rewrite when it is back", exc)
