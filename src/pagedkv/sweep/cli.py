"""``pagedkv sweep GRID``: a grid of ``simulate`` runs, on local processes or Ray; rows,
the Pareto front of cost vs TTFT p99, and the cheapest point that meets the SLO.

A thin shell over :func:`pagedkv.sweep.runner.run_sweep`: it builds the grid from the
file, ``--set`` and ``--axis``, picks the backend, prints the tables and returns 1 when
a point failed (after writing everything). See ``docs/sweep.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pagedkv.cli_args import number_arg, whole_arg
from pagedkv.sweep.backends import Backend, LocalBackend
from pagedkv.sweep.grid import grid_from_flags
from pagedkv.sweep.pareto import pareto_table
from pagedkv.sweep.rows import Slo, load_prices
from pagedkv.sweep.runner import SweepResult, SweepSpec, check_points, last_line, run_sweep

__all__ = ["add_parser", "main_run", "rows_table"]

_DESCRIPTION = (
    "Run a grid of `pagedkv simulate` points (any simulate option as an axis: model, "
    "gpu, tp, gpu-memory, num-blocks, replicas, router, retention, host-memory, "
    "block-size, rate-scale, ...) on local processes or a Ray cluster. Writes one row "
    "per point (CSV, JSON, Parquet with pyarrow), the Pareto front of cost vs TTFT p99 "
    "(table and plot), and ends with the cheapest point that meets the SLO. Results are "
    "cached per point: a re-run computes only new points.")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sweep`` on an argparse sub-parsers action with ``func=main_run``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sweep", help="run a grid of simulations (local processes or Ray) and find the "
        "cheapest deployment that meets an SLO", description=_DESCRIPTION)
    p.add_argument("grid", nargs="?", metavar="GRID",
                   help="grid file (.yaml, .json, .toml): simulate options -> a value "
                   "(fixed) or a list of values (an axis)")
    p.add_argument("--axis", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="an axis (repeatable; added to the file's)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a fixed option for every point, e.g. --set limit=300 (repeatable)")
    p.add_argument("--slo-ttft-p99-s", type=number_arg("--slo-ttft-p99-s", minimum=0,
                   minimum_exclusive=True, maximum=1e9), default=2.0, metavar="S",
                   help="TTFT p99 target in seconds (default 2)")
    p.add_argument("--slo-tpot-p99-ms", type=number_arg("--slo-tpot-p99-ms", minimum=0,
                   minimum_exclusive=True, maximum=1e9), default=50.0, metavar="MS",
                   help="TPOT p99 target in milliseconds (default 50)")
    p.add_argument("--prices", metavar="FILE", help="JSON or TOML object of GPU name -> "
                   "US$ per GPU-hour, over the built-in table")
    p.add_argument("--out", default="pagedkv-sweep", metavar="DIR",
                   help="where rows.csv/.json/.parquet and pareto.png go (default "
                   "./pagedkv-sweep)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="per-point result cache (default OUT/cache)")
    p.add_argument("--jobs", type=whole_arg("--jobs", minimum=1, maximum=1024), metavar="N",
                   help="local worker processes (default: the CPU count); with --ray "
                   "auto starting Ray here: its CPUs")
    p.add_argument("--ray", nargs="?", const="auto", metavar="auto|ADDRESS",
                   help="run the points as Ray tasks (pagedkv[ray]): auto = the running "
                   "cluster, else a local Ray on 127.0.0.1; or HOST:PORT / ray://HOST:PORT")
    p.add_argument("--no-plot", action="store_true", help="write no Pareto plot")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main_run)
    return p


def _num(x: Any, scale: float = 1.0, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x * scale:.{digits}g}"
    return str(x)


def rows_table(rows: Sequence[Mapping[str, Any]], axes: Sequence[str]) -> str:
    """The rows as a text table: point, axis values, hit rate, TTFT p50/p99 (s), TPOT
    p99 (ms), output tok/s, preemptions, GPUs, $/h, SLO (or the error)."""
    head = ["point", *axes, "hit %", "TTFT p50 s", "TTFT p99 s", "TPOT p99 ms", "tok/s",
            "preempt", "GPUs", "$/h", "SLO"]
    body = []
    for r in rows:
        cells = [str(r["point"]), *(str(r.get(a)) for a in axes)]
        if r["status"] == "error":
            body.append([*cells, f"error: {r['error']}"[:90]])
            continue
        cost = r.get("usd_per_hour")
        body.append([*cells, _num(r.get("hit_rate"), 100), _num(r.get("ttft_p50_s")),
                     _num(r.get("ttft_p99_s")), _num(r.get("tpot_p99_s"), 1e3),
                     _num(r.get("output_tokens_per_s"), digits=4), _num(r.get("preemptions")),
                     _num(r.get("gpus")), "—" if cost is None else f"{cost:.2f}",
                     "met" if r.get("meets_slo") else "missed"])
    widths = [max((len(b[i]) for b in body if i < len(b) and not b[i].startswith("error")),
                  default=0) for i in range(len(head))]
    widths = [max(w, len(h)) for w, h in zip(widths, head, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    for b in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(b, widths, strict=False)).rstrip())
    return "\n".join(lines)


def _backend(args: argparse.Namespace) -> tuple[Backend, Any]:
    if args.ray is None:
        return LocalBackend(jobs=args.jobs), None
    from pagedkv.sweep.ray_backend import RayBackend

    ray_backend = RayBackend(args.ray, num_cpus=args.jobs)
    ray_backend.open()  # a missing extra or an unreachable cluster: one line, now
    return ray_backend, ray_backend


def _print(result: SweepResult, axes: list[str], slo: Slo, shown_rows: int = 60) -> None:
    rows = result.rows
    print(rows_table(rows[:shown_rows], axes))
    if len(rows) > shown_rows:
        print(f"... {len(rows) - shown_rows} more rows in {Path(result.files[0])}")
    print()
    print("Pareto front (cost vs TTFT p99):")
    print(pareto_table(rows, axes))
    print()
    print(f"computed {result.computed} points, {result.cached} from the cache, "
          f"{result.errors} failed; written: {', '.join(str(f) for f in result.files)}")
    if result.plot_note:
        print(result.plot_note)
    if result.errors:
        print(f"{result.errors} point(s) failed: their rows hold the error; the others are "
              "complete", file=sys.stderr)
    print(last_line(result, axes, slo))


def main_run(args: argparse.Namespace) -> int:
    """Run ``pagedkv sweep`` for parsed ``args``; 1 when a point failed, else 0.

    Raises:
        PagedKVError, OSError: bad input (the CLI prints one line).
    """
    grid = grid_from_flags(args.grid, args.axis, args.set)
    check_points(grid)  # every point, before a backend starts
    slo = Slo(ttft_p99_s=args.slo_ttft_p99_s, tpot_p99_ms=args.slo_tpot_p99_ms)
    prices = load_prices(args.prices)
    backend, ray_backend = _backend(args)
    try:
        result = run_sweep(SweepSpec(grid=grid, out_dir=args.out, cache_dir=args.cache_dir,
                                     slo=slo, prices=prices, backend=backend,
                                     progress=not args.no_progress, plot=not args.no_plot),
                           log=lambda s: print(s, file=sys.stderr, flush=True))
    finally:
        if ray_backend is not None:
            ray_backend.close()
    _print(result, [a.dest for a in grid.axes], slo)
    return 1 if result.errors else 0
