"""What a simulation run measured (both modes), and the figures derived from it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["SimResult", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(slots=True, kw_only=True)
class SimResult:
    """Measurements of one run, per request in workload order and over time.

    Hit accounting: ``hit_tokens[i]`` is the prefix-cache hit of request ``i``'s first
    successful lookup (the one it was admitted with), out of ``query_tokens[i]`` (its prompt
    length). Re-lookups after a preemption are summed apart (``preempted_*``), so
    recomputation never counts as new traffic. Rejected requests (too long for the whole
    cache) have ``hit_tokens[i] = 0`` and ``lookup_time_s[i] = None`` and are left out of
    every rate.
    """

    mode: str
    workload: str
    block_size: int
    num_blocks: int
    query_tokens: list[int]
    hit_tokens: list[int]
    lookup_time_s: list[float | None]
    evicted_blocks: int = 0
    preemptions: int = 0
    preempted_query_tokens: int = 0
    preempted_hit_tokens: int = 0
    rejected: int = 0
    #: of ``rejected``: longer than the model's context (``SchedulerConfig.max_model_len``)
    rejected_over_context: int = 0
    sample_time_s: list[float] = field(default_factory=list)
    sample_usage: list[float] = field(default_factory=list)
    sample_running: list[int] = field(default_factory=list)
    sample_waiting: list[int] = field(default_factory=list)
    # engine mode only
    arrival_s: list[float] = field(default_factory=list)
    first_scheduled_s: list[float | None] = field(default_factory=list)
    first_token_s: list[float | None] = field(default_factory=list)
    finish_s: list[float | None] = field(default_factory=list)
    num_steps: int = 0
    sim_duration_s: float = 0.0
    wall_s: float = 0.0
    #: the roofline clock's seconds per term (weights, compute, KV reads, overhead,
    #: communication); empty with the linear model
    clock_terms_s: list[float] = field(default_factory=list)
    #: output tokens per request (engine mode; for TPOT and throughput)
    output_tokens: list[int] = field(default_factory=list)

    def count_rejected(self, *, over_context: bool) -> None:
        """One more request rejected on arrival: longer than max_model_len
        (``over_context``) or than the whole cache."""
        self.rejected += 1
        self.rejected_over_context += over_context

    @property
    def capacity_tokens(self) -> int:
        """Token slots of the pool (the null block excluded)."""
        return (self.num_blocks - 1) * self.block_size

    @property
    def num_requests(self) -> int:
        return len(self.query_tokens)

    @property
    def num_finished(self) -> int:
        """Requests that finished (engine mode)."""
        return sum(1 for f in self.finish_s if f is not None)

    def totals(self, start: int = 0) -> tuple[int, int]:
        """(hit tokens, queried tokens) of admitted requests ``start..``."""
        hit = 0
        query = 0
        for i in range(start, len(self.query_tokens)):
            if self.lookup_time_s[i] is not None:
                hit += self.hit_tokens[i]
                query += self.query_tokens[i]
        return hit, query

    def hit_rate(self, start: int = 0) -> float:
        """Hit tokens / prompt tokens over requests ``start..`` (0.0 with none)."""
        hit, query = self.totals(start)
        return hit / query if query else 0.0

    def hit_rate_windows(self, num_windows: int = 20) -> list[tuple[float, float, float]]:
        """Hit rate per equal slice of lookup time: ``(start_s, end_s, hit_rate)``, slices
        without lookups left out."""
        times = [t for t in self.lookup_time_s if t is not None]
        if not times:
            return []
        t0, t1 = min(times), max(times)
        width = (t1 - t0) / num_windows or 1.0
        hits = [0] * num_windows
        queries = [0] * num_windows
        for t, q, h in zip(self.lookup_time_s, self.query_tokens, self.hit_tokens, strict=True):
            if t is None:
                continue
            w = min(int((t - t0) / width), num_windows - 1)
            hits[w] += h
            queries[w] += q
        return [
            (t0 + w * width, t0 + (w + 1) * width, hits[w] / queries[w])
            for w in range(num_windows)
            if queries[w]
        ]
