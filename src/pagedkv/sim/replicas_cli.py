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

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pagedkv.cli_args import whole_arg
from pagedkv.errors import InvalidArgumentError, MissingDependencyError
from pagedkv.sim.api import SimConfig, capacity_for
from pagedkv.sim.progress import ProgressReporter
from pagedkv.sim.scheduler import workload_max_len
from pagedkv.sim.workloads import Workload

if TYPE_CHECKING:  # pagedkv.cluster imports pagedkv.sim: imported when used
    from pagedkv.cluster.replica_engine import EngineConfig

__all__ = ["ROUTERS", "add_replica_flags", "check_replica_args", "replica_engine_config",
           "run_replicas_cli"]

ROUTERS = ("round-robin", "least-loaded", "cache-aware", "compare")


#: At most this many simulated replicas (each holds a manager and a queue in memory).
MAX_REPLICAS = 4096
_REPLICAS = whole_arg("--replicas", minimum=1, maximum=MAX_REPLICAS)


def add_replica_flags(p: argparse.ArgumentParser) -> None:
    """Register ``--replicas`` and ``--router`` on the ``simulate`` parser."""
    r = p.add_argument_group(
        "multiple replicas (engine mode; pagedkv.cluster)",
        "Each replica: one full-attention group of --block-size tokens per block, sized by "
        "--num-blocks or the --model plan (a hybrid plan as one full-attention group of "
        "its token slots), with --token-budget, --max-running and the step-time flags. "
        "Requests arrive at their trace times: --rate-scale and --arrivals do not apply.")
    r.add_argument("--replicas", type=_REPLICAS, default=None, metavar="N",
                   help="simulate N engine replicas behind a router instead of one engine")
    r.add_argument("--router", choices=ROUTERS, default=None,
                   help="routing policy for --replicas, or 'compare' to run all three "
                   "(default: compare)")


def check_replica_args(args: argparse.Namespace) -> None:
    """Refuse flag combinations ``--replicas`` cannot honour.

    Raises:
        InvalidArgumentError: naming the flag and the fix.
    """
    if args.router is not None and args.replicas is None:
        raise InvalidArgumentError("--router needs --replicas N")
    if args.replicas is None:
        return
    if args.mode != "engine":
        raise InvalidArgumentError("--replicas simulates engines: use it with --mode engine")
    for flag, bad in (("--rate-scale", args.rate_scale != 1.0),
                      ("--arrivals at-once", args.arrivals != "trace"),
                      ("--find-capacity", args.find_capacity),
                      ("--capacity-sweep", bool(args.capacity_sweep)),
                      ("--kv-events-endpoint", bool(args.kv_events_endpoint))):
        if bad:
            raise InvalidArgumentError(f"{flag} does not apply to --replicas; drop one of them")


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


def run_replicas_cli(workload: Workload, config: SimConfig, args: argparse.Namespace,
                     *, what: str) -> int:
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
    policies = POLICIES if args.router in (None, "compare") else (args.router,)
    n = args.replicas
    progress = ProgressReporter(enabled=not args.no_progress)
    try:
        report = compare_policies(
            workload, num_replicas=n, engine=engine, policies=policies, progress=progress,
            phase=lambda policy: progress.phase(
                f"replaying {len(workload.requests):,} requests over {n} "
                f"{'replica' if n == 1 else 'replicas'} ({policy})"))
    finally:
        progress.close()
    plot_path = Path(args.plot_dir) / "replicas.png"
    if args.json:
        out = replica_report_json(report)
        out["workload_description"] = what
        out["note"] = note
        out["plots"] = [] if args.no_plots else [str(plot_path)]
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(what)
        print(render_replica_report(report))
        if note:
            print(f"note: {note}")
    sys.stdout.flush()
    if not args.no_plots:
        try:
            written = plot_replica_reports([report], plot_path)
            msg = f"plot written to {written.resolve()}"
        except MissingDependencyError as exc:
            msg = f"plots skipped: {exc}"
        print(msg, file=sys.stderr if args.json else sys.stdout)
    return 0
