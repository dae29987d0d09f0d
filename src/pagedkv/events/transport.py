"""The ZeroMQ transport that keeps a mirror of each publisher's prefix index in step.

:class:`Subscriber` feeds a :class:`~pagedkv.events.mirror.MirrorIndex` (or any
:class:`~pagedkv.events.mirror.MirrorSink`) from ZeroMQ: one SUB socket per publisher for
the live stream, and one DEALER socket per publisher for repairs.

Repair rules, per publisher (sequence numbers are per publisher, +1 per batch):

* a live batch numbered ``next_seq`` is applied; one numbered higher is held back and the
  gap is requested by replay from ``next_seq``;
* when the replay cannot fill the gap (older than the publisher's buffer, or dropped
  before it was sent), a snapshot replaces the mirrored index and held batches from the
  snapshot's sequence number on are applied;
* a batch numbered lower than expected means the publisher restarted: resync by snapshot;
* losing the last batches before a pause shows no gap, so a publisher quiet for
  ``idle_probe_s`` is probed with a replay request from ``next_seq`` (answered with just
  the end marker when nothing was lost);
* with no replay endpoint, or when every repair failed, the subscriber skips ahead and
  reports the publisher as not synced (and asks for a snapshot again once live batches
  show the publisher is stepping).

Everything runs in the caller's thread, inside :meth:`Subscriber.poll`.
Needs the ``events`` extra (pyzmq, msgpack).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pagedkv.checks import check_text
from pagedkv.core.records import KVCacheEvent
from pagedkv.errors import InvalidArgumentError, require
from pagedkv.events.mirror import MirrorIndex, MirrorSink
from pagedkv.events.snapshot import (
    SNAPSHOT_REPLY,
    SNAPSHOT_REQUEST,
    stored_from_snapshot_events,
)
from pagedkv.events.source_state import SourceState, SourceStatus
from pagedkv.events.sub_socket import SubOptions, check_options, connect_sub
from pagedkv.events.wire import END_OF_REPLAY, decode_batch, decode_seq, encode_seq

__all__ = ["SourceStatus", "Subscriber"]

logger = logging.getLogger("pagedkv.events")

_MAX_DRAIN_PER_SOCKET = 1000  # messages read from one socket per poll round
_MAX_REQUEST_ATTEMPTS = 3


class Subscriber:
    """Mirrors one or many publishers into a :class:`MirrorIndex` (default) or any
    :class:`~pagedkv.events.mirror.MirrorSink`.

    ``request_timeout_s`` bounds the wait for a replay or snapshot answer (three tries,
    then the subscriber skips ahead); ``idle_probe_s`` is the quiet time after which a
    publisher is probed for lost tail batches (None: never); ``rcvhwm`` is the SUB
    socket's receive high-water mark in messages, ``rcvbuf_bytes`` its kernel receive
    buffer (None: the system's); together they bound what a slow subscriber queues.

    Not thread-safe: one thread calls every method. Sockets connect to the given
    endpoints (publishers bind). Close with :meth:`close` or a ``with`` block.

    Raises MissingDependencyError without pyzmq or msgpack; InvalidArgumentError for a
    timeout that is not a finite number of seconds > 0 (at most 10^9), or a socket size
    that is not a whole number in [1, 2**31 - 1].
    """

    def __init__(
        self,
        mirror: MirrorSink | None = None,
        *,
        context: Any = None,
        request_timeout_s: float = 2.0,
        idle_probe_s: float | None = 1.0,
        rcvhwm: int = 100_000,
        rcvbuf_bytes: int | None = None,
    ) -> None:
        check_options(request_timeout_s, idle_probe_s, rcvhwm, rcvbuf_bytes)
        zmq: Any = require("zmq", "events", "the KV-cache event subscriber")
        self._zmq = zmq
        require("msgpack", "events", "the KV-cache event subscriber")
        self.mirror: MirrorSink = MirrorIndex() if mirror is None else mirror
        self._own_context = context is None
        self._context = self._zmq.Context() if context is None else context
        self._poller = self._zmq.Poller()
        self._sources: dict[str, SourceState] = {}
        self._socket_to_source: dict[Any, tuple[SourceState, bool]] = {}  # (source, is_sub)
        self._request_timeout_s = request_timeout_s
        self._idle_probe_s = idle_probe_s
        self._rcvhwm = rcvhwm
        self._rcvbuf_bytes = rcvbuf_bytes
        self._closed = False

    def add_publisher(
        self,
        publisher_id: str,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        sync: bool = True,
    ) -> None:
        """Start following one publisher.

        ``topic`` is a prefix filter on the topic frame. With ``replay_endpoint`` and
        ``sync`` the subscriber first asks for a snapshot, so the mirror starts complete;
        with ``sync=False`` it starts from the first live batch it sees.
        Raises InvalidArgumentError for a publisher id already added, or an endpoint
        ZeroMQ cannot connect to (nothing is added then).
        """
        check_text("publisher_id", publisher_id, allow_empty=False)
        check_text("topic", topic)
        if publisher_id in self._sources:
            raise InvalidArgumentError(f"publisher {publisher_id!r} was already added")
        sub = connect_sub(self._zmq, self._context, SubOptions(
            endpoint, replay_endpoint, topic, self._rcvhwm, self._rcvbuf_bytes))
        source = SourceState(
            publisher_id, sub, replay_endpoint, sync and replay_endpoint is not None
        )
        self._sources[publisher_id] = source
        self._watch(sub, source, is_sub=True)
        self.mirror.add_publisher(publisher_id)
        if source.want_snapshot:
            self._request(source, "snapshot", [SNAPSHOT_REQUEST])

    def status(self, publisher_id: str) -> SourceStatus:
        """Counters and sync state of one publisher; KeyError if never added."""
        s = self._sources[publisher_id]
        return SourceStatus(
            s.publisher_id,
            s.next_seq,
            s.synced,
            s.awaiting is not None,
            s.num_batches,
            s.num_gaps,
            s.num_replay_requests,
            s.num_snapshots,
            s.num_bad_messages,
        )

    def num_lost_batches(self, publisher_id: str) -> int:
        """Live batches that never arrived from one publisher (holes between consecutive
        live sequence numbers, whether or not a repair filled them); KeyError if never
        added. A subscriber that falls behind loses batches beyond the high-water marks
        instead of growing without bound: this counts them."""
        return self._sources[publisher_id].num_lost_live

    def data_parallel_rank(self, publisher_id: str) -> int | None:
        """The DP rank in the last payload received from one publisher (None before any,
        or when the publisher sends nil); KeyError if never added."""
        return self._sources[publisher_id].data_parallel_rank

    def poll(self, timeout_s: float = 0.0) -> int:
        """Wait up to ``timeout_s`` for messages, then process all that are ready.

        Returns the number of batches (and snapshots) applied. Never waits longer than
        ``timeout_s``; retries overdue repair requests.
        Raises InvalidArgumentError after :meth:`close`.
        """
        if self._closed:
            raise InvalidArgumentError("poll() on a closed Subscriber")
        before = self._total_applied()
        ready = self._poller.poll(max(0, int(timeout_s * 1000)))
        for sock, _ in ready:
            entry = self._socket_to_source.get(sock)
            if entry is None:  # a dealer replaced earlier in this round
                continue
            source, is_sub = entry
            for _ in range(_MAX_DRAIN_PER_SOCKET):
                try:
                    frames = sock.recv_multipart(self._zmq.NOBLOCK)
                except self._zmq.Again:
                    break
                if is_sub:
                    self._on_live(source, frames)
                else:
                    self._on_reply(source, frames)
                    if source.dealer is not sock:
                        break
        now = time.monotonic()
        probe_s = self._idle_probe_s
        for source in self._sources.values():
            if source.awaiting is not None:
                if not now <= source.deadline_s:  # (a NaN deadline retries, never hangs)
                    self._retry(source)
            elif (
                probe_s is not None
                and source.replay_endpoint is not None
                and source.next_seq is not None
                and now - source.quiet_since_s > probe_s
            ):
                # Loss of the last batches before a pause shows no gap; a replay from
                # next_seq finds them (and costs one end marker when nothing was lost).
                source.quiet_since_s = now
                self._request(source, "replay", [encode_seq(source.next_seq)])
        return self._total_applied() - before

    def sync(self, timeout_s: float) -> bool:
        """Poll until no publisher has a repair outstanding or ``timeout_s`` passes.

        Returns whether every publisher is synced at the end.
        """
        deadline = time.monotonic() + timeout_s
        while any(s.awaiting is not None for s in self._sources.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.poll(min(left, 0.05))
        return all(s.synced and s.awaiting is None for s in self._sources.values())

    def close(self) -> None:
        """Close every socket (and the context this subscriber created). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for sock in list(self._socket_to_source):
            sock.close(linger=0)
        self._socket_to_source.clear()
        if self._own_context:
            self._context.term()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------

    def _total_applied(self) -> int:
        return sum(s.num_batches + s.num_snapshots for s in self._sources.values())

    def _watch(self, sock: Any, source: SourceState, *, is_sub: bool) -> None:
        self._poller.register(sock, self._zmq.POLLIN)
        self._socket_to_source[sock] = (source, is_sub)

    def _fresh_dealer(self, source: SourceState) -> Any:
        """A new DEALER for ``source``: replies to an abandoned request cannot reach it."""
        if source.dealer is not None:
            self._poller.unregister(source.dealer)
            del self._socket_to_source[source.dealer]
            source.dealer.close(linger=0)
        dealer = self._context.socket(self._zmq.DEALER)
        dealer.connect(source.replay_endpoint)
        source.dealer = dealer
        self._watch(dealer, source, is_sub=False)
        return dealer

    def _request(self, source: SourceState, kind: str, body: list[bytes]) -> None:
        if source.dealer is None or source.awaiting is not None:
            self._fresh_dealer(source)  # so late replies to the old request cannot mislead
        source.awaiting = kind
        source.request = body
        source.attempts = 1
        source.deadline_s = time.monotonic() + self._request_timeout_s
        if kind == "snapshot":
            source.snapshot_tried = True
        else:
            source.num_replay_requests += 1
            source.replay_hole = False
        source.dealer.send_multipart([b"", *body])

    def _retry(self, source: SourceState) -> None:
        if source.attempts >= _MAX_REQUEST_ATTEMPTS:
            logger.warning(
                "publisher %r does not answer %s requests; skipping ahead",
                source.publisher_id,
                source.awaiting,
            )
            source.awaiting = None
            source.resync_after_s = time.monotonic() + self._request_timeout_s
            source.synced = False
            self._skip_ahead(source)
            return
        source.attempts += 1
        source.deadline_s = time.monotonic() + self._request_timeout_s
        self._fresh_dealer(source).send_multipart([b"", *source.request])

    def _apply(self, source: SourceState, events: list[KVCacheEvent]) -> None:
        self.mirror.apply(source.publisher_id, events)
        source.num_batches += 1
        assert source.next_seq is not None
        source.next_seq += 1

    def _on_live(self, source: SourceState, frames: list[bytes]) -> None:
        try:
            if len(frames) != 3:
                raise InvalidArgumentError(f"expected 3 frames, got {len(frames)}")
            seq = decode_seq(frames[1])
            batch = decode_batch(frames[2])
        except InvalidArgumentError as exc:
            source.num_bad_messages += 1
            logger.warning("bad message from %r: %s", source.publisher_id, exc)
            return  # if a batch was lost here, the next one shows the gap
        events = batch.events
        source.data_parallel_rank = batch.data_parallel_rank
        last_live_seq = source.last_live_seq
        source.last_live_seq = seq
        source.quiet_since_s = time.monotonic()
        if last_live_seq is not None and seq > last_live_seq + 1:
            source.num_lost_live += seq - last_live_seq - 1
        if last_live_seq is not None and seq <= last_live_seq:
            self._on_restart(source, seq, events)
            return
        if source.awaiting is not None:
            source.pending[seq] = events
            return
        if source.next_seq is None:  # first batch without a snapshot
            source.next_seq = seq
            source.synced = seq == 0
        if seq == source.next_seq:
            self._apply(source, events)
        elif seq > source.next_seq:
            source.num_gaps += 1
            source.pending[seq] = events
            self._repair(source)
        # else: sent before the snapshot or replay that already covered it
        if (
            not source.synced
            and source.want_snapshot
            and source.awaiting is None
            and source.replay_endpoint is not None
            and not source.snapshot_unavailable
            and time.monotonic() >= source.resync_after_s
        ):
            # An earlier repair failed (e.g. the engine was idle and could not answer);
            # live batches show it is stepping again, so a snapshot can now be served.
            self._request(source, "snapshot", [SNAPSHOT_REQUEST])

    def _on_restart(self, source: SourceState, seq: int, events: list[KVCacheEvent]) -> None:
        """The live numbering went back: the publisher restarted with a new index."""
        logger.info("publisher %r restarted (seq %d)", source.publisher_id, seq)
        source.pending = {seq: events}
        if source.replay_endpoint is not None and not source.snapshot_unavailable:
            self._request(source, "snapshot", [SNAPSHOT_REQUEST])
        else:
            source.awaiting = None
            self.mirror.reset(source.publisher_id)
            source.next_seq = seq
            source.synced = seq == 0
            self._drain_pending(source)

    def _repair(self, source: SourceState) -> None:
        if source.replay_endpoint is None:
            self._skip_ahead(source)
            return
        assert source.next_seq is not None
        source.snapshot_tried = False
        self._request(source, "replay", [encode_seq(source.next_seq)])

    def _drain_pending(self, source: SourceState) -> None:
        pending = source.pending
        assert source.next_seq is not None
        while source.next_seq in pending:
            self._apply(source, pending.pop(source.next_seq))
        for seq in [s for s in pending if s < source.next_seq]:
            del pending[seq]

    def _skip_ahead(self, source: SourceState) -> None:
        """Give up on a hole: jump to the held batches, and say the mirror is incomplete."""
        while source.pending:
            source.synced = False
            source.next_seq = min(source.pending)
            self._drain_pending(source)

    def _on_reply(self, source: SourceState, frames: list[bytes]) -> None:
        if len(frames) != 4 or frames[0] != b"":
            source.num_bad_messages += 1
            return
        _, head, seq_frame, payload = frames
        if head == SNAPSHOT_REPLY:
            if source.awaiting == "snapshot":
                self._on_snapshot(source, seq_frame, payload)
        elif seq_frame == END_OF_REPLAY and head == b"":
            if source.awaiting == "replay":
                self._on_end_of_replay(source)
            elif source.awaiting == "snapshot":
                # A publisher that does not know snapshot requests answers like this.
                self._on_snapshot(source, END_OF_REPLAY, b"")
        elif source.awaiting == "replay":
            try:
                seq = decode_seq(seq_frame)
                assert source.next_seq is not None
                if seq > source.next_seq:  # that batch is gone (dropped or out of the buffer)
                    source.replay_hole = True
                    if source.snapshot_unavailable:  # nothing better will come: jump
                        source.synced = False
                        source.next_seq = seq
                if seq == source.next_seq:
                    self._apply(source, decode_batch(payload).events)
            except InvalidArgumentError as exc:
                source.num_bad_messages += 1
                logger.warning("bad replay message from %r: %s", source.publisher_id, exc)

    def _on_end_of_replay(self, source: SourceState) -> None:
        source.awaiting = None
        source.quiet_since_s = time.monotonic()
        self._drain_pending(source)
        if not source.pending and not source.replay_hole:
            return
        # The replay could not fill the hole: its batches left the buffer or were dropped.
        if (
            not source.snapshot_tried
            and not source.snapshot_unavailable
            and source.replay_endpoint is not None
        ):
            self._request(source, "snapshot", [SNAPSHOT_REQUEST])
        else:
            self._skip_ahead(source)

    def _on_snapshot(self, source: SourceState, seq_frame: bytes, payload: bytes) -> None:
        source.awaiting = None
        if seq_frame == END_OF_REPLAY:
            source.snapshot_unavailable = True
            if source.next_seq is None:
                # Sync from the start of the stream, as far as the replay buffer has it.
                source.next_seq = 0
                source.synced = True
                self.mirror.reset(source.publisher_id)
                self._request(source, "replay", [encode_seq(0)])
            else:
                self._skip_ahead(source)
            return
        try:
            next_seq = decode_seq(seq_frame)
            batch = decode_batch(payload)
            stored = stored_from_snapshot_events(batch.events)
        except InvalidArgumentError as exc:
            source.num_bad_messages += 1
            logger.warning("bad snapshot from %r: %s", source.publisher_id, exc)
            self._skip_ahead(source)
            return
        source.data_parallel_rank = batch.data_parallel_rank
        self.mirror.reset(source.publisher_id)
        self.mirror.apply(source.publisher_id, stored)
        source.num_snapshots += 1
        source.next_seq = next_seq
        source.synced = True
        self._drain_pending(source)
        if source.pending:  # live batches after the snapshot went missing too
            self._repair(source)
