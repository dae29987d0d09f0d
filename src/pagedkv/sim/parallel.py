"""Running independent pieces of a simulation in worker processes: the bounds beside the
replay, and the points of a capacity sweep (``jobs`` processes, one progress bar).

Workers are forked (on platforms that have ``fork``), so they inherit the workload
instead of receiving a pickled copy; elsewhere, or with ``jobs=1``, everything runs in
this process, one piece after the other, with identical results.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing.connection import Connection
from typing import Any

from pagedkv.errors import PagedKVError
from pagedkv.sim.bounds import BoundResult, access_sequence, belady_hits, infinite_cache_hits
from pagedkv.sim.pure_cache import SweepRow, sweep_point
from pagedkv.sim.workloads import Workload

__all__ = ["bounds_in_background", "resolve_jobs", "sweep_rows"]

# What forked workers read (set just before the fork; a fork copies it).
_SHARED: dict[str, Any] = {}


def resolve_jobs(jobs: int | None) -> int:
    """``jobs``, or the CPU count when None; 1 where processes cannot be forked."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, jobs if jobs is not None else (os.cpu_count() or 1))


def _pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers,
                               mp_context=multiprocessing.get_context("fork"))


def _bounds(
    workload: Workload, block_size: int, capacity_blocks: int, indices: Sequence[int] | None,
    with_outputs: bool, semantics: str,
) -> tuple[BoundResult, BoundResult]:
    seq = access_sequence(workload, block_size, with_outputs=with_outputs, indices=indices,
                          semantics=semantics)
    return infinite_cache_hits(seq), belady_hits(seq, capacity_blocks)


def _bounds_child(send: Connection) -> None:
    """The forked worker: compute the bounds, send ``(True, value)`` or ``(False, error)``."""
    try:
        send.send((True, _bounds(*_SHARED["bounds"])))
    except BaseException as exc:  # reported to the parent, which raises it
        send.send((False, exc))
    finally:
        send.close()


class _BackgroundBounds:
    """(infinite, Belady) computed in one forked, daemonic worker process.

    Calling the object waits for the value (raising what the worker raised) and reaps the
    worker. A caller that fails before calling it leaves a daemonic child, which the
    interpreter terminates at exit: no executor threads, nothing to hang or to print.
    """

    def __init__(self, args: tuple[Any, ...]) -> None:
        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        _SHARED["bounds"] = args
        try:
            self._proc = ctx.Process(target=_bounds_child, args=(send,), daemon=True)
            self._proc.start()
        finally:
            _SHARED.pop("bounds", None)
            send.close()

    def __call__(self) -> tuple[BoundResult, BoundResult]:
        try:
            ok, value = self._recv.recv()
        except EOFError:
            raise PagedKVError(
                f"the bounds worker process exited with code {self._proc.exitcode} before "
                "answering: rerun with --jobs 1 to compute the bounds in this process"
            ) from None
        finally:
            self._recv.close()
            self._proc.join()
        if not ok:
            raise value
        result: tuple[BoundResult, BoundResult] = value
        return result


def bounds_in_background(
    workload: Workload,
    block_size: int,
    capacity_blocks: int,
    *,
    indices: Sequence[int] | None,
    with_outputs: bool,
    semantics: str,
    jobs: int | None,
) -> Callable[[], tuple[BoundResult, BoundResult]]:
    """Start computing (infinite, Belady) for ``workload`` in a worker process when
    ``jobs`` allows more than one; returns a function that waits for and returns them
    (computing them there and then when running in this process)."""
    args = (workload, block_size, capacity_blocks, indices, with_outputs, semantics)
    if resolve_jobs(jobs) < 2:
        return lambda: _bounds(*args)
    return _BackgroundBounds(args)


def _point_worker(cap: int | None) -> SweepRow:
    workload, seq, inf, warmup, semantics = _SHARED["sweep"]
    return sweep_point(workload, seq, inf, cap, warmup_fraction=warmup, semantics=semantics)


def sweep_rows(
    workload: Workload,
    *,
    block_size: int,
    capacities: Sequence[int | None],
    warmup_fraction: float,
    semantics: str = "vllm",
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[SweepRow]:
    """The capacity sweep's rows (in ``capacities`` order), points run by up to ``jobs``
    processes; ``progress(points done, points)`` after each."""
    seq = access_sequence(workload, block_size, semantics=semantics)
    inf = infinite_cache_hits(seq)
    total = len(capacities)
    workers = min(resolve_jobs(jobs), total)
    if workers < 2:
        rows = []
        for k, cap in enumerate(capacities):
            rows.append(sweep_point(workload, seq, inf, cap, warmup_fraction=warmup_fraction,
                                    semantics=semantics))
            if progress is not None:
                progress(k + 1, total)
        return rows
    _SHARED["sweep"] = (workload, seq, inf, warmup_fraction, semantics)
    try:
        with _pool(workers) as pool:
            futures = {pool.submit(_point_worker, cap): k for k, cap in enumerate(capacities)}
            out: list[SweepRow | None] = [None] * total
            for done, fut in enumerate(as_completed(futures), 1):
                out[futures[fut]] = fut.result()
                if progress is not None:
                    progress(done, total)
    finally:
        _SHARED.pop("sweep", None)
    return [r for r in out if r is not None]
