#!/usr/bin/env python3
"""What turning KV-cache events on costs the manager.

Two managers, one with events off and one with events on (buffered, drained every step as
an engine does), are driven by the same continuous-batching loop, operation by operation:
every lookup / allocate / free is done on both, timed separately, so machine noise hits
both sides alike. Prints the summed time of the core operations on each side and the
overhead. Workload: the ``pagedkv bench`` shared-prefix workload.

    python benchmarks/events_overhead.py
"""

from __future__ import annotations

import argparse

from lockstep import replay_lockstep

from pagedkv import FullAttentionSpec, KVCacheManager
from pagedkv.bench import WORKLOADS, BenchConfig, build_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=WORKLOADS, default="shared-prefix")
    ap.add_argument("--num-requests", type=int, default=2000)
    a = ap.parse_args()
    specs, num_blocks = build_workload(BenchConfig(workload=a.workload,
                                              num_requests=a.num_requests))
    max_len = max(len(s.prompt) + len(s.decode) for s in specs)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
    mgrs = [KVCacheManager.from_spec(spec, num_blocks=num_blocks, max_model_len=max_len,
                                     enable_events=events) for events in (False, True)]
    num_events = 0

    def drain() -> None:
        nonlocal num_events
        num_events += len(mgrs[1].take_events())

    spent = replay_lockstep(mgrs, specs, after_step=drain)
    off, on = spent
    print(f"workload {a.workload}: {len(specs)} requests, {num_events} events")
    print(f"core operations: events off {off:.3f} s, on {on:.3f} s, "
          f"overhead {100 * (on / off - 1):.1f} %")


if __name__ == "__main__":
    main()
