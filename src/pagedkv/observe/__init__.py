"""Observability: why a lookup missed, how long blocks live, Prometheus metrics.

* :class:`ObservedKVCacheManager` — the manager with ``explain_lookup``,
  ``make_miss_stats`` and sampled block residency (see ``docs/observability.md``);
* :mod:`pagedkv.observe.prometheus` — an exporter (needs the ``metrics`` extra);
* :mod:`pagedkv.sim.observe_support` — miss tables and plots for a replay.
"""

from pagedkv.observe.observer import ObserveConfig, ObservedKVCacheManager, Observer
from pagedkv.observe.reasons import (
    BlockExplanation,
    BlockRun,
    ClampCause,
    EvictionRecord,
    GroupExplanation,
    LookupExplanation,
    MissStats,
    Reason,
    Segment,
)
from pagedkv.observe.residency import ResidencySample

__all__ = [
    "BlockExplanation",
    "BlockRun",
    "ClampCause",
    "EvictionRecord",
    "GroupExplanation",
    "LookupExplanation",
    "MissStats",
    "ObserveConfig",
    "ObservedKVCacheManager",
    "Observer",
    "Reason",
    "ResidencySample",
    "Segment",
]
