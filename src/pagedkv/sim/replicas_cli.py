"""``pagedkv simulate --replicas N --router POLICY|compare``: the workload over N replicas
of the engine ``simulate`` runs, behind a router (:mod:`pagedkv.sim.replicas`).

Every replica has what the flags give one engine: the capacity (``--num-blocks`` or the
planner's plan for ``--model``/``--gpu``/``--gpu-memory``, every KV-cache group of a
hybrid model), ``--token-budget``, ``--max-running``, the clock, ``--arrivals`` and
``--rate-scale``, the host tier of ``--host-memory``, the events of
``--kv-events-endpoint`` (one endpoint, each batch tagged with its replica's rank) and the
observing of ``--explain-misses`` / ``--metrics-port`` (:mod:`pagedkv.sim.observe_replicas`).
The compare-routers run loads the workload once and replays it once per policy. Progress
goes to stderr (a line every few seconds when it is not a terminal).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pagedkv.cluster.router import POLICIES
from pagedkv.errors import MissingDependencyError
from pagedkv.sim.api import SimConfig
from pagedkv.sim.observe_replicas import ReplicaObserving
from pagedkv.sim.options import MAX_REPLICAS, ROUTERS
from pagedkv.sim.progress import ProgressReporter
from pagedkv.sim.replicas import (
    compare_policies,
    plot_replica_reports,
    render_replica_report,
    replica_report_json,
)
from pagedkv.sim.setup import ObserveOptions, OutputOptions, ReplicaOptions
from pagedkv.sim.workloads import Workload

__all__ = ["MAX_REPLICAS", "ROUTERS", "run_replicas_cli"]


def run_replicas_cli(workload: Workload, config: SimConfig, replicas: ReplicaOptions,
                     output: OutputOptions, *, what: str,
                     observe: ObserveOptions | None = None) -> int:
    """Run ``--replicas``: compare (or run one) routing policy, print the table (or JSON),
    write ``replicas.png`` to the plot directory. Returns the exit code."""
    policies = POLICIES if replicas.router == "compare" else (replicas.router,)
    n = replicas.replicas
    observing = ReplicaObserving.start(observe)
    progress = ProgressReporter(enabled=output.progress)
    try:
        report = compare_policies(
            workload, config, num_replicas=n, policies=policies, progress=progress,
            phase=lambda policy: progress.phase(
                f"replaying {len(workload.requests):,} requests over {n} "
                f"{'replica' if n == 1 else 'replicas'} ({policy})"),
            observers=None if observing is None else observing.observers)
    except BaseException:
        if observing is not None:
            observing.close()
        raise
    finally:
        progress.close()
    plot_path = None if output.plot_dir is None else Path(output.plot_dir) / "replicas.png"
    if output.json:
        out = replica_report_json(report)
        if observing is not None:
            for row in out["results"]:
                observing.add_json(row)
        out["workload_description"] = what
        out["plots"] = [] if plot_path is None else [str(plot_path)]
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(what)
        print(render_replica_report(report))
        if observing is not None and (sections := observing.sections()):
            print("\n" + sections, end="")
    sys.stdout.flush()
    if plot_path is not None:
        try:
            shape = (f"{config.model or 'Llama-3.1-8B'} TP {config.tp} on "
                     f"{config.gpu or 'H100-SXM'} per replica" if config.num_blocks is None
                     else f"{config.num_blocks} blocks per replica")
            written = plot_replica_reports([report], plot_path, title=shape)
            msg = f"plot written to {written.resolve()}"
        except MissingDependencyError as exc:
            msg = f"plots skipped: {exc}"
        print(msg, file=sys.stderr if output.json else sys.stdout)
    if observing is not None:
        observing.finish(plot_dir=output.plot_dir, json_mode=output.json, title=what)
    return 0
