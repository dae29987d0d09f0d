"""ZeroMQ publisher of KV-cache events in vLLM's wire format, with replay and snapshots.

The engine thread calls :meth:`ZmqEventPublisher.publish` once per step with what
``take_events()`` returned. That call only stamps the batch with a timestamp and a
sequence number and hands it to a bounded queue: it never waits on the network. A
background thread encodes each batch (see :mod:`pagedkv.events.wire`), sends it on the
PUB socket, keeps the last ``buffer_steps`` payloads, and answers replay and snapshot
requests on the optional ROUTER socket (protocol in :mod:`pagedkv.events.snapshot`).

Loss is always visible to subscribers: a batch dropped because the queue was full still
consumes its sequence number, so subscribers see a gap; the replay buffer has no payload
for it, so they fall back to a snapshot.

Needs the ``events`` extra (pyzmq, msgpack).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pagedkv.core.records import BlockStored, KVCacheEvent
from pagedkv.errors import ConfigError, InvalidArgumentError, require
from pagedkv.events.settings import KVEventsSettings, should_bind
from pagedkv.events.snapshot import SNAPSHOT_REPLY, SNAPSHOT_REQUEST, Snapshot, snapshot_events
from pagedkv.events.wire import END_OF_REPLAY, BatchEncoder, encode_seq

__all__ = ["PublisherStats", "ZmqEventPublisher"]

logger = logging.getLogger("pagedkv.events")

SnapshotFn = Callable[[], list[BlockStored]]

# How long the sender thread sleeps on an empty queue before checking the replay socket:
# the worst-case latency of a replay answer while the engine is idle.
_IDLE_POLL_S = 0.005
_SEQ_BYTES = 8


class PublisherStats(NamedTuple):
    """Counters of one publisher since it was created."""

    next_seq: int
    """Sequence number the next non-empty batch will get."""
    num_sent_batches: int
    num_dropped_batches: int
    """Batches refused by :meth:`ZmqEventPublisher.publish` because the queue was full."""
    num_replay_requests: int
    num_snapshot_requests: int


class _Batch(NamedTuple):
    seq: int
    timestamp_s: float
    events: Sequence[KVCacheEvent]
    rank: int | None


class _SnapshotJob(NamedTuple):
    identities: list[bytes]
    snapshot: Snapshot | None  # None: no snapshot could be taken
    timestamp_s: float


_STOP = object()


class ZmqEventPublisher:
    """Publishes event batches on a PUB socket; serves replay and snapshots on a ROUTER.

    ``snapshot_fn`` returns the current prefix index as stored-block records, parents
    before children (e.g. the manager's ``prefix_index_snapshot``). It is only ever
    called on the engine thread, inside :meth:`publish` or :meth:`snapshot`.

    Thread contract: :meth:`publish`, :meth:`snapshot` and :meth:`close` belong to one
    engine thread; :attr:`stats` may be read from anywhere.

    Raises:
        MissingDependencyError: pyzmq or msgpack is not installed.
        ConfigError: an endpoint cannot be bound or connected (malformed, or the address
            is in use).
    """

    def __init__(
        self,
        config: KVEventsSettings,
        *,
        snapshot_fn: SnapshotFn | None = None,
        context: Any = None,
    ) -> None:
        zmq: Any = require("zmq", "events", "the KV-cache event publisher")
        self._zmq = zmq
        self._config = config
        self._snapshot_fn = snapshot_fn
        self._encoder = BatchEncoder(config.wire_form)  # used by the sender thread only
        self._topic = config.topic.encode()
        self._own_context = context is None
        self._context = zmq.Context() if context is None else context
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._max_queue_size = config.max_queue_size
        self._next_seq = 0
        self._num_dropped = 0
        self._num_sent = 0
        self._num_replay_requests = 0
        self._num_snapshot_requests = 0
        # Identities of snapshot requesters, appended by the sender thread and served
        # by the engine thread at its next publish().
        self._snapshot_waiters: collections.deque[bytes] = collections.deque()
        self._closed = False
        self._abandon = False  # set by close() to stop flushing

        self._pub: Any = None
        self._router: Any = None
        try:
            self._pub = self._open(zmq.PUB, config.endpoint, hwm=config.hwm)
            if config.replay_endpoint is not None:
                # Room for a whole replay, so a replay is never cut short by the HWM.
                self._router = self._open(
                    zmq.ROUTER, config.replay_endpoint, hwm=config.buffer_steps + 16
                )
        except Exception:
            if self._pub is not None:
                self._pub.close(linger=0)
            if self._own_context:
                self._context.term()
            raise
        self._thread = threading.Thread(target=self._run, name="pagedkv-kv-events", daemon=True)
        self._thread.start()

    def _open(self, kind: int, endpoint: str, *, hwm: int) -> Any:
        sock = self._context.socket(kind)
        bind = should_bind(endpoint)
        try:
            sock.setsockopt(self._zmq.SNDHWM, hwm)
            if "::" in endpoint or endpoint.startswith("tcp://["):
                sock.setsockopt(self._zmq.IPV6, 1)
            if bind:
                sock.bind(endpoint)
            else:
                sock.connect(endpoint)
        except self._zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ConfigError(
                f"cannot {'bind' if bind else 'connect'} the events endpoint {endpoint!r}: "
                f"{exc}; give a free port ('tcp://127.0.0.1:*' picks one) or a valid "
                "endpoint such as 'tcp://127.0.0.1:5557'") from exc
        except Exception:
            sock.close(linger=0)
            raise
        return sock

    # --- engine thread ----------------------------------------------------------------

    @property
    def config(self) -> KVEventsSettings:
        return self._config

    @property
    def stats(self) -> PublisherStats:
        return PublisherStats(
            self._next_seq,
            self._num_sent,
            self._num_dropped,
            self._num_replay_requests,
            self._num_snapshot_requests,
        )

    @property
    def last_endpoint(self) -> str:
        """The PUB socket's resolved endpoint (the real port when bound to ``:0``)."""
        return str(self._pub.getsockopt_string(self._zmq.LAST_ENDPOINT))

    @property
    def last_replay_endpoint(self) -> str | None:
        """The ROUTER socket's resolved endpoint, or None without a replay socket."""
        if self._router is None:
            return None
        return str(self._router.getsockopt_string(self._zmq.LAST_ENDPOINT))

    def publish(self, events: Sequence[KVCacheEvent]) -> bool:
        """Queue one step's events as the next batch; never blocks. O(1).

        Call it once per engine step right after ``take_events()`` (also with an empty
        list: that sends nothing but serves pending snapshot requests, which need the
        index to match the sequence numbers given out so far). The publisher keeps a
        reference to ``events``; do not mutate it afterwards.

        Returns False when the queue was full and the batch was dropped (its sequence
        number is spent, so subscribers see the gap); True otherwise.

        Raises InvalidArgumentError after :meth:`close`.
        """
        return self.publish_as(events, self._config.data_parallel_rank)

    def publish_as(self, events: Sequence[KVCacheEvent], data_parallel_rank: int | None) -> bool:
        """:meth:`publish`, the batch tagged with ``data_parallel_rank`` instead of the
        config's: several engines (data-parallel ranks) sharing this one publisher, each
        batch naming its engine as vLLM's payload does. O(1)."""
        if self._closed:
            raise InvalidArgumentError("publish() on a closed ZmqEventPublisher")
        accepted = True
        if events:
            seq = self._next_seq
            self._next_seq = seq + 1
            if self._queue.qsize() < self._max_queue_size:
                self._queue.put(_Batch(seq, time.time(), events, data_parallel_rank))
            else:
                self._num_dropped += 1
                accepted = False
        if self._snapshot_waiters:
            self._serve_snapshot_waiters()
        return accepted

    def snapshot(self) -> Snapshot:
        """The current index (compacted) and the sequence number it reflects.

        Must be called on the engine thread between steps, like :meth:`publish`.
        Cost: one ``snapshot_fn`` call, O(index size).
        Raises InvalidArgumentError when the publisher has no ``snapshot_fn``.
        """
        if self._snapshot_fn is None:
            raise InvalidArgumentError(
                "this ZmqEventPublisher has no snapshot_fn; pass one to take snapshots"
            )
        return Snapshot(self._next_seq, self._snapshot_fn())

    def _serve_snapshot_waiters(self) -> None:
        identities: list[bytes] = []
        while self._snapshot_waiters:
            identities.append(self._snapshot_waiters.popleft())
        snap: Snapshot | None = None
        if self._snapshot_fn is not None:
            try:
                snap = self.snapshot()
            except Exception:  # never let a snapshot failure break the engine step
                logger.exception("snapshot_fn failed; answering 'no snapshot'")
        # Snapshot jobs bypass the bound: they are rare and must not be lost.
        self._queue.put(_SnapshotJob(identities, snap, time.time()))

    def close(self, timeout_s: float = 1.0) -> None:
        """Send what is queued (for up to ``timeout_s``), then close sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # still flushing: stop waiting for it
            self._abandon = True
            self._thread.join(timeout_s)
        if self._own_context and not self._thread.is_alive():
            self._context.term()

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- sender thread ----------------------------------------------------------------

    def _run(self) -> None:
        pub, router = self._pub, self._router
        replay_buffer: collections.deque[tuple[int, bytes, bytes]] = collections.deque(
            maxlen=self._config.buffer_steps
        )
        rank = self._config.data_parallel_rank
        encode = self._encoder.encode
        get = self._queue.get
        try:
            while not self._abandon:
                try:
                    item = get(timeout=_IDLE_POLL_S)
                except queue.Empty:
                    item = None
                if item is _STOP:
                    break
                if type(item) is _Batch:
                    payload = encode(
                        item.events, timestamp_s=item.timestamp_s,
                        data_parallel_rank=item.rank,
                    )
                    seq_frame = encode_seq(item.seq)
                    # PUB never blocks: at the HWM it drops for that subscriber.
                    pub.send_multipart((self._topic, seq_frame, payload), copy=False)
                    replay_buffer.append((item.seq, seq_frame, payload))
                    self._num_sent += 1
                elif type(item) is _SnapshotJob and router is not None:
                    self._send_snapshot(router, item, rank)
                if router is not None:
                    self._serve_router(router, replay_buffer)
        except Exception:  # the engine must never see this thread's failures
            logger.exception("KV-cache event sender stopped")
        finally:
            linger_ms = 0 if self._abandon else 200
            pub.close(linger=linger_ms)
            if router is not None:
                router.close(linger=linger_ms)

    def _send_snapshot(self, router: Any, job: _SnapshotJob, rank: int | None) -> None:
        if job.snapshot is None:
            frames = [SNAPSHOT_REPLY, END_OF_REPLAY, b""]
        else:
            payload = self._encoder.encode(
                snapshot_events(job.snapshot.stored),
                timestamp_s=job.timestamp_s,
                data_parallel_rank=rank,
            )
            frames = [SNAPSHOT_REPLY, encode_seq(job.snapshot.next_seq), payload]
        for identity in job.identities:
            router.send_multipart([identity, b"", *frames], copy=False)

    def _serve_router(
        self, router: Any, replay_buffer: collections.deque[tuple[int, bytes, bytes]]
    ) -> None:
        zmq = self._zmq
        while router.poll(0, zmq.POLLIN):
            frames = router.recv_multipart()
            identity, request = frames[0], frames[-1]
            if request == SNAPSHOT_REQUEST:
                self._num_snapshot_requests += 1
                self._snapshot_waiters.append(identity)
                continue
            self._num_replay_requests += 1
            if len(request) == _SEQ_BYTES:
                start_seq = int.from_bytes(request, "big")
                for seq, seq_frame, payload in replay_buffer:
                    if seq >= start_seq:
                        router.send_multipart(
                            [identity, b"", self._topic, seq_frame, payload], copy=False
                        )
            else:
                logger.warning("ignoring a malformed replay request: %r", frames[1:])
            router.send_multipart([identity, b"", b"", END_OF_REPLAY, b""])
