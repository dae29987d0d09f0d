"""``pagedkv simulate``: replay a workload through the KV-cache manager and report.

A thin layer over :mod:`pagedkv.sim`. With no arguments it replays the bundled default
workload (the first requests of Mooncake's conversation trace) on the capacity the planner
gives Llama-3.1-8B on one 80 GB GPU, in engine mode, and writes its plots to
``./pagedkv-report/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pagedkv.cli_args import number_arg, seconds_arg, whole_arg
from pagedkv.errors import InvalidArgumentError, MissingDependencyError
from pagedkv.events.config import KVEventsConfig
from pagedkv.sim.api import SimConfig, run, with_clock
from pagedkv.sim.clock.cli import add_clock_flags, linear_step_time, run_calibrate, step_model_of
from pagedkv.sim.generators import GENERATORS
from pagedkv.sim.host_cli import add_host_arguments, host_config_from_args
from pagedkv.sim.loaders import formats, load_trace
from pagedkv.sim.models import DEFAULT_GPU_MEMORY, DEFAULT_MODEL
from pagedkv.sim.observe_cli import SimObserving, add_observe_flags
from pagedkv.sim.plots import check_plot_dir, plot_files, write_plots
from pagedkv.sim.replicas_cli import add_replica_flags, check_replica_args, run_replicas_cli
from pagedkv.sim.report import ProgressReporter, print_report
from pagedkv.sim.retention_support import add_arguments as add_retention_arguments
from pagedkv.sim.scheduler import SchedulerConfig
from pagedkv.sim.search import find_capacity, parse_seconds
from pagedkv.sim.semantics import SEMANTICS
from pagedkv.sim.workloads import Workload, bundled_trace_path

__all__ = ["add_parser", "main_run"]

DEFAULT_SWEEP_TOKENS: tuple[int | None, ...] = (
    10_000, 100_000, 1_000_000, 3_000_000, 10_000_000, None
)

# generator name -> {flag dest: generator keyword}
_GEN_PARAMS: dict[str, dict[str, str]] = {
    "system-prompts": {
        "groups": "num_groups", "per_group": "questions_per_group",
        "shared_tokens": "system_tokens", "message_tokens": "question_tokens",
        "output_tokens": "output_tokens", "interval_s": "interval_s",
    },
    "multi-turn": {
        "sessions": "num_conversations", "turns": "num_turns",
        "shared_tokens": "system_tokens", "message_tokens": "user_tokens",
        "output_tokens": "output_tokens", "interval_s": "interval_s", "think_s": "think_s",
    },
    "agent": {
        "sessions": "num_agents", "turns": "num_steps",
        "shared_tokens": "tool_prefix_tokens", "first_tokens": "task_tokens",
        "message_tokens": "observation_tokens", "output_tokens": "action_tokens",
        "interval_s": "interval_s", "think_s": "think_s",
    },
}
# Numeric option types: finite, in range (pagedkv.cli_args); a bad value is a usage error.
_FRACTION = number_arg("--gpu-memory-utilization", minimum=0, minimum_exclusive=True,
                       maximum=1)
_STAGGER_S = seconds_arg("--session-stagger-s", allow_zero=True)
_INTERVAL_S = seconds_arg("--interval-s", allow_zero=True)
_THINK_S = seconds_arg("--think-s", allow_zero=True)
_RATE_SCALE = number_arg("--rate-scale", minimum=0, minimum_exclusive=True, maximum=1e6)
_WARMUP = number_arg("--warmup-fraction", minimum=0, maximum=1, maximum_exclusive=True)
_ALL_GEN_FLAGS = sorted({d for m in _GEN_PARAMS.values() for d in m})


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``simulate`` on an argparse sub-parsers action with ``func=main_run``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="replay a workload through the KV-cache manager and report hit rates",
        description=(
            "Replay a workload through a continuous-batching scheduler (engine mode) or "
            "lookup-store-free (pure-cache mode) on the KV-cache manager, and report the "
            "prefix-cache hit rate beside the Belady optimum and the infinite-cache "
            "ceiling, KV usage, evictions, preemptions, queueing and TTFT. With no "
            "arguments: the bundled head of Mooncake's conversation trace, on the capacity "
            f"of {DEFAULT_MODEL} on one {DEFAULT_GPU_MEMORY} GPU."
        ),
    )
    w = p.add_argument_group("workload (default: the bundled Mooncake conversation head)")
    src = w.add_mutually_exclusive_group()
    src.add_argument("--trace", metavar="PATH",
                     help="a trace file (Mooncake JSONL, Azure CSV, kv-cache-tester session "
                     "JSON; .gz too), a directory of session files, or a glob")
    src.add_argument("--generator", choices=sorted(GENERATORS),
                     help="a synthetic workload with an analytic ideal hit rate")
    w.add_argument("--trace-format", choices=["auto", *formats()], default="auto",
                   help="trace format (default: detected from the content, else the name)")
    w.add_argument("--session-stagger-s", type=_STAGGER_S, default=0.0, metavar="S",
                   help="several files: file k starts k*S seconds after the first (default 0)")
    w.add_argument("--trace-block-size", default=512, metavar="TOKENS",
                   type=whole_arg("--trace-block-size", minimum=1, maximum=10_000_000),
                   help="tokens per hash_ids entry of a JSONL trace (default 512)")
    w.add_argument("--limit", type=int, metavar="N", help="replay only the first N requests")
    w.add_argument("--skip-bad-lines", action="store_true",
                   help="skip and count malformed trace lines instead of failing")
    g = p.add_argument_group("generator parameters (defaults per generator; see docs)")
    g.add_argument("--groups", type=int, metavar="N", help="system-prompts: system prompts")
    g.add_argument("--per-group", type=int, metavar="N",
                   help="system-prompts: questions per system prompt")
    g.add_argument("--sessions", type=int, metavar="N",
                   help="multi-turn: conversations; agent: agents")
    g.add_argument("--turns", type=int, metavar="N", help="multi-turn: turns; agent: steps")
    g.add_argument("--shared-tokens", type=int, metavar="TOKENS",
                   help="shared system prompt / tool prefix length")
    g.add_argument("--message-tokens", type=int, metavar="TOKENS",
                   help="question / user message / observation length")
    g.add_argument("--first-tokens", type=int, metavar="TOKENS", help="agent: task length")
    g.add_argument("--output-tokens", type=int, metavar="TOKENS",
                   help="answer / reply / action length")
    g.add_argument("--interval-s", type=_INTERVAL_S, metavar="S",
                   help="seconds between request (session) starts")
    g.add_argument("--think-s", type=_THINK_S, metavar="S",
                   help="multi-turn, agent: seconds from a reply to the next turn")
    c = p.add_argument_group("cache capacity")
    c.add_argument("--block-size", type=int, default=16, metavar="TOKENS",
                   help="tokens per block (default 16; a divisor or multiple of the "
                   "trace's hash block size)")
    c.add_argument("--num-blocks", type=int, metavar="N",
                   help="blocks in the pool, the null block included")
    c.add_argument("--model", metavar="MODEL",
                   help=f"size the pool with the planner: config.json or bundled name "
                   f"(default without --num-blocks: {DEFAULT_MODEL})")
    c.add_argument("--gpu-memory", metavar="SIZE",
                   help=f"GPU memory for --model (default {DEFAULT_GPU_MEMORY}: an '80 GB' H100)")
    c.add_argument("--gpu-memory-utilization", type=_FRACTION, default=0.9, metavar="FRACTION",
                   help="share of GPU memory the engine may use (default 0.9)")
    c.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel size for --model (default 1)")
    e = p.add_argument_group("engine")
    e.add_argument("--semantics", choices=list(SEMANTICS), default="vllm",
                   help="vllm: full blocks only, the last token recomputed (default); "
                   "reference: every hash id incl. the partial last block is stored and "
                   "credited, as in the published Mooncake curves (pure-cache mode)")
    e.add_argument("--mode", choices=["engine", "pure-cache"], default="engine",
                   help="engine: continuous batching with a simulated clock (default); "
                   "pure-cache: lookup, store, free, one request at a time")
    e.add_argument("--token-budget", type=int, default=8192, metavar="TOKENS",
                   help="tokens computed per step (default 8192)")
    e.add_argument("--max-running", type=int, default=256, metavar="N",
                   help="most requests running at once (default 256)")
    e.add_argument("--rate-scale", type=_RATE_SCALE, default=1.0, metavar="X",
                   help="arrival rate multiplier: 2 = twice as fast (default 1)")
    e.add_argument("--arrivals", choices=["trace", "at-once"], default="trace",
                   help="arrival times from the workload (default) or all at time 0")
    add_clock_flags(e)
    a = p.add_argument_group("analysis and output")
    a.add_argument("--capacity-sweep", nargs="?", const="default", metavar="TOKENS,...",
                   help="also report pure-cache hit rate vs capacity (LRU, Belady, "
                   "infinite); default capacities 1e4,1e5,1e6,3e6,1e7,unlimited tokens")
    a.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="processes for capacity-sweep points and bounds (default: CPU count)")
    a.add_argument("--find-capacity", action="store_true",
                   help="also search the KV memory or replicas that meet --ttft-p99")
    a.add_argument("--ttft-p99", default="2s", metavar="DURATION",
                   help="TTFT p99 target for --find-capacity (default 2s)")
    a.add_argument("--warmup-fraction", type=_WARMUP, default=0.5, metavar="F",
                   help="'after warm-up' rates count requests from this fraction on "
                   "(default 0.5)")
    a.add_argument("--no-bounds", action="store_true",
                   help="skip the Belady and infinite-cache bounds")
    a.add_argument("--json", action="store_true", help="print JSON instead of tables")
    a.add_argument("--plot-dir", default="pagedkv-report", metavar="DIR",
                   help="where PNG plots go (default ./pagedkv-report)")
    a.add_argument("--no-plots", action="store_true", help="write no plots")
    a.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev = p.add_argument_group("KV-cache events (engine mode; needs pagedkv[events])")
    ev.add_argument("--kv-events-endpoint", default=None, metavar="ENDPOINT",
                    help="publish the simulated engine's KV-cache events live on this ZeroMQ "
                    "PUB endpoint in vLLM's wire format (e.g. tcp://127.0.0.1:5557)")
    ev.add_argument("--kv-events-replay-endpoint", default=None, metavar="ENDPOINT",
                    help="ROUTER endpoint serving replay and snapshot requests")
    ev.add_argument("--kv-events-topic", default="", help="topic frame, e.g. kv@pod@model")
    ev.add_argument("--kv-events-form", choices=("map", "array"), default="map",
                    help="map: vLLM >= 0.24; array: vLLM <= 0.23")
    ev.add_argument("--kv-events-allow-remote", action="store_true",
                    help="allow endpoints that listen beyond this host (tcp://*:PORT, "
                    "0.0.0.0): the messages carry prompt token ids, unauthenticated")
    add_retention_arguments(a)
    a.add_argument("--check-invariants", action="store_true",
                   help="debug: walk the manager's state after every step (slow)")
    add_replica_flags(p)
    add_observe_flags(p)
    add_host_arguments(p)
    p.set_defaults(func=main_run)
    return p


def _workload(args: argparse.Namespace) -> tuple[Workload, str]:
    given = [f for f in _ALL_GEN_FLAGS if getattr(args, f) is not None]
    if args.generator is None:
        if given:
            raise InvalidArgumentError(
                f"--{given[0].replace('_', '-')} is a generator parameter; add --generator"
            )
        path = Path(args.trace) if args.trace else bundled_trace_path()
        wl = load_trace(path, fmt=args.trace_format, skip_bad_lines=args.skip_bad_lines,
                        limit=args.limit, source_block_size=args.trace_block_size,
                        session_stagger_s=args.session_stagger_s)
        what = wl.description if args.trace else f"bundled default workload: {wl.description}"
        if wl.num_skipped_lines:
            what += f"; {wl.num_skipped_lines} bad lines skipped (first: " \
                    f"{wl.first_skipped_problem})"
        return wl, what
    mapping = _GEN_PARAMS[args.generator]
    for f in given:
        if f not in mapping:
            raise InvalidArgumentError(
                f"--{f.replace('_', '-')} does not apply to --generator {args.generator}"
            )
    kwargs = {mapping[f]: getattr(args, f) for f in given}
    wl = GENERATORS[args.generator](**kwargs).limited(args.limit)
    return wl, f"generator {args.generator}: {wl.description}"


def _sweep_capacities(text: str) -> list[int | None]:
    if text == "default":
        return list(DEFAULT_SWEEP_TOKENS)
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("unlimited", "inf", "none"):
            out.append(None)
            continue
        try:
            out.append(int(float(part)))
        except ValueError:
            raise InvalidArgumentError(
                f"--capacity-sweep: {part!r} is not a token count (e.g. 1e6) or 'unlimited'"
            ) from None
    return out


def _config(args: argparse.Namespace) -> SimConfig:
    step = linear_step_time(args)
    kv_events = None
    if args.kv_events_endpoint:
        kv_events = KVEventsConfig(
            endpoint=args.kv_events_endpoint,
            replay_endpoint=args.kv_events_replay_endpoint,
            topic=args.kv_events_topic,
            wire_form=args.kv_events_form,
            allow_remote=args.kv_events_allow_remote,
        )
    sched = SchedulerConfig(
        token_budget=args.token_budget, max_running=args.max_running,
        arrivals=args.arrivals, rate_scale=args.rate_scale, step_time=step,
        check_invariants_every_step=args.check_invariants, kv_events=kv_events,
    )
    return SimConfig(
        mode=args.mode, semantics=args.semantics, block_size=args.block_size,
        num_blocks=args.num_blocks, model=args.model, gpu_memory=args.gpu_memory,
        gpu_memory_utilization=args.gpu_memory_utilization, tp=args.tp, scheduler=sched,
        bounds=not args.no_bounds, warmup_fraction=args.warmup_fraction,
        capacity_sweep=tuple(_sweep_capacities(args.capacity_sweep))
        if args.capacity_sweep else (),
        jobs=args.jobs, check_invariants=args.check_invariants, retention=args.retention,
        host=host_config_from_args(args), gpu=args.gpu, step_model=step_model_of(args),
        calibration=args.calibration,
    )


def main_run(args: argparse.Namespace) -> int:
    """Run ``pagedkv simulate`` for parsed ``args``: parse, call :func:`pagedkv.sim.run`,
    render. Returns the exit code.

    Raises:
        PagedKVError: bad input (trace lines, impossible settings); the CLI prints it.
    """
    if args.limit is not None and args.limit < 1:
        raise InvalidArgumentError(f"--limit must be >= 1, got {args.limit}")
    if args.kv_events_endpoint and args.mode != "engine":
        raise InvalidArgumentError(
            "--kv-events-endpoint publishes the events of the simulated engine: use it with "
            "--mode engine"
        )
    if args.calibrate:
        return run_calibrate(args)
    check_replica_args(args)
    SimObserving.check_args(args)
    ttft_target = parse_seconds(args.ttft_p99) if args.find_capacity else None
    if args.find_capacity and args.mode != "engine":
        raise InvalidArgumentError("--find-capacity needs --mode engine (TTFT is an engine "
                                   "figure)")
    config = _config(args)
    plots_wanted = not args.no_plots
    if plots_wanted:
        check_plot_dir(args.plot_dir)  # before the replay, not after it
    if args.replicas is not None:
        wl, what = _workload(args)
        return run_replicas_cli(wl, with_clock(config, wl), args, what=what)
    progress = ProgressReporter(enabled=not args.no_progress)
    wl, what = _workload(args)
    if args.mode == "engine":
        config = with_clock(config, wl)  # find-capacity replays on the same clock
    observing = SimObserving.from_args(args)  # --explain-misses, --metrics-port
    try:
        report = run(wl, config, description=what, progress=progress, phase=progress.phase,
                     observer=observing.observer if observing is not None else None)
        search = None
        if ttft_target is not None:
            base = None
            if report.engine is not None and not report.rejected_requests:
                base = report.engine.ttft.p99
            search = find_capacity(wl, config, ttft_p99_s=ttft_target,
                                   baseline_ttft_p99_s=base, phase=progress.phase)
    except BaseException:
        if observing is not None:
            observing.close()
        raise
    finally:
        progress.close()
    out = report.to_dict()
    if search is not None:
        out["find_capacity"] = {
            "ttft_p99_target_s": search.ttft_p99_target_s,
            "memory_scale": search.memory_scale, "num_blocks": search.num_blocks,
            "replicas": search.replicas,
            "tried": [{"what": w, "ttft_p99_s": None if t is None or t == float("inf")
                       else t} for w, t in search.tried],
        }
    out["plots"] = [str(p) for p in plot_files(report, args.plot_dir)] if plots_wanted else []
    cap = report.capacity
    if observing is not None and args.json:
        observing.report(out, json_mode=True)
    if args.json:
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        sys.stdout.flush()
    else:
        print_report(report)
        print(f"capacity: {cap.source}" + (f"; {cap.note}" if cap.note else ""))
        if search is not None:
            print(f"find capacity: {search.summary()}")
        sys.stdout.flush()
        if observing is not None:
            observing.report(out, json_mode=False)
    if plots_wanted:  # after the report: a plotting problem never loses it
        note = _plots(report, args.plot_dir)
        print(note, file=sys.stderr if args.json else sys.stdout)
    if observing is not None:
        observing.finish(plot_dir=args.plot_dir if plots_wanted else None,
                         json_mode=args.json, title=what)
    return 0


def _plots(report: Any, plot_dir: str) -> str:
    try:
        plots = write_plots(report, plot_dir)
    except MissingDependencyError as exc:
        return f"plots skipped: {exc}"
    return (f"plots written to {Path(plot_dir).resolve()}: "
            + ", ".join(p.name for p in plots))
