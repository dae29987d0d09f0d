"""The index service: follow many publishers' ZeroMQ event streams into a cluster index.

One :class:`~pagedkv.events.transport.Subscriber` (gap repair by replay and snapshot)
drives an :class:`~pagedkv.cluster.ingest.IndexIngest`. After every poll the service
reconciles each publisher's sync state with the index (a publisher that lost events for
good is cleared and marked ``rebuilding``; ``synced`` again after a snapshot) and, every
``heal_every_s``, lets the ingest rewrite an index that lost its entries (Redis down or
restarted). ``pagedkv index serve`` runs :meth:`IndexService.run` until SIGTERM/SIGINT.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from pagedkv.arg_types import check_fields
from pagedkv.checks import check_number
from pagedkv.cli_args import MAX_SECONDS
from pagedkv.cluster.index import ClusterIndex, Replica
from pagedkv.cluster.ingest import IndexIngest
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.transport import Subscriber

__all__ = ["IndexService", "PublisherStats", "ServiceStats", "SourceSpec", "parse_source"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceSpec:
    """One publisher to follow: its pod name, PUB endpoint and optional replay (ROUTER)
    endpoint."""

    pod: str
    endpoint: str
    replay_endpoint: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)  # types, finiteness, 64-bit and duration bounds


def parse_source(text: str) -> SourceSpec:
    """Parse ``[POD=]ENDPOINT[,replay=ENDPOINT]``; the pod defaults to the endpoint's
    ``host:port``.

    >>> parse_source("vllm-0=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558")
    SourceSpec(pod='vllm-0', endpoint='tcp://10.0.0.5:5557', replay_endpoint='tcp://10.0.0.5:5558')
    >>> parse_source("tcp://127.0.0.1:5557").pod
    '127.0.0.1:5557'
    """
    head, *options = text.split(",")
    pod, sep, endpoint = head.partition("=")
    if not sep:
        pod, endpoint = "", head
    if "://" not in endpoint:
        raise InvalidArgumentError(
            f"--subscribe {text!r}: expected [POD=]tcp://HOST:PORT[,replay=tcp://HOST:PORT]"
        )
    replay = None
    for option in options:
        key, _, value = option.partition("=")
        if key != "replay" or "://" not in value:
            raise InvalidArgumentError(f"--subscribe {text!r}: unknown option {option!r}")
        replay = value
    pod = pod or endpoint.split("://", 1)[1]
    Replica(pod=pod)  # validates the name
    return SourceSpec(pod=pod, endpoint=endpoint, replay_endpoint=replay)


@dataclass(frozen=True, slots=True, kw_only=True)
class PublisherStats:
    """One followed publisher, for metrics: whether it is in step, the blocks the index
    holds for it, and its stream's gaps, lost batches, replay and snapshot requests
    (resyncs) and undecodable messages so far."""

    publisher: str
    pod: str
    synced: bool
    blocks: int
    gaps: int
    lost_batches: int
    replay_requests: int
    snapshots: int
    bad_messages: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceStats:
    """The service's figures at one moment (:meth:`IndexService.stats`): per publisher,
    and event batches and block events ingested, index writes that failed, and whether
    the index is in step (``index_available``)."""

    publishers: tuple[PublisherStats, ...]
    batches: int
    block_events: int
    index_write_failures: int
    index_available: bool


class IndexService:
    """Ingest from ``sources`` into ``index`` (module docstring). Close with :meth:`close`.

    ``lease_ttl_s``: each replica is written under a writer lease
    (:class:`~pagedkv.cluster.ingest.IndexIngest`), renewed every ``heal_every_s``; a
    second service following the same pod stands by and takes over within
    ``lease_ttl_s`` when the writer dies (at once when it closes). None: no leases.

    Raises InvalidArgumentError for an endpoint ZeroMQ rejects or a pod named twice;
    MissingDependencyError without the ``events`` extra.
    """

    def __init__(
        self,
        index: ClusterIndex,
        sources: Sequence[SourceSpec],
        *,
        request_timeout_s: float = 1.0,
        heal_every_s: float = 0.5,
        rcvhwm: int = 100_000,
        rcvbuf_bytes: int | None = None,
        lease_ttl_s: float | None = 5.0,
    ) -> None:
        check_number("heal_every_s", heal_every_s, minimum=0, maximum=MAX_SECONDS)
        if lease_ttl_s is not None and not lease_ttl_s > heal_every_s:
            raise InvalidArgumentError(
                f"lease_ttl_s ({lease_ttl_s}) must exceed heal_every_s ({heal_every_s}): "
                "the lease is renewed at every heal")
        self.index = index
        self.ingest = IndexIngest(index, replica_of=self._replica_of, lease_ttl_s=lease_ttl_s)
        self.subscriber = Subscriber(
            self.ingest, request_timeout_s=request_timeout_s, rcvhwm=rcvhwm,
            rcvbuf_bytes=rcvbuf_bytes,
        )
        self._sources = list(sources)
        # Publisher ids: the pod name, suffixed for a pod's further endpoints (vLLM
        # publishes each DP rank on its own port; the rank comes from the payloads).
        self._pod_of: dict[str, str] = {}
        self._synced: dict[str, bool | None] = {}
        self._heal_every_s = heal_every_s
        self._next_heal_s = 0.0
        self.started_s = time.monotonic()
        seen: set[tuple[str, str]] = set()
        try:
            for source in self._sources:
                if (source.pod, source.endpoint) in seen:
                    raise InvalidArgumentError(
                        f"{source.pod}={source.endpoint} is subscribed twice")
                seen.add((source.pod, source.endpoint))
                publisher_id = source.pod
                n = 1
                while publisher_id in self._pod_of:
                    publisher_id = f"{source.pod}#{n}"
                    n += 1
                self._pod_of[publisher_id] = source.pod
                self._synced[publisher_id] = None
                self.subscriber.add_publisher(
                    publisher_id, source.endpoint, replay_endpoint=source.replay_endpoint
                )
        except BaseException:  # e.g. an endpoint ZeroMQ rejects: InvalidArgumentError
            self.close()
            raise

    def _replica_of(self, publisher_id: str) -> Replica:
        return Replica(pod=self._pod_of[publisher_id],
                       dp_rank=self.subscriber.data_parallel_rank(publisher_id))

    def step(self, timeout_s: float = 0.05) -> int:
        """Poll once (waiting up to ``timeout_s``), reconcile sync states, heal when due.
        Returns the batches applied."""
        applied = self.subscriber.poll(timeout_s)
        for pod, was in self._synced.items():
            status = self.subscriber.status(pod)
            if status.synced and was is not True:
                self.ingest.mark_synced(pod)
                self._synced[pod] = True
            elif not status.synced and not status.repairing and was is not False:
                # After being in step, lost events may have removed blocks: clear. Joined
                # mid-stream: everything held came from what followed, nothing to clear.
                self.ingest.mark_rebuilding(pod, clear=bool(was))
                self._synced[pod] = False
        now = time.monotonic()
        if now >= self._next_heal_s:
            self.ingest.heal()
            self._next_heal_s = now + self._heal_every_s
        return applied

    def run(
        self,
        *,
        should_stop: Callable[[], bool],
        status_every_s: float,
        stream: TextIO,
        max_seconds: float | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> None:
        """Step until ``should_stop()`` (or ``max_seconds``), writing :meth:`status_line`
        to ``stream`` every ``status_every_s`` seconds and once at the end; ``on_step``
        is called after every step (e.g. a metrics exporter taking :meth:`stats`)."""
        next_status = time.monotonic() + status_every_s
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while not should_stop():
            self.step(0.05)
            if on_step is not None:
                on_step()
            now = time.monotonic()
            if now >= next_status:
                print(self.status_line(), file=stream, flush=True)
                next_status = now + status_every_s
            if deadline is not None and now >= deadline:
                break
        print(self.status_line(), file=stream, flush=True)

    def stats(self) -> ServiceStats:
        """The service's figures now (for metrics). O(publishers)."""
        ingest = self.ingest
        publishers = []
        for publisher, pod in self._pod_of.items():
            st = self.subscriber.status(publisher)
            publishers.append(PublisherStats(
                publisher=publisher, pod=pod, synced=bool(st.synced),
                blocks=ingest.num_blocks(publisher), gaps=st.num_gaps,
                lost_batches=self.subscriber.num_lost_batches(publisher),
                replay_requests=st.num_replay_requests, snapshots=st.num_snapshots,
                bad_messages=st.num_bad_messages))
        return ServiceStats(publishers=tuple(publishers), batches=ingest.num_batches,
                            block_events=ingest.num_block_events,
                            index_write_failures=ingest.num_index_failures,
                            index_available=not ingest.dirty)

    def status_line(self) -> str:
        """One line: replicas and their sync, blocks, batches and rate, repairs, index."""
        statuses = [self.subscriber.status(p) for p in self._pod_of]
        ingest = self.ingest
        elapsed = max(time.monotonic() - self.started_s, 1e-9)
        synced = sum(1 for s in statuses if s.synced)
        blocks = sum(ingest.num_blocks(p) for p in self._pod_of)
        return (
            f"index {self.index.model}: {len(statuses)} publisher"
            f"{'' if len(statuses) == 1 else 's'} ({synced} synced), "
            f"{blocks} blocks, {ingest.num_batches} batches, "
            f"{ingest.num_block_events / elapsed:.0f} block events/s (mean), "
            f"gaps {sum(s.num_gaps for s in statuses)} "
            f"({sum(self.subscriber.num_lost_batches(p) for p in self._pod_of)} batches), "
            f"replays {sum(s.num_replay_requests for s in statuses)}, "
            f"snapshots {sum(s.num_snapshots for s in statuses)}, "
            f"bad {sum(s.num_bad_messages for s in statuses)}, "
            + (f"standby {ingest.num_standby_replicas} (another ingest writes them), "
               if ingest.num_standby_replicas else "")
            + f"index {'UNAVAILABLE' if ingest.dirty else 'ok'}"
        )

    def close(self) -> None:
        """Close the sockets and end the writer leases (the index stays open: its owner
        closes it). Idempotent."""
        self.subscriber.close()
        self.ingest.close()
