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

from pagedkv.cluster.index import (
    DIGEST_MODULUS,
    BlockRef,
    ClusterIndex,
    IndexUnavailableError,
    Replica,
    ref_digest,
)
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.records import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.events.wire import wire_hash

__all__ = ["IndexIngest"]

logger = logging.getLogger("pagedkv.cluster")

NO_TIER = "-"


class _Feed:
    """One publisher: its replica, copy counts, the digest of the counted references
    (:func:`~pagedkv.cluster.index.ref_digest`) and sync state."""

    __slots__ = ("counts", "digest", "replica", "state")

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.counts: dict[BlockRef, int] = {}
        self.digest = 0
        self.state = "synced"

    def clear(self) -> None:
        self.counts.clear()
        self.digest = 0


#: One step of a checked batch: +1 (stored) or -1 (removed) and the references, or None
#: for AllBlocksCleared.
_Step = tuple[int, list[BlockRef]] | None


def _checked_steps(events: Iterable[KVCacheEvent]) -> list[_Step]:
    """The batch as steps, every record checked first, so a bad one raises before anything
    changes (a batch applies entirely or not at all).

    Raises:
        InvalidArgumentError: a record that is not a KV-cache event, or one whose group,
            hashes or medium are malformed.
    """
    steps: list[_Step] = []
    for event in events:
        if isinstance(event, (BlockStored, BlockRemoved)):
            group_idx, tier = event.group_idx, event.medium or NO_TIER
            if type(group_idx) is not int or group_idx < 0 or type(tier) is not str:
                raise InvalidArgumentError(
                    f"bad KV-cache event (group {group_idx!r}, medium {tier!r}): {event!r:.200}")
            try:
                refs = [(group_idx, wire_hash(h), tier) for h in event.block_hashes]
            except (TypeError, ValueError, OverflowError) as exc:
                raise InvalidArgumentError(
                    f"bad block hash in a KV-cache event ({exc}): {event!r:.200}") from None
            steps.append((1 if type(event) is BlockStored else -1, refs))
        elif isinstance(event, AllBlocksCleared):
            steps.append(None)
        else:
            raise InvalidArgumentError(f"not a KV-cache event record: {event!r:.200}")
    return steps


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
        feed.clear()
        self._write(lambda: self.index.clear_replica(feed.replica))

    def apply(self, publisher_id: str, events: Iterable[KVCacheEvent]) -> None:
        """Apply one batch, entirely or not at all.

        Raises:
            InvalidArgumentError: a malformed record anywhere in the batch; nothing
                changed (counts and index as before).
        """
        steps = _checked_steps(events)
        feed = self._feed(publisher_id)
        counts = feed.counts
        before: dict[BlockRef, bool] = {}  # presence before this batch, of touched refs
        num_blocks = 0
        for step in steps:
            if step is None:  # AllBlocksCleared
                self._flush(feed, before)
                before = {}
                feed.clear()
                self._write(lambda: self.index.clear_replica(feed.replica))
                continue
            delta, refs = step
            for ref in refs:
                copies = counts.get(ref, 0)
                if delta < 0 and copies == 0:
                    continue  # removal of a block stored before we joined
                before.setdefault(ref, copies > 0)
                if copies + delta:
                    counts[ref] = copies + delta
                else:
                    del counts[ref]
            num_blocks += len(refs)
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
            feed.clear()
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
        """Rewrite every replica whose index entries may differ from the counts; True when
        the index is known complete afterwards. Costs one registry read (with each
        replica's block count and digest) when nothing is wrong.

        A replica counts as intact when it is registered with exactly as many blocks as
        counted for it *and* the same digest (:func:`~pagedkv.cluster.index.ref_digest`):
        a restarted, empty Redis that a write reached before this check registers the
        replica again with fewer blocks; another writer, or a lost write, can leave as
        many blocks but other ones."""
        try:
            if not self.dirty:
                registered = self.index.replicas()
                if all(f.replica in registered
                       and registered[f.replica].num_blocks == len(f.counts)
                       and registered[f.replica].digest == f.digest
                       for f in self._feeds.values()):
                    return True
                logger.warning("cluster index differs from the counts (restarted, or "
                               "written by another ingest?): rewriting")
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
        feed.digest = (feed.digest + sum(map(ref_digest, added))
                       - sum(map(ref_digest, removed))) % DIGEST_MODULUS
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
