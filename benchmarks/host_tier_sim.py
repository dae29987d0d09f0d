#!/usr/bin/env python3
"""Device only versus device + host memory in the simulator's engine mode: hit rate per
tier and TTFT p50/p99 on the Mooncake conversation trace.

The device is the planner's capacity for ``--model`` on ``--gpu-memory`` (default
Llama-3.1-8B on an 80 GiB GPU); each host size is a replay with a host tier of that size
(``pagedkv simulate --host-memory``), bytes per block from the same plan, at
``--host-bandwidth-gbps`` per direction. Prints one Markdown table row per replay.

    python benchmarks/host_tier_sim.py
    python benchmarks/host_tier_sim.py --host-memory 256GiB,1TiB --limit 4000

The same figures come from one CLI run (its "Host memory sweep" table)::

    pagedkv simulate --trace ../shared/data/traces/conversation_trace.jsonl \\
        --host-memory 256GiB,1TiB --no-bounds --no-plots

Uses only public APIs: ``pagedkv.sim.run`` with ``SimConfig(host=...)``.
"""

from __future__ import annotations

import argparse
import os
import time

from pagedkv.sim import SimConfig, load_trace, run
from pagedkv.sim.host_tier import WRITE_POLICIES, HostMemoryConfig, parse_host_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "..", "shared", "data", "traces", "conversation_trace.jsonl")


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:,.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--limit", type=int, default=None, help="first N requests only")
    ap.add_argument("--model", default="Llama-3.1-8B")
    ap.add_argument("--gpu-memory", default="80GiB")
    ap.add_argument("--host-memory", default="256GiB,1TiB",
                    help="host sizes, comma-separated (default 256GiB,1TiB)")
    ap.add_argument("--host-bandwidth-gbps", type=float, default=25.0)
    ap.add_argument("--host-write-policy", choices=WRITE_POLICIES, default="on-eviction")
    args = ap.parse_args()
    sizes = parse_host_sizes(args.host_memory)
    wl = load_trace(args.trace, limit=args.limit)
    host = HostMemoryConfig(memory_bytes=sizes[0], bandwidth_gbps=args.host_bandwidth_gbps,
                            write_policy=args.host_write_policy, sweep_memory_bytes=sizes[1:])
    t0 = time.perf_counter()
    report = run(wl, SimConfig(model=args.model, gpu_memory=args.gpu_memory, bounds=False,
                               jobs=1, host=host))
    wall = time.perf_counter() - t0
    print(f"{wl.description}; device: {report.capacity.source}, "
          f"{report.capacity_tokens:,} tokens; host link {args.host_bandwidth_gbps:g} GB/s "
          f"per direction, {args.host_write_policy}; {wall:.0f} s wall for "
          f"{len(sizes) + 1} replays")
    print()
    print("| KV memory | host blocks | hit rate | device hits | host hits | TTFT p50 | "
          "TTFT p99 | preemptions |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in report.host_sweep:
        what = ("device only" if row.host_memory_bytes is None
                else f"device + {row.host_memory_bytes / 2**30:,.0f} GiB host")
        print(f"| {what} | {row.host_blocks:,} | {100 * row.hit_rate:.1f} % | "
              f"{100 * row.device_hit_rate:.1f} % | {100 * row.host_hit_rate:.1f} % | "
              f"{_ms(row.ttft_p50_s)} | {_ms(row.ttft_p99_s)} | {row.preemptions:,} |")
    tier = report.host_tier
    if tier is not None:
        print()
        print(f"first host size: {tier.loads:,} loads of {tier.loaded_blocks:,} blocks "
              f"({tier.load_s:.1f} s of copies), {tier.declined_host_tokens:,} host-hit "
              f"tokens recomputed instead, {tier.stored_blocks:,} blocks stored, steps "
              f"waited {tier.store_stall_s:.1f} s for stores")


if __name__ == "__main__":
    main()
