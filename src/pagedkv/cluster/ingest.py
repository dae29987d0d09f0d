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

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable

from pagedkv.checks import check_number
from pagedkv.cli_args import MAX_SECONDS
from pagedkv.cluster.index import (
    DIGEST_MODULUS,
    BlockRef,
    ClusterIndex,
    IndexUnavailableError,
    Replica,
    WriterConflictError,
    ref_digest,
)
from pagedkv.core.records import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.wire import wire_hash

__all__ = ["IndexIngest"]

logger = logging.getLogger("pagedkv.cluster")

NO_TIER = "-"
_U64 = 1 << 64


class _Feed:
    """One publisher: its replica, copy counts, the digest of the counted references
    (:func:`~pagedkv.cluster.index.ref_digest`) and sync state."""

    __slots__ = ("counts", "digest", "owned", "replica", "state")

    def __init__(self, replica: Replica, *, owned: bool) -> None:
        self.replica = replica
        self.counts: dict[BlockRef, int] = {}
        self.digest = 0
        self.state = "synced"
        self.owned = owned  # holds the writer lease (always, without leases)

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
            if not all(type(r[1]) is int and 0 <= r[1] < _U64 for r in refs):
                raise InvalidArgumentError(
                    f"block hashes are bytes or unsigned 64-bit ints: {event!r:.200}")
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

    ``lease_ttl_s``: write a replica only while holding its writer lease
    (:meth:`ClusterIndex.claim_writer`, as ``writer_id``, default a random id), renewed
    by :meth:`heal`; None (default): no leases. Without the lease the ingest *stands by*:
    it keeps its counts from the events but writes nothing; when the holder stops
    renewing (it died), :meth:`heal` takes the lease and rewrites the replica from its
    own counts. So two ingests following one pod never flap its entries.
    """

    def __init__(
        self,
        index: ClusterIndex,
        *,
        replica_of: Callable[[str], Replica] | None = None,
        lease_ttl_s: float | None = None,
        writer_id: str | None = None,
    ) -> None:
        if lease_ttl_s is not None:
            check_number("lease_ttl_s", lease_ttl_s, minimum=0.001, maximum=MAX_SECONDS)
        self.index = index
        self.lease_ttl_s = lease_ttl_s
        self.writer_id = writer_id if writer_id is not None else uuid.uuid4().hex
        self.num_standby_replicas = 0
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
        self._write(feed, lambda: self.index.clear_replica(feed.replica))

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
                self._write(feed, lambda: self.index.clear_replica(feed.replica))
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
            self._write(feed, lambda: self.index.clear_replica(feed.replica))
        feed.state = "rebuilding"
        self._write(feed, lambda: self.index.set_state(feed.replica, "rebuilding"))

    def mark_synced(self, publisher_id: str) -> None:
        """The subscriber is back in step (a snapshot arrived)."""
        feed = self._feed(publisher_id)
        feed.state = "synced"
        self._write(feed, lambda: self.index.set_state(feed.replica, "synced"))

    def remove_publisher(self, publisher_id: str) -> None:
        """Forget a publisher and its replica's entries."""
        feed = self._feeds.pop(publisher_id, None)
        if feed is not None:
            self._write(feed, lambda: self.index.remove_replica(feed.replica))
            self._release(feed)

    def close(self) -> None:
        """End the writer leases held (a standby ingest takes over at once, not after
        ``lease_ttl_s``). Idempotent; the index stays open."""
        for feed in self._feeds.values():
            self._release(feed)

    def _release(self, feed: _Feed) -> None:
        if self.lease_ttl_s is not None and feed.owned:
            feed.owned = False
            with contextlib.suppress(IndexUnavailableError):  # it expires on its own
                self.index.release_writer(feed.replica, self.writer_id)

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
            taken = self._renew_leases()
            if taken:
                logger.warning("took over writing %s (the previous writer stopped)",
                               ", ".join(f.replica.key for f in taken))
                self.dirty = True
            if not self.dirty:
                registered = self.index.replicas()
                if all(f.replica in registered
                       and registered[f.replica].num_blocks == len(f.counts)
                       and registered[f.replica].digest == f.digest
                       for f in self._feeds.values() if f.owned):
                    return True
                logger.warning("cluster index differs from the counts (restarted, or "
                               "written by another ingest?): rewriting")
            for feed in self._feeds.values():
                self._rewrite(feed)
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
            if not self.dirty and feed.owned:
                held = self.index.blocks_of(feed.replica)
                assert held == set(feed.counts), (
                    f"{feed.replica.key}: index has {len(held)} refs, counts "
                    f"{len(feed.counts)}; first differences {sorted(held ^ set(feed.counts))[:3]}"
                )

    # --- internals ----------------------------------------------------------------------

    def _renew_leases(self) -> list[_Feed]:
        """Take or renew each replica's lease; the feeds just taken over."""
        if self.lease_ttl_s is None:
            return []
        taken = []
        standby = 0
        for feed in self._feeds.values():
            holder = self.index.claim_writer(feed.replica, self.writer_id, self.lease_ttl_s)
            if holder is None and not feed.owned:
                taken.append(feed)
            feed.owned = holder is None
            standby += holder is not None
        self.num_standby_replicas = standby
        return taken

    def _feed(self, publisher_id: str) -> _Feed:
        replica = self._replica_of(publisher_id)
        feed = self._feeds.get(publisher_id)
        if feed is None:
            feed = self._feeds[publisher_id] = _Feed(replica, owned=self.lease_ttl_s is None)
            if self.lease_ttl_s is not None:
                self._claim(feed)
            self._write(feed, lambda: self.index.set_state(replica, "synced"))
        elif feed.replica != replica:  # e.g. the DP rank became known
            old = feed.replica
            self._write(feed, lambda: self.index.remove_replica(old))
            self._release(feed)
            feed.replica = replica
            if self.lease_ttl_s is not None:
                self._claim(feed)
            else:
                feed.owned = True
            if not self.dirty:
                try:
                    self._rewrite(feed)
                except IndexUnavailableError:
                    self.dirty = True
        return feed

    def _rewrite(self, feed: _Feed) -> None:
        """Replace the replica's entries with the counted ones (the owner only)."""
        if not feed.owned:
            return
        writer = None if self.lease_ttl_s is None else self.writer_id
        self.index.clear_replica(feed.replica)
        try:
            self.index.update(feed.replica, added=list(feed.counts), removed=[], writer=writer)
        except WriterConflictError:
            feed.owned = False
            return
        self.index.set_state(feed.replica, feed.state)

    def _flush(self, feed: _Feed, before: dict[BlockRef, bool]) -> None:
        if not before:
            return
        counts = feed.counts
        added = [ref for ref, was in before.items() if not was and ref in counts]
        removed = [ref for ref, was in before.items() if was and ref not in counts]
        feed.digest = (feed.digest + sum(map(ref_digest, added))
                       - sum(map(ref_digest, removed))) % DIGEST_MODULUS
        if added or removed:
            writer = None if self.lease_ttl_s is None else self.writer_id
            self._write(feed, lambda: self.index.update(feed.replica, added=added,
                                                        removed=removed, writer=writer))

    def _claim(self, feed: _Feed) -> None:
        assert self.lease_ttl_s is not None
        try:
            holder = self.index.claim_writer(feed.replica, self.writer_id, self.lease_ttl_s)
        except IndexUnavailableError:
            self.dirty = True  # heal() claims again
            return
        feed.owned = holder is None
        if holder is not None:
            logger.warning("replica %s is written by ingest %s: standing by",
                           feed.replica.key, holder)

    def _write(self, feed: _Feed, operation: Callable[[], None]) -> None:
        if self.dirty or not feed.owned:
            return  # heal() rewrites everything from the counts; a standby never writes
        try:
            operation()
        except WriterConflictError:
            feed.owned = False  # the lease went to another ingest: stand by
            logger.warning("replica %s: writer lease lost; standing by", feed.replica.key)
        except IndexUnavailableError as exc:
            self.num_index_failures += 1
            self.dirty = True
            logger.warning("cluster index write failed (%s); will rewrite when it is back", exc)
