"""Where a sweep's points run: one interface, two engines.

A backend takes the workload once and the points' options, and yields each point's
:class:`Outcome` as it finishes (any order). :class:`LocalBackend` (the default) runs
them in forked worker processes on this machine; the workload is set before the fork, so
every worker shares the parent's copy instead of receiving one per point. ``jobs=1`` (or
a platform without ``fork``) runs them here, one after the other. The Ray backend lives in
:mod:`pagedkv.sweep.ray_backend`.

A point that raises becomes an outcome with ``error`` set (``"ExceptionName: message"``);
a worker process that dies takes only its own points with it.

>>> from pagedkv.sim import system_prompts
>>> wl = system_prompts(num_groups=2, questions_per_group=4)
>>> outs = sorted(LocalBackend(jobs=1).run(wl, [(0, {"num_blocks": 2000}),
...                                             (1, {"num_blocks": 1})]))
>>> outs[0].error is None, outs[1].error.split(":")[0]
(True, 'InvalidArgumentError')
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Protocol

from pagedkv.sim.workloads import Workload
from pagedkv.sweep.point import run_point

__all__ = ["Backend", "LocalBackend", "Outcome", "Task", "compute"]

#: (point index, the point's options)
Task = tuple[int, Mapping[str, Any]]


@dataclass(frozen=True, slots=True, order=True)
class Outcome:
    """What one point gave: its ``metrics`` (:data:`pagedkv.sweep.point.METRICS`), or the
    ``error`` it raised; ``wall_s`` it took where it ran."""

    index: int
    metrics: dict[str, Any] | None
    error: str | None
    wall_s: float


class Backend(Protocol):
    """Runs points; ``workers`` how many at once; ``name`` for messages."""

    name: str
    workers: int

    def run(self, workload: Workload, tasks: Sequence[Task]) -> Iterator[Outcome]:
        """Yield each task's outcome as it finishes."""
        ...


def _error_text(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def compute(workload: Workload, index: int, options: Mapping[str, Any]) -> Outcome:
    """Run one point, catching what it raises into the outcome."""
    t0 = time.perf_counter()
    try:
        metrics = run_point(workload, options)
    except Exception as exc:  # the point's row records it; the others go on
        return Outcome(index, None, _error_text(exc), time.perf_counter() - t0)
    return Outcome(index, metrics, None, time.perf_counter() - t0)


# What forked workers read (set before the pool forks; a fork shares it).
_SHARED: dict[str, Workload] = {}


def _worker(index: int, options: Mapping[str, Any]) -> Outcome:
    return compute(_SHARED["workload"], index, options)


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


class LocalBackend:
    """Points in ``jobs`` forked processes on this machine (None: the CPU count)."""

    name = "local"

    def __init__(self, jobs: int | None = None) -> None:
        self.workers = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
        if not _can_fork():
            self.workers = 1

    def run(self, workload: Workload, tasks: Sequence[Task]) -> Iterator[Outcome]:
        if self.workers < 2 or len(tasks) < 2:
            for index, options in tasks:
                yield compute(workload, index, options)
            return
        _SHARED["workload"] = workload
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)),
                                   mp_context=multiprocessing.get_context("fork"))
        try:
            futures: dict[Future[Outcome], int] = {
                pool.submit(_worker, index, options): index for index, options in tasks}
            for fut in as_completed(futures):
                try:
                    yield fut.result()
                except Exception as exc:  # the worker process died (killed, out of memory)
                    yield Outcome(futures[fut], None,
                                  f"worker process failed: {_error_text(exc)}", 0.0)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            _SHARED.pop("workload", None)
