#!/usr/bin/env python3
"""What miss attribution and residency sampling cost, and explain_lookup against a lookup.

1. Workload cost: three managers — plain, observed (attribution, no residency), observed
   with residency sampling 1 in 100 — driven by the same continuous-batching loop,
   operation by operation, each operation timed on every side in turn, the side going
   first rotating (machine noise hits all sides alike). Prints the summed core-operation
   time per side and the overhead.
2. explain_lookup vs get_computed_blocks: at the end of the workload, for probe prompts
   (the shared prefix + a new suffix; a fully cached prompt; a never-seen prompt), the
   time of ``explain_lookup`` on the observed manager against ``get_computed_blocks`` on
   the plain one (same pool state), alternating, best of 200 calls, median of 3 rounds.
3. Per request (the shared prefix + a new 300-token suffix: lookup, prefill allocation,
   one decode slot, free) on each observed manager against the plain one, alternating,
   best of 200, median of 3 rounds.
4. Ghost record memory per entry (tracemalloc, 20,000 entries).

    python benchmarks/observe_speed.py [--workload shared-prefix] [--num-requests 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from typing import Any

from lockstep import replay_lockstep

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager, SlidingWindowSpec
from pagedkv.bench import WORKLOADS, BenchConfig, build_workload
from pagedkv.observe import ObserveConfig, ObservedKVCacheManager
from pagedkv.observe.ghost import GhostRecorder
from pagedkv.observe.reasons import EvictionRecord

SPEC = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
SIDES = ("plain", "attribution", "attribution+residency")


def drive(specs: list[Any], mgrs: list[KVCacheManager]) -> list[float]:
    """Run the workload on every manager in lockstep; summed op time per manager."""
    return replay_lockstep(mgrs, specs)


def explain_ratio(plain: KVCacheManager, observed: ObservedKVCacheManager,
                  prompt: list[int], calls: int = 200) -> float:
    """Median over 3 rounds of best explain_lookup time / best get_computed_blocks time."""
    a = plain.new_request("probe", prompt)
    b = observed.new_request("probe", prompt)
    perf = time.perf_counter_ns
    ratios = []
    for _ in range(3):
        best_l = best_e = 1 << 62
        for _ in range(calls):
            t = perf()
            plain.get_computed_blocks(a)
            t1 = perf()
            observed.observe.explain_lookup(b)
            t2 = perf()
            best_l = min(best_l, t1 - t)
            best_e = min(best_e, t2 - t1)
        ratios.append(best_e / best_l)
    return statistics.median(ratios)


def best_ratio(base: Any, other: Any, calls: int = 200) -> float:
    """Median over 3 rounds of best ``other()`` time / best ``base()`` time, alternating."""
    perf = time.perf_counter_ns
    ratios = []
    for _ in range(3):
        best_b = best_o = 1 << 62
        for _ in range(calls):
            t = perf()
            base()
            t1 = perf()
            other()
            t2 = perf()
            best_b = min(best_b, t1 - t)
            best_o = min(best_o, t2 - t1)
        ratios.append(best_o / best_b)
    return statistics.median(ratios)


def cycle(mgr: KVCacheManager, prefix: list[int], offset: int) -> Any:
    """One request: ``prefix`` + a 300-token suffix new on every call (suffixes from
    ``offset`` on); its lookup, prefill allocation, one decode slot, and free."""
    count = [0]

    def run() -> None:
        count[0] += 1
        base = offset + 1000 * count[0]
        r = mgr.new_request(f"cycle-{count[0]}", prefix + list(range(base, base + 300)))
        hit = mgr.get_computed_blocks(r)
        mgr.allocate_slots(r, r.num_tokens - hit.num_computed_tokens, new_computed_blocks=hit)
        r.num_computed_tokens = r.num_tokens
        r.append_output_tokens(1)
        mgr.allocate_slots(r, 1)
        mgr.free(r)
    return run


def ghost_bytes_per_entry(n: int = 20_000) -> float:
    from pagedkv.core.hashing import BlockHasher
    from pagedkv.core.recorder import EventRecorder

    ghost = GhostRecorder(EventRecorder(), ghost_entries=n, shadow_hasher=BlockHasher(16),
                          clock=time.monotonic)
    hashes = [i.to_bytes(32, "little") for i in range(n)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for h in hashes:
        ghost.ghost[(0, h)] = EvictionRecord(0, 0.0, 0.5)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return grown / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=WORKLOADS, default="shared-prefix")
    ap.add_argument("--num-requests", type=int, default=2000)
    a = ap.parse_args()
    specs, num_blocks = build_workload(BenchConfig(workload=a.workload,
                                              num_requests=a.num_requests))
    max_len = max(len(s.prompt) + len(s.decode) for s in specs)
    cfg = CacheConfig(groups=(SPEC,), num_blocks=num_blocks, max_model_len=max_len)
    plain = KVCacheManager(cfg)
    attr = ObservedKVCacheManager(cfg, ObserveConfig(residency_sample_every=None))
    resid = ObservedKVCacheManager(cfg, ObserveConfig(residency_sample_every=100))
    spent = drive(specs, [plain, attr, resid])
    print(f"workload {a.workload}: {len(specs)} requests, {num_blocks} blocks")
    for name, t in zip(SIDES, spent, strict=True):
        print(f"  core operations, {name:<22} {t:7.3f} s  ({100 * (t / spent[0] - 1):+5.1f} %)")

    shared = specs[0].prompt[:1024]
    probes = {
        "shared 1,024-token prefix + 300 new": shared + list(range(7, 307)),
        "fully cached prompt (hit cap)": specs[-1].prompt,
        "never-seen 1,300-token prompt": list(range(40_000, 41_300)),
    }
    print("explain_lookup / get_computed_blocks (median of 3 rounds of best-of-200):")
    for label, prompt in probes.items():
        print(f"  {label:<38} {explain_ratio(plain, attr, prompt):5.2f}x")

    # Hybrid: full attention + sliding window (clamp analysis replays the coordinator).
    groups = (SPEC, SlidingWindowSpec(block_size=16, sliding_window=256, num_kv_heads=8,
                                      head_size=128, dtype_bytes=2))
    hcfg = CacheConfig(groups=groups, num_blocks=4000, max_model_len=8192)
    seeded = []
    for _ in range(2):
        plain_h, obs_h = KVCacheManager(hcfg), ObservedKVCacheManager(hcfg)
        for m in (plain_h, obs_h):
            r = m.new_request("seed", shared + list(range(7, 300)))
            m.allocate_slots(r, r.num_tokens)
        seeded.append((plain_h, obs_h))
    hplain, hobs = seeded[0]
    print(f"  {'hybrid full + window, cached prefix':<38} "
          f"{explain_ratio(hplain, hobs, shared + list(range(9, 400))):5.2f}x")
    # Window blocks 56..59 evicted: the window group clamps the hit from 1,024 to 896.
    cplain, cobs = seeded[1]
    for m in (cplain, cobs):
        window_ids = m.coordinator.block_ids("seed")[1]
        m.pool.evict_blocks(window_ids[56:60])
    probe = shared + list(range(9, 400))
    assert cobs.observe.explain_lookup(cobs.new_request("p", probe)).segments[1].label == \
        "clamped_window_run_not_found"
    print(f"  {'hybrid full + window, window clamps':<38} "
          f"{explain_ratio(cplain, cobs, probe):5.2f}x")
    # After the probes: the cycles change the plain and observed pools differently.
    print("per request (shared prefix + new suffix), observed / plain (median of 3 rounds "
          "of best-of-200, alternating):")
    for k, (name, mgr) in enumerate((("attribution", attr), ("attribution+residency", resid))):
        offset = 100_000 + 10_000_000 * k  # both sides see the same never-seen suffixes
        ratio = best_ratio(cycle(plain, shared, offset), cycle(mgr, shared, offset))
        print(f"  {name:<38} {ratio:5.2f}x")
    print(f"ghost record: {ghost_bytes_per_entry():.0f} bytes per entry (32-byte hashes)")


if __name__ == "__main__":
    main()
