"""Multi-replica simulation: round-robin vs least-loaded vs cache-aware on a trace.

Every replica is the engine ``pagedkv simulate`` runs (the planner's capacity for the
model, the roofline clock). Prints the comparison table per cluster size and writes a
PNG. Example::

    python benchmarks/cluster_replicas.py --limit 2000 --replicas 4 8 --plot replicas.png
"""

from __future__ import annotations

import argparse
import sys
import time

from pagedkv.sim import SimConfig, bundled_trace_path, load_trace
from pagedkv.sim.replicas import compare_policies, plot_replica_reports, render_replica_report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=None, help="trace file (default: the bundled head)")
    p.add_argument("--limit", type=int, default=None, help="first N requests only")
    p.add_argument("--replicas", type=int, nargs="+", default=[4, 8])
    p.add_argument("--model", default=None, help="model (default: the simulator's)")
    p.add_argument("--plot", default=None, help="write the PNG here")
    args = p.parse_args()
    workload = load_trace(args.trace or bundled_trace_path(), limit=args.limit)
    config = SimConfig(model=args.model, bounds=False, jobs=1)
    reports = []
    for n in args.replicas:
        t0 = time.perf_counter()
        report = compare_policies(workload, config, num_replicas=n,
                                  phase=lambda p: print(f"  {p}...", file=sys.stderr))
        print(render_replica_report(report))
        print(f"(simulated in {time.perf_counter() - t0:.0f} s wall)\n", flush=True)
        reports.append(report)
    if args.plot:
        print(f"plot: {plot_replica_reports(reports, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
