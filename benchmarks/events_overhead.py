#!/usr/bin/env python3
"""What turning KV-cache events on costs the manager: the ``pagedkv bench`` workload with
events off and on (buffered, drained every step as an engine does), alternating in one
process, best of N for each; prints core ops/s, core+hash ops/s and the overhead.

    python benchmarks/events_overhead.py --rounds 5
"""

from __future__ import annotations

import argparse

from pagedkv.bench import WORKLOADS, BenchConfig, run_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workload", choices=WORKLOADS, default="shared-prefix")
    a = ap.parse_args()
    best: dict[bool, dict[str, float]] = {False: {}, True: {}}
    for _ in range(a.rounds):
        for events in (False, True):
            r = run_bench(BenchConfig(workload=a.workload, enable_events=events))
            for key in ("core_ops_per_s", "core_plus_hash_ops_per_s"):
                best[events][key] = max(best[events].get(key, 0.0), r[key])
    print(f"workload {a.workload}, best of {a.rounds} alternating runs")
    for key in ("core_ops_per_s", "core_plus_hash_ops_per_s"):
        off, on = best[False][key], best[True][key]
        print(f"{key:<26} events off {off:>10,.0f}  on {on:>10,.0f}  "
              f"cost {100 * (off / on - 1):5.1f} %")


if __name__ == "__main__":
    main()
