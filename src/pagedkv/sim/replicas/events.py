"""Where each replica's KV-cache events go in a multi-replica run: the index the router
reads (cache-aware routing, in this process) and the one ZeroMQ endpoint of
``--kv-events-endpoint``, each batch tagged with its replica's data-parallel rank.

vLLM's data-parallel engines each tag their payloads ``[timestamp, [events], dp_rank]``;
here every replica publishes through one :class:`~pagedkv.events.publisher.ZmqEventPublisher`
(one PUB socket, one sequence of batch numbers, one replay buffer), the batch of replica
``k`` tagged with rank ``base + k`` (``base``: the config's rank, 0 by default). One
replica publishes exactly what ``simulate`` publishes: the same batches, the same rank,
and snapshots of its prefix index. With several replicas a snapshot request is answered
"no snapshot" (a snapshot payload names one rank); replay requests are served.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pagedkv.core.components import EventPublisher
from pagedkv.events.config import KVEventsConfig

__all__ = ["ReplicaFeed", "SharedEvents"]


class SharedEvents:
    """The one publisher of a multi-replica run, built from the user's ``config``
    (``snapshot_fn``: the prefix index to answer snapshots with; None: "no snapshot").
    Close it once every replica has published its last step.

    Raises:
        MissingDependencyError: pyzmq or msgpack is not installed.
        ConfigError: the endpoint cannot be bound or connected.
    """

    def __init__(self, config: KVEventsConfig,
                 snapshot_fn: Callable[[], list[Any]] | None) -> None:
        from pagedkv.events.publisher import ZmqEventPublisher

        self.publisher = ZmqEventPublisher(config, snapshot_fn=snapshot_fn)
        self.base_rank = config.data_parallel_rank or 0

    def close(self) -> None:
        """Send what is queued and close the sockets. Idempotent."""
        self.publisher.close()


class _ReplicaPublisher:
    """A replica's publisher: each step's events into the router's index (if any) and
    onto the shared endpoint (if any) under the replica's rank."""

    def __init__(self, feed: ReplicaFeed) -> None:
        self.index = feed.index
        self.replica = feed.replica
        self.shared: SharedEvents | None = feed.shared
        self.rank = feed.rank

    @property
    def stats(self) -> Any:
        """The shared publisher's counters (None without an endpoint)."""
        return None if self.shared is None else self.shared.publisher.stats

    def publish(self, events: Sequence[Any]) -> object:
        if events and self.index is not None:
            self.index.apply(self.replica, events)
        if self.shared is not None:  # also empty steps: they serve snapshot requests
            return self.shared.publisher.publish_as(events, self.rank)
        return None

    def close(self) -> None:
        return None  # the shared publisher is closed by the run, after every replica


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplicaFeed(KVEventsConfig):
    """The events config of ``replica``: into ``index`` (the
    :class:`~pagedkv.sim.replicas.live_index.LiveIndex` the router reads, or None) and
    onto ``shared`` (or None) as data-parallel rank ``rank``."""

    replica: Any = None
    rank: int = 0
    index: Any = field(default=None, compare=False, repr=False)
    shared: Any = field(default=None, compare=False, repr=False)

    def make_publisher(self, snapshot_fn: Callable[[], Any]) -> EventPublisher:
        return _ReplicaPublisher(self)
