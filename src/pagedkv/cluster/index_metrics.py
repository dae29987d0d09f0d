"""Prometheus metrics of the cluster index service (``pagedkv index serve --metrics-port``;
needs the ``metrics`` extra: ``pip install 'pagedkv[metrics]'``).

The service's loop hands its figures (:meth:`pagedkv.cluster.service.IndexService.stats`)
to :meth:`IndexServiceExporter.update` at most every ``min_interval_s``; a scrape reads
the last figures handed over (a value swapped whole, so the HTTP thread never reads the
service's state while it changes).

=================================================  =========  ===========================
name                                               type       meaning
=================================================  =========  ===========================
``pagedkv_index_publishers``                       gauge      publishers followed
``pagedkv_index_publishers_synced``                gauge      ... in step with the index
``pagedkv_index_blocks``                           gauge      blocks indexed, label
                                                              ``publisher`` (index size)
``pagedkv_index_publisher_synced``                 gauge      1 in step, 0 rebuilding
``pagedkv_index_batches_ingested_total``           counter    event batches applied
``pagedkv_index_block_events_ingested_total``      counter    block stored/removed events
``pagedkv_index_gaps_total``                       counter    sequence gaps, ``publisher``
``pagedkv_index_lost_batches_total``               counter    batches lost for good
``pagedkv_index_replay_requests_total``            counter    replays asked (gap repair)
``pagedkv_index_snapshots_total``                  counter    snapshots taken (resyncs)
``pagedkv_index_bad_messages_total``               counter    undecodable messages
``pagedkv_index_write_failures_total``             counter    index writes that failed
``pagedkv_index_available``                        gauge      1 when the index is in step
=================================================  =========  ===========================
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pagedkv.errors import require
from pagedkv.observe.metrics_endpoint import MetricsEndpoint

if TYPE_CHECKING:
    from pagedkv.cluster.service import IndexService, ServiceStats

__all__ = ["IndexServiceExporter"]

_PER_PUBLISHER_COUNTERS = (
    ("gaps", "gaps", "Sequence gaps seen in the publisher's event stream."),
    ("lost_batches", "lost_batches", "Event batches lost for good (not replayed)."),
    ("replay_requests", "replay_requests", "Replays asked for to repair gaps."),
    ("snapshots", "snapshots", "Snapshots taken to resync with the publisher."),
    ("bad_messages", "bad_messages", "Messages that could not be decoded."),
)


class IndexServiceExporter(MetricsEndpoint):
    """Prometheus metrics of one index service (module docstring); its own registry,
    served on 127.0.0.1 only.

    Raises:
        MissingDependencyError: ``prometheus_client`` is not installed.
    """

    def __init__(self, *, namespace: str = "pagedkv_index",
                 min_interval_s: float = 0.5) -> None:
        prom: Any = require("prometheus_client", "metrics", "the index service's metrics")
        super().__init__(prom)
        self._core: Any = require("prometheus_client.core", "metrics",
                                  "the index service's metrics")
        self.namespace = namespace
        self.min_interval_s = min_interval_s
        self._stats: ServiceStats | None = None
        self._last_s = float("-inf")
        self.registry.register(self)

    def update(self, service: IndexService, *, force: bool = False) -> None:
        """Take ``service``'s figures (on the service's thread), unless the last ones are
        younger than ``min_interval_s`` (``force``: take them anyway)."""
        now = time.monotonic()
        if force or now - self._last_s >= self.min_interval_s:
            self._stats = service.stats()
            self._last_s = now

    def collect(self) -> Iterator[Any]:
        """The metric families of the last figures (prometheus_client's collector API)."""
        stats = self._stats
        if stats is None:
            return
        core = self._core
        ns = self.namespace
        pubs = stats.publishers
        yield core.GaugeMetricFamily(f"{ns}_publishers", "Publishers followed.", len(pubs))
        yield core.GaugeMetricFamily(f"{ns}_publishers_synced",
                                     "Publishers in step with the index.",
                                     sum(p.synced for p in pubs))
        blocks = core.GaugeMetricFamily(f"{ns}_blocks", "Blocks indexed for the publisher.",
                                        labels=["publisher", "pod"])
        synced = core.GaugeMetricFamily(f"{ns}_publisher_synced",
                                        "1 when the publisher is in step, else 0.",
                                        labels=["publisher", "pod"])
        for p in pubs:
            blocks.add_metric([p.publisher, p.pod], p.blocks)
            synced.add_metric([p.publisher, p.pod], int(p.synced))
        yield blocks
        yield synced
        for name, attr, doc in _PER_PUBLISHER_COUNTERS:
            family = core.CounterMetricFamily(f"{ns}_{name}", doc, labels=["publisher", "pod"])
            for p in pubs:
                family.add_metric([p.publisher, p.pod], getattr(p, attr))
            yield family
        yield core.CounterMetricFamily(f"{ns}_batches_ingested", "Event batches applied.",
                                       stats.batches)
        yield core.CounterMetricFamily(f"{ns}_block_events_ingested",
                                       "Block stored/removed events applied.",
                                       stats.block_events)
        yield core.CounterMetricFamily(f"{ns}_write_failures", "Index writes that failed.",
                                       stats.index_write_failures)
        yield core.GaugeMetricFamily(f"{ns}_available", "1 when the index is in step.",
                                     int(stats.index_available))
