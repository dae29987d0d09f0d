"""Prefix-cache statistics: per-interval counters and a hit rate over the last N requests."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

__all__ = ["HitRateWindow", "LookupCounters", "PrefixCacheStats"]


class PrefixCacheStats(NamedTuple):
    """Lookups since the previous ``make_prefix_cache_stats`` call.

    Re-lookups of preempted requests are counted apart (``preempted_*``) so recomputation
    after preemption is not reported as new traffic.
    """

    requests: int
    queries: int
    hits: int
    preempted_requests: int
    preempted_queries: int
    preempted_hits: int

    @property
    def hit_rate(self) -> float:
        """Hit tokens / queried tokens of fresh (not preempted) lookups; 0.0 with none."""
        return self.hits / self.queries if self.queries else 0.0


class LookupCounters:
    """The running counters behind :class:`PrefixCacheStats` (one field each).

    The façade adds to the fields directly (no call on the lookup path).

    >>> c = LookupCounters()
    >>> c.requests += 1; c.queries += 100; c.hits += 64
    >>> c.take().hit_rate, c.take().requests
    (0.64, 0)
    """

    __slots__ = ("hits", "preempted_hits", "preempted_queries", "preempted_requests",
                 "queries", "requests")

    def __init__(self) -> None:
        self.requests = self.queries = self.hits = 0
        self.preempted_requests = self.preempted_queries = self.preempted_hits = 0

    def snapshot(self) -> PrefixCacheStats:
        """The counters as a value; nothing changes. O(1)."""
        return PrefixCacheStats(self.requests, self.queries, self.hits,
                                self.preempted_requests, self.preempted_queries,
                                self.preempted_hits)

    def take(self) -> PrefixCacheStats:
        """The counters as a value, then all back to 0. O(1)."""
        stats = self.snapshot()
        self.requests = self.queries = self.hits = 0
        self.preempted_requests = self.preempted_queries = self.preempted_hits = 0
        return stats


class HitRateWindow:
    """Hit rate over the most recent ``max_requests`` fresh lookups. O(1) per observation."""

    __slots__ = ("_entries", "hits", "max_requests", "queries")

    def __init__(self, max_requests: int = 1000) -> None:
        self.max_requests = max_requests
        self._entries: deque[tuple[int, int]] = deque()
        self.queries = 0
        self.hits = 0

    def observe(self, queries: int, hits: int) -> None:
        entries = self._entries
        entries.append((queries, hits))
        self.queries += queries
        self.hits += hits
        if len(entries) > self.max_requests:
            q, h = entries.popleft()
            self.queries -= q
            self.hits -= h

    @property
    def num_requests(self) -> int:
        return len(self._entries)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def reset(self) -> None:
        self._entries.clear()
        self.queries = 0
        self.hits = 0
