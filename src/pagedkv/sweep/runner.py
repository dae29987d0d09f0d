"""Running a sweep: check every point, load the workload once, take what the cache holds,
compute the rest on a backend, and write the rows, the Pareto front and its plot.

Every point is checked by ``simulate``'s own rules before anything runs (a contradiction
fails the whole sweep at once, naming the point); a point that fails while running gets
an error row and the others go on. Each result is stored in the cache as it arrives, so
an interrupted sweep loses only the points that were running.

>>> from pagedkv.sweep.grid import grid_from_mapping
>>> import tempfile
>>> grid = grid_from_mapping({"generator": "system-prompts", "groups": 2,
...                           "per_group": 4, "num_blocks": [500, 2000]}, where="grid")
>>> with tempfile.TemporaryDirectory() as d:
...     result = run_sweep(SweepSpec(grid=grid, out_dir=d, plot=False,
...                                  backend=LocalBackend(jobs=1)), log=lambda _s: None)
>>> result.computed, result.cached, [r["status"] for r in result.rows]
(2, 0, ['ok', 'ok'])
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedkv import __version__
from pagedkv.arg_types import check_fields
from pagedkv.errors import InvalidArgumentError, MissingDependencyError
from pagedkv.planner.gpus import resolve_gpu
from pagedkv.sim.progress import line_every_s
from pagedkv.sim.workloads import Workload
from pagedkv.sweep.backends import Backend, LocalBackend, Outcome
from pagedkv.sweep.cache import ResultCache, point_key, workload_digest
from pagedkv.sweep.grid import Grid, Point
from pagedkv.sweep.pareto import cheapest_meeting_slo, describe, plot_pareto
from pagedkv.sweep.point import point_options, point_request
from pagedkv.sweep.rows import DEFAULT_PRICES_USD_PER_GPU_HOUR, Slo, build_row, write_rows

__all__ = ["SweepResult", "SweepSpec", "check_points", "last_line", "run_sweep"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSpec:
    """A sweep: the ``grid``, the ``slo``, GPU ``prices``, where the rows go (``out_dir``)
    and the cache lives (``cache_dir``, default ``out_dir/cache``), the ``backend``, a
    progress bar, the Pareto plot."""

    grid: Grid
    out_dir: str | Path = "pagedkv-sweep"
    cache_dir: str | Path | None = None
    slo: Slo = field(default_factory=Slo)
    prices: Mapping[str, float] = field(
        default_factory=lambda: dict(DEFAULT_PRICES_USD_PER_GPU_HOUR))
    backend: Backend = field(default_factory=LocalBackend)
    progress: bool = False
    plot: bool = True

    def __post_init__(self) -> None:
        check_fields(self)  # types, finiteness, 64-bit and duration bounds


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepResult:
    """The rows (grid order), how many points were computed now and taken from the
    cache, how many failed, the files written and the workload's description."""

    rows: list[dict[str, Any]]
    computed: int
    cached: int
    errors: int
    files: list[Path]
    workload: str
    plot_note: str | None = None


def _check_values(grid: Grid) -> None:
    """Refuse an unknown GPU or model value at once (not once per point)."""
    from pagedkv.planner.bundled import load_config

    values: dict[str, set[str]] = {"gpu": set(), "model": set()}
    for dest in values:
        if grid.fixed.get(dest) is not None:
            values[dest].add(str(grid.fixed[dest]))
        for axis in grid.axes:
            if axis.dest == dest:
                values[dest].update(str(v) for v in axis.values if v is not None)
    for gpu in sorted(values["gpu"]):
        resolve_gpu(gpu)
    for model in sorted(values["model"]):
        load_config(model)


def check_points(grid: Grid) -> list[tuple[Point, dict[str, Any]]]:
    """Every point with its options, each checked by ``simulate``'s rules (no run).

    Raises:
        InvalidArgumentError: an empty grid, an unknown GPU or model, a point
            ``simulate`` refuses (named by its index and values).
    """
    grid.check()
    _check_values(grid)
    out = []
    for p in grid.points():
        opts = point_options(grid.fixed, p.values)
        try:
            point_request(opts)
        except InvalidArgumentError as exc:
            what = describe(p.labels, list(p.labels))
            raise InvalidArgumentError(f"point {p.index} ({what}): {exc}") from None
        out.append((p, opts))
    return out


