"""Miss attribution as a component: :class:`Observer`, attached by
``CacheConfig(observe=ObserveConfig(...))`` and reachable as ``mgr.observe``. It says why a
lookup missed, aggregates missed tokens by reason per interval, and samples block
residency.

The plain manager has none of this and pays nothing. With it, the pool's recorder is
wrapped by a :class:`~pagedkv.observe.ghost.GhostRecorder` (composed with the event buffer
when events are on, and with any other component's recorder) and, with residency sampling,
a :class:`~pagedkv.observe.residency.ResidencyListener` listens to the pool. Block ids,
hits and evictions are identical to the plain manager's.

>>> from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
>>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
>>> mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=16, max_model_len=64,
...                                  observe=ObserveConfig()))
>>> a = mgr.new_request("a", list(range(10)))
>>> mgr.allocate_slots(a, 10, new_computed_blocks=mgr.get_computed_blocks(a)) is not None
True
>>> b = mgr.new_request("b", list(range(8)) + [99, 98, 97, 96, 95])
>>> [(s.start, s.end, s.label) for s in mgr.observe.explain_lookup(b).segments]
[(0, 8, 'hit'), (8, 12, 'never_seen'), (12, 13, 'partial_block')]
>>> mgr.get_computed_blocks(b).num_computed_tokens  # a and b counted
8
>>> mgr.observe.make_miss_stats().missed_tokens
{'never_seen': 12, 'partial_block': 3}
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pagedkv.checks import check_clock, check_whole
from pagedkv.core import validation
from pagedkv.core.components import ManagerBuild, ManagerComponent
from pagedkv.core.config import CacheConfig
from pagedkv.core.coordinator import ComputedBlocks
from pagedkv.core.hashing import BlockHasher
from pagedkv.core.manager import KVCacheManager
from pagedkv.core.request import RequestLike
from pagedkv.observe.attribution import Explainer
from pagedkv.observe.ghost import GhostRecorder
from pagedkv.observe.reasons import LookupExplanation, MissStats, Reason
from pagedkv.observe.residency import ResidencyListener, ResidencySample, ResidencySampler

__all__ = ["ObserveConfig", "ObservedKVCacheManager", "Observer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ObserveConfig:
    """What the observed manager keeps.

    ``ghost_entries``: evicted hashes remembered (oldest forgotten first; 0: every miss
    of an evicted block reads ``never_seen``). ``residency_sample_every``: follow 1 in N
    allocated blocks (``None``: no residency sampling, the plain pool). ``clock``:
    seconds for eviction records and residency (a simulator passes its simulated clock).

    Raises:
        InvalidArgumentError: a negative ``ghost_entries``, a ``residency_sample_every``
            below 1, a ``clock`` that is not callable (each count a whole number, not a
            bool).
    """

    ghost_entries: int = 65536
    residency_sample_every: int | None = 100
    clock: Callable[[], float] = field(default=time.monotonic)

    def __post_init__(self) -> None:
        check_whole("ObserveConfig.ghost_entries", self.ghost_entries, minimum=0)
        if self.residency_sample_every is not None:
            check_whole("ObserveConfig.residency_sample_every", self.residency_sample_every,
                        minimum=1, hint=" (None: no residency sampling)")
        check_clock("ObserveConfig.clock", self.clock)

    def attach(self, build: ManagerBuild) -> Observer:
        """Attach attribution to a manager being built (a component spec, see
        :mod:`pagedkv.core.components`): the recorder is wrapped by a ghost recorder,
        residency sampling listens to the pool."""
        return Observer(self, build)


class _MissCounters:
    __slots__ = ("hits", "missed", "p_hits", "p_missed", "p_queries", "p_requests",
                 "queries", "requests")

    def __init__(self) -> None:
        self.requests = self.queries = self.hits = 0
        self.p_requests = self.p_queries = self.p_hits = 0
        self.missed: dict[str, int] = {}
        self.p_missed: dict[str, int] = {}

    def add(self, e: LookupExplanation, preempted: bool) -> None:
        missed = self.p_missed if preempted else self.missed
        for s in e.segments:
            if s.reason is not Reason.HIT:
                key = s.label
                missed[key] = missed.get(key, 0) + s.end - s.start
        if preempted:
            self.p_requests += 1
            self.p_queries += e.num_tokens
            self.p_hits += e.num_hit_tokens
        else:
            self.requests += 1
            self.queries += e.num_tokens
            self.hits += e.num_hit_tokens

    def value(self) -> MissStats:
        return MissStats(requests=self.requests, queries=self.queries, hits=self.hits,
                         missed_tokens=dict(self.missed), preempted_requests=self.p_requests,
                         preempted_queries=self.p_queries, preempted_hits=self.p_hits,
                         preempted_missed_tokens=dict(self.p_missed))


class Observer(ManagerComponent):
    """Miss attribution and residency for one manager: ``mgr.observe`` (module docstring).

    Extra cost over the plain manager, per ``get_computed_blocks``: one explanation
    (O(missed blocks up to the first never-seen one), the hit itself is not re-scanned);
    per eviction: one ghost entry; per registration of a request with extra keys: its
    salt-free shadow hashes. ``benchmarks/observe_speed.py`` measures it.
    """

    def __init__(self, config: ObserveConfig, build: ManagerBuild) -> None:
        super().__init__("observe")
        self.observe_config = config
        cc = build.config
        shadow = BlockHasher(build.hash_block_size, algo=cc.hash_algo,
                             secret_seed=cc.secret_seed, memo_blocks=cc.hash_memo_blocks)
        self.ghost = GhostRecorder(build.recorder, ghost_entries=config.ghost_entries,
                                   shadow_hasher=shadow, clock=config.clock)
        build.recorder = self.ghost
        self.residency: ResidencySampler | None = None
        if config.residency_sample_every is not None:
            self.residency = ResidencySampler(config.residency_sample_every,
                                              clock=config.clock)
            build.listeners.append(ResidencyListener(self.residency))
        self._misses = _MissCounters()

    def bind(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self.ghost.bind(manager.pool)
        self.explainer = Explainer(manager, self.ghost)

    # ---------------------------------------------------------------- steps

    @property
    def step(self) -> int:
        """The step number stamped on eviction records."""
        return self.ghost.step

    def begin_step(self, step: int | None = None) -> int:
        """Start scheduler step ``step`` (default: the previous one + 1); returns it."""
        self.ghost.step = self.ghost.step + 1 if step is None else step
        return self.ghost.step

    # ---------------------------------------------------------------- attribution

    def explain_lookup(self, request: RequestLike) -> LookupExplanation:
        """Why ``request``'s lookup hits what it hits, per token run and per group block.

        Changes nothing: no statistics, no LRU order, ``debug_state()`` stays identical;
        its hit part equals ``get_computed_blocks(request)`` at the same moment.

        Raises:
            InvalidArgumentError: as ``get_computed_blocks`` (not a request, or longer
                than ``max_model_len``).
        """
        validation.check_lookup(self.manager, request)
        return self.explainer.explain(request)

    def after_lookup(self, request: RequestLike, hit: ComputedBlocks) -> None:
        """Every lookup's missed tokens by reason go to the interval
        (:meth:`make_miss_stats`)."""
        if not self.explainer.caching_off:
            e = self.explainer.explain(request, (hit.block_ids, hit.num_computed_tokens))
        else:
            e = self.explainer.explain(request)
        self.observe_lookup(request, e)

    def observe_lookup(self, request: RequestLike, explanation: LookupExplanation) -> None:
        """Called with every lookup's explanation: adds it to the interval. A subclass may
        extend it (e.g. to keep timed explanations for a plot), calling this one."""
        self._misses.add(explanation, bool(request.num_preemptions))

    def make_miss_stats(self) -> MissStats:
        """Missed tokens by reason since the previous call (then a new interval starts);
        the sibling of ``make_prefix_cache_stats``."""
        stats = self._misses.value()
        self._misses = _MissCounters()
        return stats

    def drain_residency(self) -> list[ResidencySample]:
        """Residency samples emitted since the previous call (empty without sampling)."""
        return self.residency.drain() if self.residency is not None else []


def ObservedKVCacheManager(
    config: CacheConfig, observe: ObserveConfig | None = None
) -> KVCacheManager:
    """Deprecated: ``KVCacheManager(replace(config, observe=observe or ObserveConfig()))``;
    attribution is the ``mgr.observe`` component."""
    return KVCacheManager(replace(config, observe=observe or ObserveConfig()))
