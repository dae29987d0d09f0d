"""``pagedkv simulate``: replay a workload through the KV-cache manager and report.

A thin shell: the options come from :mod:`pagedkv.sim.options`, their values become a
run in :func:`pagedkv.sim.setup.simulate_request`, :func:`pagedkv.sim.run` (and, with
``--find-capacity``, :func:`pagedkv.sim.search.search_deployment`) compute, and this
module renders. With no
arguments it replays the bundled default workload (the first requests of Mooncake's
conversation trace) on the capacity the planner gives Llama-3.1-8B on one 80 GB GPU, in
engine mode, and writes its plots to ``./pagedkv-report/``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagedkv.errors import ConfigError, InsufficientMemoryError, MissingDependencyError
from pagedkv.sim.api import run, with_clock
from pagedkv.sim.clock.cli import run_calibrate
from pagedkv.sim.observe_cli import SimObserving
from pagedkv.sim.options import DESCRIPTION, add_simulate_options
from pagedkv.sim.plots import check_plot_dir, plot_files, write_plots
from pagedkv.sim.replicas_cli import run_replicas_cli
from pagedkv.sim.report import ProgressReporter, print_report
from pagedkv.sim.search import reproducing_args, search_deployment
from pagedkv.sim.setup import CalibrateRequest, SimulateRequest, simulate_request
from pagedkv.sim.summary import SimReport, searched

if TYPE_CHECKING:
    from pagedkv.sweep.capacity import CapacityAnswer

__all__ = ["add_parser", "main_run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``simulate`` on an argparse sub-parsers action with ``func=main_run``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="replay a workload through the KV-cache manager and report hit rates",
        description=DESCRIPTION,
    )
    add_simulate_options(p)
    p.set_defaults(func=main_run)
    return p


def main_run(args: argparse.Namespace) -> int:
    """Run ``pagedkv simulate`` for parsed ``args``: the request they make, the library
    calls, the rendering. Returns the exit code.

    Raises:
        PagedKVError: bad input (trace lines, impossible settings); the CLI prints it.
            A pool that cannot hold the longest request says which simulate options help.
    """
    try:
        return _main_run(args)
    except InsufficientMemoryError as exc:
        what = str(exc).split(". Lower max_model_len")[0]
        fits = exc.max_model_len_that_fits
        if fits > 0 and getattr(args, "max_model_len", 0) is None \
                and getattr(args, "num_blocks", 0) is None:
            # at the model's defaults: the longest context that fits, said first
            print(f"note: max_model_len capped to {fits:,}, the longest the KV cache holds "
                  "(longer requests are rejected); give --max-model-len N, a larger --tp or "
                  "a larger GPU to change it", file=sys.stderr)
            args.max_model_len = fits
            return _main_run(args)
        cap = f"--max-model-len {fits} (longer requests are rejected), " if fits > 0 else ""
        raise ConfigError(f"{what}: use {cap}--tp N, or a larger GPU (--gpu, --gpu-memory, "
                          "--gpu-memory-utilization)") from None


def _main_run(args: argparse.Namespace) -> int:
    request = simulate_request(vars(args))
    if isinstance(request, CalibrateRequest):
        return run_calibrate(request)
    out = request.output
    if out.plot_dir is not None:
        check_plot_dir(out.plot_dir)  # before the replay, not after it
    wl, what = request.workload.load()
    config = with_clock(request.config, wl) if request.config.mode == "engine" \
        else request.config  # find-capacity replays on the same clock
    if request.replicas is not None:
        return run_replicas_cli(wl, config, request.replicas, out, what=what,
                                observe=request.observe)
    progress = ProgressReporter(enabled=out.progress)
    observing = SimObserving.start(request.observe)  # --explain-misses, --metrics-port
    try:
        report = run(wl, config, description=what, progress=progress, phase=progress.phase,
                     observer=observing.observer if observing is not None else None)
        search = None
        if request.ttft_p99_target_s is not None or (
                not args.no_find_capacity and _searches_by_default(request, report)):
            progress.close()
            search = search_deployment(
                wl, vars(args), ttft_p99_s=request.ttft_p99_target_s or 2.0,
                tpot_p99_s=request.tpot_p99_target_s or 0.1,
                log=None if not out.progress else lambda s: print(s, file=sys.stderr))
            report = searched(report)
    except BaseException:
        if observing is not None:
            observing.close()
        raise
    finally:
        progress.close()
    _render(request, report, search, observing,
            reproducing_args(list(getattr(args, "argv", ["simulate"]))[1:]))
    if observing is not None:
        clock = str((report.clock or {}).get("description", ""))  # model, TP, GPU
        observing.finish(plot_dir=out.plot_dir, json_mode=out.json,
                         title=f"{what}\nclock {clock}" if clock else what)
    return 0


def _searches_by_default(request: SimulateRequest, report: SimReport) -> bool:
    """Whether the verdict itself names the cheapest deployment for the default SLO:
    the bundled default workload (any ``--limit``) found saturated on the roofline clock
    (so the search has its prefill floor and stays bounded)."""
    spec = request.workload
    return (spec.trace is None and spec.generator is None and report.verdict is not None
            and report.verdict.state == "saturated" and report.clock is not None
            and report.clock.get("clock") == "roofline")


def _render(request: SimulateRequest, report: SimReport, search: CapacityAnswer | None,
            observing: SimObserving | None, base_args: list[str]) -> None:
    """Print the report (tables or JSON), then write the plots."""
    opts = request.output
    out = report.to_dict()
    if search is not None:
        out["find_capacity"] = search.to_dict(base_args)
    if report.verdict is not None and report.verdict.advice:
        out["next_command"] = next_command(base_args)
    out["plots"] = [] if opts.plot_dir is None else [
        str(p) for p in plot_files(report, opts.plot_dir)]
    if opts.json:
        if observing is not None:
            observing.report(out, json_mode=True)
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        sys.stdout.flush()
    else:
        cap = report.capacity
        print_report(report)
        print(f"capacity: {cap.source}" + (f"; {cap.note}" if cap.note else ""))
        if search is not None:
            print("\n".join(search.lines(base_args)))
        if report.verdict is not None and report.verdict.advice:
            print(f"next: {next_command(base_args)}")
        sys.stdout.flush()
        if observing is not None:
            observing.report(out, json_mode=False)
    if opts.plot_dir is not None:  # after the report: a plotting problem never loses it
        note = _plots(report, opts.plot_dir)
        print(note, file=sys.stderr if opts.json else sys.stdout)


def next_command(base_args: list[str]) -> str:
    """The command a verdict's advice points to: this run's workload and settings with
    ``--find-capacity`` for the default SLO (TTFT p99 2 s, TPOT p99 100 ms)."""
    args = [a for a in base_args if a != "--no-bounds"]
    return shlex.join(["pagedkv", "simulate", *args, "--find-capacity", "--ttft-p99", "2s",
                       "--tpot-p99", "100ms", "--no-plots"])


def _plots(report: Any, plot_dir: str) -> str:
    try:
        plots = write_plots(report, plot_dir)
    except MissingDependencyError as exc:
        return f"plots skipped: {exc}"
    return (f"plots written to {Path(plot_dir).resolve()}: "
            + ", ".join(p.name for p in plots))