class _Progress:
    """``sweep: 5/16 points · 2 cached · 1 failed · elapsed 12 s · ETA 30 s`` on a
    terminal's stderr, rewritten in place; elsewhere (a pipe, a log) a whole line every
    few seconds (:func:`pagedkv.sim.progress.line_every_s`) and the last."""

    def __init__(self, total: int, cached: int, enabled: bool) -> None:
        self.total, self.cached = total, cached
        self.enabled, self.tty = enabled, sys.stderr.isatty()
        self.t0 = self.last_line = time.monotonic()
        self.done = self.failed = 0

    def update(self, failed: bool) -> None:
        self.done += 1
        self.failed += failed
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.t0
        left = self.total - self.cached - self.done
        eta = elapsed / self.done * left
        n = self.cached + self.done
        bar = "#" * (24 * n // self.total)
        text = (f"{n}/{self.total} points · {self.cached} cached · {self.failed} failed · "
                f"elapsed {elapsed:.0f} s · ETA {eta:.0f} s")
        if self.tty:
            sys.stderr.write(f"\rsweep [{bar:<24}] {text}  ")
        elif n == self.total or time.monotonic() - self.last_line >= line_every_s():
            self.last_line = time.monotonic()
            sys.stderr.write(f"sweep: {text}\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self.done:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def _load(prepared: list[tuple[Point, dict[str, Any]]]) -> tuple[Workload, str]:
    return point_request(prepared[0][1]).workload.load()


def run_sweep(spec: SweepSpec, *, log: Callable[[str], None] = print) -> SweepResult:
    """Run ``spec`` (module docstring); ``log`` receives the progress lines.

    Raises:
        InvalidArgumentError: an empty grid, an unknown value, a point ``simulate``
            refuses.
        PagedKVError, OSError: the workload cannot be loaded; the output is not writable.
    """
    prepared = check_points(spec.grid)
    workload, what = _load(prepared)
    digest = workload_digest(prepared[0][1])
    cache = ResultCache(spec.cache_dir if spec.cache_dir is not None
                        else Path(spec.out_dir) / "cache")
    keys = [point_key(digest, opts) for _, opts in prepared]
    outcomes: dict[int, tuple[Outcome, bool]] = {}
    for (p, _opts), key in zip(prepared, keys, strict=True):
        entry = cache.get(key)
        if entry is not None:
            outcomes[p.index] = (Outcome(p.index, entry["metrics"], None,
                                         entry.get("wall_s", 0.0)), True)
    tasks = [(p.index, opts) for p, opts in prepared if p.index not in outcomes]
    backend = spec.backend
    log(f"sweep: {len(prepared)} points on {what}; {len(outcomes)} from the cache, "
        f"{len(tasks)} to compute on {backend.name}")
    progress = _Progress(len(prepared), len(outcomes), spec.progress)
    computed = 0
    try:
        for out in backend.run(workload, tasks):
            if out.error is None:
                cache.put(keys[out.index], {"metrics": out.metrics, "wall_s": out.wall_s,
                                            "options": _jsonable(prepared[out.index][1]),
                                            "pagedkv": __version__})
            outcomes[out.index] = (out, False)
            computed += 1
            progress.update(out.error is not None)
    finally:
        progress.close()
    rows = [build_row(index=p.index, labels=p.labels, options=opts,
                      metrics=outcomes[p.index][0].metrics, error=outcomes[p.index][0].error,
                      wall_s=outcomes[p.index][0].wall_s, cached=outcomes[p.index][1],
                      prices=spec.prices, slo=spec.slo) for p, opts in prepared]
    files = write_rows(rows, spec.out_dir)
    note = None
    if spec.plot:
        try:
            files.append(plot_pareto(rows, [a.dest for a in spec.grid.axes], spec.slo,
                                     Path(spec.out_dir) / "pareto.png",
                                     title=f"{len(rows)} grid points on {what}"[:110]))
        except MissingDependencyError as exc:
            note = f"plot skipped: {exc}"
    errors = sum(r["status"] == "error" for r in rows)
    return SweepResult(rows=rows, computed=computed, cached=len(prepared) - computed,
                       errors=errors, files=files, workload=what, plot_note=note)


def _jsonable(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}


def last_line(result: SweepResult, axes: list[str], slo: Slo) -> str:
    """The sweep's answer: the cheapest point that meets the SLO, or that none does."""
    target = f"TTFT p99 <= {slo.ttft_p99_s:g} s and TPOT p99 <= {slo.tpot_p99_ms:g} ms"
    best = cheapest_meeting_slo(result.rows)
    if best is None:
        return f"no point meets the SLO ({target})"
    return (f"cheapest point meeting the SLO ({target}): point {best['point']}, "
            f"{describe(best, axes)}: ${best['usd_per_hour']:.2f}/h on {best['gpus']} "
            f"{best['gpu_type']}, TTFT p99 {best['ttft_p99_s']:.3g} s, TPOT p99 "
            f"{best['tpot_p99_s'] * 1e3:.3g} ms")
