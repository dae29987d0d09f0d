#!/usr/bin/env python3
"""Why the prefix cache misses on a trace: replays it through the engine simulator with an
observed manager and prints missed prompt tokens by reason; writes a stacked bar plot of
missed tokens by reason over simulated time.

    python benchmarks/observe_mooncake.py \\
        --trace data/traces/conversation_trace.jsonl.gz

Fresh lookups only (re-lookups after preemption are reported apart). Eviction records
are stamped with the arrival time of the request being looked up (the simulator's clock
is internal to its loop), so they read a little early under queueing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pagedkv import CacheConfig, ComputedBlocks
from pagedkv.core.request import RequestLike
from pagedkv.observe import LookupExplanation, ObserveConfig, ObservedKVCacheManager
from pagedkv.sim.bounds import access_sequence, infinite_cache_hits
from pagedkv.sim.observe_support import (
    intervals_from_explanations,
    merge_miss_stats,
    miss_table,
    plot_missed_tokens,
    render_miss_table,
)
from pagedkv.sim.scheduler import EngineSimulator
from pagedkv.sim.workloads import load_trace


class ArrivalClock:
    """Seconds: the arrival time of the request looked up last."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RecordingManager(ObservedKVCacheManager):
    """Keeps every fresh lookup's explanation by request id; moves the clock to the
    arrival time of each request it looks up."""

    def __init__(self, config: CacheConfig, clock: ArrivalClock,
                 arrival: dict[str, float], ghost_entries: int) -> None:
        super().__init__(config, ObserveConfig(clock=clock, residency_sample_every=None,
                                               ghost_entries=ghost_entries))
        self.clock = clock
        self.arrival = arrival
        self.explained: dict[str, LookupExplanation] = {}
        self.preempted: list[LookupExplanation] = []

    def get_computed_blocks(self, request: RequestLike) -> ComputedBlocks:
        self.clock.now = self.arrival.get(request.request_id, self.clock.now)
        return super().get_computed_blocks(request)

    def observe_lookup(self, request: RequestLike, explanation: LookupExplanation) -> None:
        super().observe_lookup(request, explanation)
        if request.num_preemptions:
            self.preempted.append(explanation)
        else:
            self.explained[request.request_id] = explanation


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="data/traces/conversation_trace.jsonl.gz")
    ap.add_argument("--limit", type=int, default=None, help="replay the first N requests")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=25_649,
                    help="default: what pagedkv simulate plans for Llama-3.1-8B on 80 GB")
    ap.add_argument("--intervals", type=int, default=40, help="bars in the plot")
    ap.add_argument("--ghost-entries", type=int, default=1_000_000,
                    help="evicted hashes remembered (about 200 bytes each)")
    ap.add_argument("--plot", default="pagedkv-report/missed_tokens_by_reason.png")
    a = ap.parse_args()
    if not Path(a.trace).exists():
        print(f"error: trace {a.trace} not found", file=sys.stderr)
        return 1
    wl = load_trace(a.trace, limit=a.limit)
    sim = EngineSimulator(wl, block_size=a.block_size, num_blocks=a.num_blocks)
    arrival = {r.request_id: r.arrival_s for r in wl.requests}
    mgr = RecordingManager(sim.manager.config, ArrivalClock(), arrival, a.ghost_entries)
    sim.manager = mgr
    t0 = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t0
    index = {r.request_id: i for i, r in enumerate(wl.requests)}
    timed = []
    for rid, e in mgr.explained.items():
        t = res.lookup_time_s[index[rid]]
        timed.append((t if t is not None else arrival[rid], e))
    end = max((t for t, _ in timed), default=1.0)
    series = intervals_from_explanations(timed, max(end, 1e-9) / a.intervals * 1.0001)
    total = merge_miss_stats(s for _, s in series)
    print(f"trace {a.trace}: {len(wl.requests)} requests, {a.num_blocks:,} blocks of "
          f"{a.block_size} tokens; replayed in {wall:.1f} s; {len(mgr.preempted)} "
          f"re-lookups after preemption (apart)")
    print(f"hit rate {total.hits / max(total.queries, 1):.1%} of "
          f"{total.queries:,} prompt tokens")
    print(render_miss_table(miss_table([total])))
    admitted = [i for i, t in enumerate(res.lookup_time_s) if t is not None]
    bound = infinite_cache_hits(access_sequence(wl, a.block_size, indices=admitted))
    print(f"for comparison, a cache that never evicts would hit "
          f"{sum(bound.hit_tokens):,} of {sum(bound.query_tokens):,} tokens "
          f"({bound.hit_rate():.1%})")
    gaps = sorted(t - s.eviction.time_s for t, e in timed for s in e.segments
                  if s.eviction is not None)
    if gaps:
        print(f"evicted runs: {len(gaps)}; came back after a median of "
              f"{gaps[len(gaps) // 2]:.1f} s (90th percentile {gaps[len(gaps) * 9 // 10]:.1f} s)")
    path = plot_missed_tokens(series, a.plot, title=f"{Path(a.trace).name}: prompt tokens "
                              "per interval, missed by reason")
    print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
