"""``pagedkv simulate --replicas N --router POLICY|compare``: the workload over N simulated
engine replicas behind a router (:func:`pagedkv.cluster.replicas.compare_policies`).

What the simulator's flags become (:func:`replica_engine_config`): each replica is one
full-attention group of ``--block-size`` tokens per block and the capacity ``--num-blocks``
or the planner's plan for ``--model``/``--gpu-memory`` gives one engine (a hybrid plan is
approximated by one full-attention group holding the plan's token slots), with the
``--token-budget``, ``--max-running`` and step-time flags. Every request arrives at its
trace time (``parent`` links are ignored), so ``--rate-scale`` and ``--arrivals`` do not
apply; neither does ``--mode pure-cache``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pagedkv.errors import MissingDependencyError
from pagedkv.sim.api import SimConfig, capacity_for
from pagedkv.sim.options import MAX_REPLICAS, ROUTERS
from pagedkv.sim.progress import ProgressReporter
from pagedkv.sim.scheduler import workload_max_len
from pagedkv.sim.setup import OutputOptions, ReplicaOptions
from pagedkv.sim.workloads import Workload

if TYPE_CHECKING:  # pagedkv.cluster imports pagedkv.sim: imported when used
    from pagedkv.cluster.replica_engine import EngineConfig

__all__ = ["MAX_REPLICAS", "ROUTERS", "replica_engine_config", "run_replicas_cli"]


def replica_engine_config(workload: Workload, config: SimConfig) -> tuple[EngineConfig, str | None]:
    """The :class:`~pagedkv.cluster.replica_engine.EngineConfig` ``config`` maps to for
    ``workload`` (module docstring), and a note when the mapping approximates."""
    from pagedkv.cluster.replica_engine import EngineConfig

    cap = capacity_for(workload, config)
    bs = cap.block_size
    note = None
    num_blocks = cap.num_blocks
    if cap.is_hybrid:
        tokens = cap.plan_kv_tokens or (cap.num_blocks - 1) * bs
        num_blocks = tokens // bs + 1
        note = (f"the hybrid plan ({', '.join(cap.group_names)}) is simulated per replica as "
                f"one full-attention group of {num_blocks} blocks")
    # Requests longer than a replica's cache are rejected on arrival and counted, as the
    # single engine rejects them (pagedkv.cluster.replicas.run_replicas).
    s = config.scheduler
    engine = EngineConfig(num_blocks=num_blocks, block_size=bs,
                          max_model_len=workload_max_len(workload, bs),
                          token_budget=s.token_budget, max_running=s.max_running,
                          step_time=s.step_time, num_usage_samples=s.num_samples)
    return engine, note


def run_replicas_cli(workload: Workload, config: SimConfig, replicas: ReplicaOptions,
                     output: OutputOptions, *, what: str) -> int:
    """Run ``--replicas``: compare (or run one) routing policy, print the table (or JSON),
    write ``replicas.png`` to the plot directory. Returns the exit code."""
    from pagedkv.cluster.replica_report import (
        plot_replica_reports,
        render_replica_report,
        replica_report_json,
    )
    from pagedkv.cluster.replicas import compare_policies
    from pagedkv.cluster.router import POLICIES

    engine, note = replica_engine_config(workload, config)
    policies = POLICIES if replicas.router == "compare" else (replicas.router,)
    n = replicas.replicas
    progress = ProgressReporter(enabled=output.progress)
    try:
        report = compare_policies(
            workload, num_replicas=n, engine=engine, policies=policies, progress=progress,
            phase=lambda policy: progress.phase(
                f"replaying {len(workload.requests):,} requests over {n} "
                f"{'replica' if n == 1 else 'replicas'} ({policy})"))
    finally:
        progress.close()
    plot_path = None if output.plot_dir is None else Path(output.plot_dir) / "replicas.png"
    if output.json:
        out = replica_report_json(report)
        out["workload_description"] = what
        out["note"] = note
        out["plots"] = [] if plot_path is None else [str(plot_path)]
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(what)
        print(render_replica_report(report))
        if note:
            print(f"note: {note}")
    sys.stdout.flush()
    if plot_path is not None:
        try:
            written = plot_replica_reports([report], plot_path)
            msg = f"plot written to {written.resolve()}"
        except MissingDependencyError as exc:
            msg = f"plots skipped: {exc}"
        print(msg, file=sys.stderr if output.json else sys.stdout)
    return 0
