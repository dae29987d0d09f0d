"""Multi-replica simulation: round-robin vs least-loaded vs cache-aware on a trace.

Prints the comparison table per cluster size and writes a PNG. Example (the figures in
docs/cluster.md)::

    python benchmarks/cluster_replicas.py --trace data/traces/conversation_trace.jsonl.gz \\
        --replicas 4 8 --plot cluster_replicas.png
"""

from __future__ import annotations

import argparse
import sys
import time

from pagedkv.cluster.replica_engine import EngineConfig
from pagedkv.cluster.replica_report import plot_replica_reports, render_replica_report
from pagedkv.cluster.replicas import compare_policies
from pagedkv.sim import bundled_trace_path, load_trace


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=None, help="trace file (default: the bundled head)")
    p.add_argument("--limit", type=int, default=None, help="first N requests only")
    p.add_argument("--replicas", type=int, nargs="+", default=[4, 8])
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=6412,
                   help="blocks per replica (default 6412 x 64 = 410k tokens: the "
                   "planner's Llama-3.1-8B on one 80 GB GPU)")
    p.add_argument("--plot", default=None, help="write the PNG here")
    args = p.parse_args()
    workload = load_trace(args.trace or bundled_trace_path(), limit=args.limit)
    engine = EngineConfig(num_blocks=args.num_blocks, block_size=args.block_size)
    reports = []
    for n in args.replicas:
        t0 = time.perf_counter()
        report = compare_policies(workload, num_replicas=n, engine=engine,
                                  phase=lambda p: print(f"  {p}...", file=sys.stderr))
        print(render_replica_report(report))
        print(f"(simulated in {time.perf_counter() - t0:.0f} s wall)\n", flush=True)
        reports.append(report)
    if args.plot:
        print(f"plot: {plot_replica_reports(reports, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
