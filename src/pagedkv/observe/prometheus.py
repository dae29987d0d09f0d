"""A Prometheus exporter for a KV-cache manager (needs the ``metrics`` extra:
``pip install 'pagedkv[metrics]'``).

Metric names follow vLLM's where vLLM has one (namespace ``pagedkv`` instead of ``vllm:``),
and pagedkv's own otherwise:

=================================================  =========  ===========================
name                                               type       from
=================================================  =========  ===========================
``pagedkv_prefix_cache_requests_total``            counter    fresh lookups
``pagedkv_prefix_cache_queries_total``             counter    tokens looked up (fresh)
``pagedkv_prefix_cache_hits_total``                counter    tokens hit (fresh)
``pagedkv_prefix_cache_preempted_queries_total``   counter    re-lookups after preemption
``pagedkv_prefix_cache_preempted_hits_total``      counter    their hit tokens
``pagedkv_kv_cache_usage_perc``                    gauge      fraction of blocks in use
``pagedkv_kv_cache_evicted_blocks_total``          counter    cached blocks evicted
``pagedkv_kv_events_dropped_batches_total``        counter    event batches the publisher
                                                              dropped (queue full)
``pagedkv_prefix_cache_missed_tokens_total``       counter    missed tokens, label
                                                              ``reason`` (observed manager)
``pagedkv_prefix_cache_preempted_missed_tokens_    counter    the same for re-lookups
total``
``pagedkv_kv_block_lifetime_seconds``              histogram  sampled residency (vLLM's
``pagedkv_kv_block_idle_before_evict_seconds``                definitions and buckets,
``pagedkv_kv_block_reuse_gap_seconds``                        ``pagedkv.observe.residency``)
=================================================  =========  ===========================

The server listens on 127.0.0.1 only, on its own registry (never the process-global one).

Usage, once per scheduler step or stats interval::

    exporter = PrometheusExporter()
    port = exporter.serve(9400)
    ...
    exporter.record(mgr)   # takes mgr's intervals: make_prefix_cache_stats() etc.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pagedkv.errors import InvalidArgumentError, require
from pagedkv.observe.metrics_endpoint import MetricsEndpoint

if TYPE_CHECKING:
    from pagedkv.core.manager import KVCacheManager
    from pagedkv.core.metrics import PrefixCacheStats
    from pagedkv.observe.reasons import MissStats
    from pagedkv.observe.residency import ResidencySample

__all__ = ["RESIDENCY_BUCKETS_S", "PrometheusExporter"]

#: Histogram buckets of block residency times in seconds (vLLM 0.33's: millisecond reuse
#: gaps up to 30-minute lifetimes).
RESIDENCY_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
)


class PrometheusExporter(MetricsEndpoint):
    """Prometheus metrics of one manager (module docstring).

    Raises:
        MissingDependencyError: ``prometheus_client`` is not installed.
    """

    def __init__(self, *, namespace: str = "pagedkv",
                 residency_buckets_s: Iterable[float] = RESIDENCY_BUCKETS_S) -> None:
        prom: Any = require("prometheus_client", "metrics", "the Prometheus exporter")
        super().__init__(prom)
        reg = self.registry
        ns = namespace

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return prom.Counter(name, doc, labels, namespace=ns, registry=reg)

        def histogram(name: str, doc: str) -> Any:
            return prom.Histogram(name, doc, namespace=ns, registry=reg,
                                  buckets=tuple(residency_buckets_s))

        self.requests = counter("prefix_cache_requests", "Prefix-cache lookups (fresh).")
        self.queries = counter("prefix_cache_queries",
                               "Prefix-cache queried tokens (fresh lookups).")
        self.hits = counter("prefix_cache_hits", "Prefix-cache hit tokens (fresh lookups).")
        self.preempted_queries = counter(
            "prefix_cache_preempted_queries",
            "Tokens re-looked-up by preempted requests (not counted as queries).")
        self.preempted_hits = counter("prefix_cache_preempted_hits",
                                      "Hit tokens of preempted re-lookups.")
        self.usage = prom.Gauge("kv_cache_usage_perc",
                                "KV-cache usage: 1 means every block is in use.",
                                namespace=ns, registry=reg)
        self.evicted = counter("kv_cache_evicted_blocks", "Cached blocks evicted.")
        self.dropped = counter("kv_events_dropped_batches",
                               "KV-cache event batches dropped because the queue was full.")
        self.missed = counter("prefix_cache_missed_tokens",
                              "Missed prompt tokens of fresh lookups by reason.", ("reason",))
        self.preempted_missed = counter(
            "prefix_cache_preempted_missed_tokens",
            "Missed prompt tokens of preempted re-lookups by reason.", ("reason",))
        self.lifetime = histogram("kv_block_lifetime_seconds",
                                  "Sampled block lifetime from allocation to eviction.")
        self.idle = histogram("kv_block_idle_before_evict_seconds",
                              "Sampled block idle time before eviction.")
        self.reuse_gap = histogram("kv_block_reuse_gap_seconds",
                                   "Sampled time between consecutive hits on a block.")
        self._last_evicted = 0
        self._last_dropped = 0

    # ------------------------------------------------------------------ recording

    def record_interval(
        self,
        stats: PrefixCacheStats,
        *,
        usage: float,
        evicted_blocks_total: int,
        dropped_batches_total: int = 0,
        misses: MissStats | None = None,
        residency: Iterable[ResidencySample] = (),
    ) -> None:
        """Add one interval: lookup counters, miss counters by reason, residency samples;
        set the usage gauge; move the eviction and drop counters to the given totals."""
        self.requests.inc(stats.requests)
        self.queries.inc(stats.queries)
        self.hits.inc(stats.hits)
        self.preempted_queries.inc(stats.preempted_queries)
        self.preempted_hits.inc(stats.preempted_hits)
        self.usage.set(usage)
        if evicted_blocks_total > self._last_evicted:
            self.evicted.inc(evicted_blocks_total - self._last_evicted)
            self._last_evicted = evicted_blocks_total
        if dropped_batches_total > self._last_dropped:
            self.dropped.inc(dropped_batches_total - self._last_dropped)
            self._last_dropped = dropped_batches_total
        if misses is not None:
            _add_by_label(self.missed, misses.missed_tokens)
            _add_by_label(self.preempted_missed, misses.preempted_missed_tokens)
        for s in residency:
            self.lifetime.observe(s.lifetime_s)
            self.idle.observe(s.idle_before_evict_s)
            for gap in s.reuse_gaps_s:
                self.reuse_gap.observe(gap)

    def record(self, mgr: KVCacheManager) -> None:
        """Take ``mgr``'s current intervals (``make_prefix_cache_stats``, and for an
        observed manager ``make_miss_stats`` and ``drain_residency``) and record them.

        Raises:
            InvalidArgumentError: ``mgr`` is not a KVCacheManager (nothing recorded).
        """
        from pagedkv.core.manager import KVCacheManager

        if not isinstance(mgr, KVCacheManager):
            raise InvalidArgumentError(f"record() takes a KVCacheManager, got "
                                       f"{type(mgr).__name__}")
        misses = None
        residency: list[ResidencySample] = []
        if mgr.observe is not None:
            misses = mgr.observe.make_miss_stats()
            residency = mgr.observe.drain_residency()
        publisher = mgr.publisher
        stats = getattr(publisher, "stats", None)
        dropped = stats.num_dropped_batches if stats is not None else 0
        self.record_interval(mgr.make_prefix_cache_stats(), usage=mgr.usage,
                             evicted_blocks_total=mgr.num_evicted_blocks,
                             dropped_batches_total=dropped, misses=misses,
                             residency=residency)


def _add_by_label(counter: Any, values: Mapping[str, int]) -> None:
    for label, n in values.items():
        if n:
            counter.labels(reason=label).inc(n)
