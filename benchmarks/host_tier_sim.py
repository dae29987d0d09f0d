#!/usr/bin/env python3
"""Device only versus device + host memory in the simulator's engine mode: hit rate per
tier and TTFT p50/p99 on the Mooncake conversation trace.

The device is the planner's capacity for ``--model`` on ``--gpu-memory`` (default
Llama-3.1-8B on an 80 GiB GPU); each host size is a replay with a host tier of that size
(``pagedkv simulate --host-memory``), bytes per block from the same plan, at
``--host-bandwidth-gbps`` per direction, under each write policy (store on eviction,
write-through). Prints one Markdown table row per replay.

    python benchmarks/host_tier_sim.py
    python benchmarks/host_tier_sim.py --host-memory 256GiB,1TiB --limit 4000

One policy's rows also come from one CLI run (its "Host memory" table)::

    pagedkv simulate --trace data/traces/conversation_trace.jsonl.gz \\
        --host-memory 256GiB,1TiB --no-bounds --no-plots

Uses only public APIs: ``pagedkv.sim.run`` with ``SimConfig(host=...)``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

from pagedkv.planner import format_bytes
from pagedkv.sim import SimConfig, SimReport, load_trace, run
from pagedkv.sim.host_tier import WRITE_POLICIES, HostMemoryConfig, parse_host_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "data", "traces", "conversation_trace.jsonl.gz")


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:,.0f} ms"


def _row(what: str, report: SimReport) -> str:
    tier = report.host_tier
    hit = report.hit_rate or 0.0
    host = tier.host_hit_tokens / report.prompt_tokens if tier and report.prompt_tokens else 0.0
    e = report.engine
    assert e is not None
    return (f"| {what} | {tier.num_blocks if tier else 0:,} | {100 * hit:.1f} % | "
            f"{100 * (hit - host):.1f} % | {100 * host:.1f} % | {_ms(e.ttft.p50)} | "
            f"{_ms(e.ttft.p99)} | {report.preemptions:,} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--limit", type=int, default=None, help="first N requests only")
    ap.add_argument("--model", default="Llama-3.1-8B")
    ap.add_argument("--gpu-memory", default="80GiB")
    ap.add_argument("--host-memory", default="256GiB,1TiB",
                    help="host sizes, comma-separated (default 256GiB,1TiB)")
    ap.add_argument("--host-bandwidth-gbps", type=float, default=25.0)
    ap.add_argument("--host-write-policy", default=",".join(WRITE_POLICIES),
                    help="write policies, comma-separated (default: both)")
    args = ap.parse_args()
    sizes = parse_host_sizes(args.host_memory)
    policies = args.host_write_policy.split(",")
    wl = load_trace(args.trace, limit=args.limit)
    base = SimConfig(model=args.model, gpu_memory=args.gpu_memory, bounds=False, jobs=1)
    t0 = time.perf_counter()
    rows = []
    report = run(wl, base)
    rows.append(_row("device only", report))
    notes = []
    for policy in policies:
        for size in sizes:
            host = HostMemoryConfig(memory_bytes=size, bandwidth_gbps=args.host_bandwidth_gbps,
                                    write_policy=policy, device_only_baseline=False)
            r = run(wl, replace(base, host=host))
            rows.append(_row(f"+ {format_bytes(size)} host, {policy}", r))
            t = r.host_tier
            assert t is not None
            notes.append(f"{format_bytes(size)} {policy}: {t.loads:,} loads of "
                         f"{t.loaded_blocks:,} blocks ({t.load_s:.1f} s of copies), "
                         f"{t.declined_host_tokens:,} host-hit tokens recomputed instead, "
                         f"{t.stored_blocks:,} blocks stored, steps waited "
                         f"{t.store_stall_s:.1f} s for stores")
    wall = time.perf_counter() - t0
    print(f"{wl.description}; device: {report.capacity.source}, "
          f"{report.capacity_tokens:,} tokens; host link {args.host_bandwidth_gbps:g} GB/s "
          f"per direction; {wall:.0f} s wall for {len(rows)} replays")
    print()
    print("| KV memory | host blocks | hit rate | device hits | host hits | TTFT p50 | "
          "TTFT p99 | preemptions |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for line in rows:
        print(line)
    print()
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
