"""The multi-replica simulation: N single engines behind a router on one clock.

* :mod:`~pagedkv.sim.replicas.driver` — :func:`run_replicas` (one policy) and
  :func:`compare_policies` (several, on the one loaded workload);
* :mod:`~pagedkv.sim.replicas.merge` — the replicas' measurements as one run's report;
* :mod:`~pagedkv.sim.replicas.report` — the comparison table, JSON and plot.

The router, index and ingest are the production ones (:mod:`pagedkv.cluster`); the
stepping engine is the simulator's only one (:class:`pagedkv.sim.EngineSimulator`).
"""

from pagedkv.sim.replicas.driver import MAX_REPLICAS, compare_policies, run_replicas
from pagedkv.sim.replicas.merge import PolicyResult, ReplicaReport, merge_results
from pagedkv.sim.replicas.report import (
    plot_replica_reports,
    render_replica_report,
    replica_report_json,
)

__all__ = [
    "MAX_REPLICAS",
    "PolicyResult",
    "ReplicaReport",
    "compare_policies",
    "merge_results",
    "plot_replica_reports",
    "render_replica_report",
    "replica_report_json",
    "run_replicas",
]
