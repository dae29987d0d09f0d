"""Miss attribution and Prometheus metrics inside an engine replay (``pagedkv simulate
--explain-misses`` / ``--metrics-port``).

A :class:`ReplayObserver` wraps the simulator's manager factory so the replay runs on an
:class:`~pagedkv.observe.Observer` component whose clock is the simulator's clock.
Every engine step (the engine calls ``new_step_starts()``) starts a step of the ghost
record; every ``interval_s`` of simulated time closes an interval of missed tokens by
reason (``make_miss_stats``) and, with an exporter, records it for Prometheus. At the end
:meth:`ReplayObserver.breakdown` folds the intervals into bars for the plot and says in
one line what the misses mean. Without an observer the simulator builds the plain manager
and pays nothing.

>>> from pagedkv.sim import SimConfig, run, system_prompts
>>> obs = ReplayObserver()
>>> report = run(system_prompts(num_groups=2, questions_per_group=4),
...              SimConfig(num_blocks=2000, jobs=1, bounds=False), observer=obs)
>>> b = obs.breakdown()
>>> b.total.queries == b.total.hits + sum(b.total.missed_tokens.values())
True
>>> b.total.hits == report.hit_tokens
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedkv.core.components import ManagerBuild
from pagedkv.core.manager import KVCacheManager
from pagedkv.core.request import RequestLike
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.config import KVEventsConfig
from pagedkv.observe.observer import ObserveConfig, Observer, _MissCounters
from pagedkv.observe.reasons import LookupExplanation, MissStats, Reason
from pagedkv.sim.observe_support import merge_miss_stats, miss_table, render_miss_table
from pagedkv.sim.scheduler import ManagerFactory
from pagedkv.sim.workloads import Workload

if TYPE_CHECKING:
    from pagedkv.observe.prometheus import PrometheusExporter
    from pagedkv.sim.engine import EngineSimulator

__all__ = ["MissBreakdown", "ReplayObserver", "interpret", "merged_breakdown"]

#: Fine intervals per replay before they are folded into bars.
_FINE_INTERVALS = 400


class _ReplayObserve(Observer):
    """Attribution driven by an engine replay (the observer's hooks): a lookup counts for
    the breakdown once its request is admitted with it (a request blocked for room looks
    up again later), as the simulator's hit rate counts it."""

    def __init__(self, config: ObserveConfig, build: ManagerBuild,
                 observer: ReplayObserver) -> None:
        super().__init__(config, build)
        self.observer = observer
        self._pending: tuple[RequestLike, LookupExplanation] | None = None

    def step_started(self) -> None:
        self.begin_step()
        self.observer.step_started()

    def observe_lookup(self, request: RequestLike, explanation: LookupExplanation) -> None:
        super().observe_lookup(request, explanation)
        self._pending = (request, explanation)

    def after_allocate(self, request: RequestLike, hit: object,
                       new: tuple[list[int], ...] | None) -> None:
        pending = self._pending
        if pending is not None and pending[0] is request:
            self._pending = None
            if new is not None:
                self.observer.lookup_admitted(request, pending[1])


@dataclass(frozen=True)
class _ReplayObserveSpec:
    """The component spec of :class:`_ReplayObserve` (``CacheConfig.observe``)."""

    config: ObserveConfig
    observer: ReplayObserver

    def attach(self, build: ManagerBuild) -> _ReplayObserve:
        return _ReplayObserve(self.config, build, self.observer)


class ReplayObserver:
    """Observes one engine replay (module docstring).

    ``exporter``: a :class:`~pagedkv.observe.prometheus.PrometheusExporter` to record every
    interval into (its server is the caller's). ``residency_sample_every``: residency
    sampling for the exporter's histograms (None: off; forced off with retention).
    ``num_bars``: bars of the missed-tokens plot. ``ghost_entries``: evictions remembered
    to tell *evicted* from *never seen* (about 270 bytes each with SHA-256 hashes; the
    default 1,000,000 covers several minutes of a busy 80 GB cache).

    Raises:
        InvalidArgumentError: ``num_bars`` below 1.
    """

    def __init__(self, *, exporter: PrometheusExporter | None = None,
                 residency_sample_every: int | None = None, num_bars: int = 40,
                 ghost_entries: int = 1_000_000) -> None:
        if num_bars < 1:
            raise InvalidArgumentError(f"num_bars must be >= 1, got {num_bars}")
        if ghost_entries < 0:
            raise InvalidArgumentError(f"ghost_entries must be >= 0, got {ghost_entries}")
        self.ghost_entries = ghost_entries
        self.exporter = exporter
        self.residency_sample_every = residency_sample_every
        self.num_bars = num_bars
        self.manager: KVCacheManager | None = None
        self.observe: _ReplayObserve | None = None
        self._sim: EngineSimulator | None = None
        self._interval_s = 1.0
        self._next_s = 1.0
        self._fine: list[tuple[float, MissStats]] = []
        self._counters = _MissCounters()
        #: (seconds from eviction to the lookup that missed it, tokens) per evicted run.
        self._gaps: list[tuple[float, int]] = []
        self._finished_at: float | None = None

    # ------------------------------------------------------------------ wiring

    def now_s(self) -> float:
        """The simulator's clock (0 before :meth:`attach`)."""
        return self._sim.now_s if self._sim is not None else 0.0

    def wrap(self, factory: ManagerFactory) -> ManagerFactory:
        """A factory building what ``factory`` builds, as an observed manager."""

        def build(workload: Workload, *, block_size: int, num_blocks: int,
                  kv_events: KVEventsConfig | None = None) -> KVCacheManager:
            plain = factory(workload, block_size=block_size, num_blocks=num_blocks)
            config = dataclasses.replace(plain.config, kv_events=kv_events)
            oc = ObserveConfig(clock=self.now_s, residency_sample_every=self.residency_sample_every,
                               ghost_entries=self.ghost_entries)
            self.manager = KVCacheManager(
                dataclasses.replace(config, observe=_ReplayObserveSpec(oc, self)))
            self.observe = self.manager.component(_ReplayObserve)
            span = max((r.arrival_s for r in workload.requests), default=0.0)
            self._interval_s = self._next_s = max(span, 1.0) / _FINE_INTERVALS
            return self.manager

        return build

    def attach(self, sim: EngineSimulator) -> None:
        """Read the clock of ``sim`` (built with :meth:`wrap`'s factory)."""
        self._sim = sim

    # ------------------------------------------------------------------ hooks

    def step_started(self) -> None:
        if self.now_s() >= self._next_s:
            self._close_interval()

    def lookup_admitted(self, request: RequestLike, e: LookupExplanation) -> None:
        preempted = bool(request.num_preemptions)
        self._counters.add(e, preempted)
        if preempted:
            return
        now = self.now_s()
        for s in e.segments:
            if s.eviction is not None:
                self._gaps.append((now - s.eviction.time_s, s.end - s.start))

    def _close_interval(self) -> None:
        mgr, obs = self.manager, self.observe
        assert mgr is not None and obs is not None
        now = self.now_s()
        self._fine.append((now, self._counters.value()))
        self._counters = _MissCounters()
        while self._next_s <= now:
            self._next_s += self._interval_s
        if self.exporter is not None:
            stats = getattr(mgr.publisher, "stats", None)
            dropped = stats.num_dropped_batches if stats is not None else 0
            self.exporter.record_interval(
                mgr.make_prefix_cache_stats(), usage=mgr.usage,
                evicted_blocks_total=mgr.num_evicted_blocks, dropped_batches_total=dropped,
                misses=obs.make_miss_stats(), residency=obs.drain_residency())

    # ------------------------------------------------------------------ results

    def breakdown(self) -> MissBreakdown:
        """Missed tokens by reason over the replay (closes the last interval).

        Raises:
            InvalidArgumentError: the observer's factory never built a manager (no replay).
        """
        return merged_breakdown([self])

    def _finish(self) -> None:
        """Close the last interval, once per point in simulated time."""
        if self.observe is None:
            raise InvalidArgumentError("no replay was observed: pass the observer to "
                                       "pagedkv.sim.run(..., observer=...)")
        if self._finished_at != self.now_s():
            self._close_interval()
            self._finished_at = self.now_s()


def merged_breakdown(observers: Sequence[ReplayObserver]) -> MissBreakdown:
    """The missed tokens by reason of several replays on one clock (the replicas of one
    multi-replica run) as one breakdown: their intervals in the same bars up to the
    latest replay's end, their totals and eviction gaps summed. One observer's is its
    :meth:`ReplayObserver.breakdown`.

    Raises:
        InvalidArgumentError: no observers, or one never built a manager (no replay).
    """
    if not observers:
        raise InvalidArgumentError("merged_breakdown needs at least one observer")
    for o in observers:
        o._finish()
    first = observers[0]
    fine = [x for o in observers for x in o._fine]
    end = max(max(o.now_s() for o in observers), 1e-9)
    width = end / first.num_bars
    bars: list[list[MissStats]] = [[] for _ in range(first.num_bars)]
    for t, s in fine:
        bars[min(int(t / width - 1e-9), first.num_bars - 1)].append(s)
    series = tuple(((k + 1) * width, merge_miss_stats(b)) for k, b in enumerate(bars))
    total = merge_miss_stats(s for _, s in fine)
    return MissBreakdown(total=total, series=series,
                         eviction_gaps=tuple(sorted(g for o in observers for g in o._gaps)),
                         ghost_entries=first.ghost_entries,
                         forgotten_evictions=sum(o.observe.ghost.num_forgotten
                                                 for o in observers if o.observe))


@dataclass(frozen=True, slots=True, kw_only=True)
class MissBreakdown:
    """Missed prompt tokens by reason over a replay: the total (the lookup each request
    was admitted with, as the simulator's hit rate; re-lookups after preemption apart),
    ``series`` of ``(interval end s, stats)`` bars, and the ``(gap s, tokens)`` of every
    evicted run a lookup missed, sorted by gap. ``forgotten_evictions``: evictions the
    ghost record (``ghost_entries``) dropped; misses on them read ``never_seen``."""

    total: MissStats
    series: tuple[tuple[float, MissStats], ...]
    eviction_gaps: tuple[tuple[float, int], ...]
    ghost_entries: int = 0
    forgotten_evictions: int = 0

    def table(self) -> str:
        """The miss table (:func:`~pagedkv.sim.observe_support.render_miss_table`)."""
        return render_miss_table(miss_table([self.total]))

    def interpretation(self) -> str:
        """One line on what the misses mean (:func:`interpret`)."""
        line = interpret(self.total, self.eviction_gaps)
        if self.forgotten_evictions:
            line += (f". Note: the ghost record keeps the last {self.ghost_entries:,} "
                     f"evictions and forgot {self.forgotten_evictions:,} older ones; a miss "
                     "on those reads never_seen (raise --ghost-entries to tell them apart)")
        return line

    def to_dict(self) -> dict[str, Any]:
        t = self.total
        return {
            "queried_tokens": t.queries, "hit_tokens": t.hits,
            "missed_tokens": dict(sorted(t.missed_tokens.items(), key=lambda kv: -kv[1])),
            "preempted_relookup_missed_tokens": dict(t.preempted_missed_tokens),
            "eviction_gap_s_p50": _weighted_quantile(self.eviction_gaps, 0.5),
            "eviction_gap_s_p90": _weighted_quantile(self.eviction_gaps, 0.9),
            "ghost_entries": self.ghost_entries,
            "forgotten_evictions": self.forgotten_evictions,
            "interpretation": self.interpretation(),
            "intervals": [{"end_s": end, "hit_tokens": s.hits,
                           "missed_tokens": dict(s.missed_tokens)} for end, s in self.series],
        }


def _weighted_quantile(gaps: Sequence[tuple[float, int]], q: float) -> float | None:
    """The token-weighted ``q`` quantile of sorted ``(gap, tokens)`` pairs."""
    total = sum(n for _, n in gaps)
    if not total:
        return None
    acc = 0
    for gap, n in gaps:
        acc += n
        if acc >= q * total:
            return gap
    return gaps[-1][0]


def _seconds(x: float) -> str:
    return f"{x:.1f} s" if x < 10 else f"{x:.0f} s"


def interpret(total: MissStats, eviction_gaps: Sequence[tuple[float, int]] = ()) -> str:
    """One line on what the misses of ``total`` mean, largest causes first.

    >>> s = MissStats(requests=3, queries=1000, hits=200, missed_tokens={"evicted": 304,
    ...     "never_seen": 480, "partial_block": 16}, preempted_requests=0,
    ...     preempted_queries=0, preempted_hits=0, preempted_missed_tokens={})
    >>> import textwrap
    >>> print(textwrap.fill(interpret(s, [(12.0, 200), (30.0, 104)]), 88))
    80.0 % of prompt tokens missed: 60 % of the misses were never seen before (new content;
    no cache size helps), 38 % were evictions of blocks that came back within 12 s (median;
    90 % within 30 s) — more KV memory or a host tier would turn these into hits
    """
    missed = sum(total.missed_tokens.values())
    if not total.queries:
        return "no lookups"
    if not missed:
        return "every prompt token hit"
    parts: list[str] = []
    for label, n in sorted(total.missed_tokens.items(), key=lambda kv: -kv[1])[:2]:
        share = f"{100 * n / missed:.0f} %"
        lead = "of the misses were " if not parts else "were "
        parts.append(share + " " + lead + _meaning(label, eviction_gaps))
    return (f"{100 * missed / total.queries:.1f} % of prompt tokens missed: "
            + ", ".join(parts))


def _meaning(label: str, gaps: Sequence[tuple[float, int]]) -> str:
    if label == Reason.EVICTED.value:
        p50 = _weighted_quantile(gaps, 0.5)
        p90 = _weighted_quantile(gaps, 0.9)
        when = (f" that came back within {_seconds(p50)} (median; 90 % within "
                f"{_seconds(p90)})" if p50 is not None and p90 is not None else "")
        return (f"evictions of blocks{when} — more KV memory or a host tier would turn "
                "these into hits")
    return {
        "never_seen": "never seen before (new content; no cache size helps)",
        "partial_block": "the partial last block of a prompt (shorter than one block)",
        "hit_cap": "the last prompt token recomputed (the hit cap)",
        "isolated": "cached under another cache salt / LoRA / multimodal key",
        "caching_off": "not looked up (prefix caching off)",
        "clamped_lcm_alignment": "lost to the hybrid hit rounding to the lcm of block sizes",
        "clamped_window_run_not_found": "lost because a sliding-window group had no "
                                        "cached run covering its window",
        "clamped_chunk_run_not_found": "lost because a chunked-local group missed a block "
                                       "of its chunk",
        "clamped_no_mamba_state": "lost because no Mamba state was cached at that boundary",
        "clamped_not_cacheable": "lost to a group that never caches",
    }.get(label, label)
