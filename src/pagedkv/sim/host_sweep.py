"""The host tier in a simulation run: building its engine, the host-capacity sweep, and
its sections of the report (:mod:`pagedkv.sim.host_tier` has the model).

A run with ``SimConfig(host=HostMemoryConfig(...))`` replays on a
:class:`~pagedkv.sim.host_engine.HostEngineSimulator`; its report carries ``host_tier``
(the tier's figures) and, when more host sizes were asked for
``host_sweep``: a device-only replay (unless ``device_only_baseline`` is off), the main run,
and one replay per further size (``--host-memory 64GiB,256GiB``), each a row of hit rate
per tier and TTFT: the tier's effect.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pagedkv.planner import format_bytes
from pagedkv.sim.engine import EngineSimulator
from pagedkv.sim.host_engine import HostEngineSimulator
from pagedkv.sim.host_tier import (
    NO_MODEL_BYTES_PER_TOKEN,
    HostMemoryConfig,
    HostRunStats,
    HostSweepRow,
)
from pagedkv.sim.models import CapacityPlan
from pagedkv.sim.results import SimResult, percentile
from pagedkv.sim.scheduler import SchedulerConfig
from pagedkv.sim.summary import SimReport
from pagedkv.sim.workloads import Workload

if TYPE_CHECKING:
    from pagedkv.sim.observe_engine import ReplayObserver

__all__ = [
    "block_bytes_for",
    "host_sections",
    "host_simulator",
    "host_sweep_table",
    "with_host_tier",
]


def block_bytes_for(cap: CapacityPlan) -> int:
    """Bytes per block: the planner's (a model), else :data:`NO_MODEL_BYTES_PER_TOKEN`
    per token of a block."""
    return cap.block_bytes or NO_MODEL_BYTES_PER_TOKEN * cap.block_size


def host_simulator(workload: Workload, cap: CapacityPlan, host: HostMemoryConfig,
                   scheduler: SchedulerConfig,
                   observer: ReplayObserver | None = None) -> HostEngineSimulator:
    """The engine of a host-tier run on capacity ``cap`` (observed by ``observer``: its
    manager carries the attribution component beside the host tier)."""
    sim = HostEngineSimulator(workload, block_size=cap.block_size, num_blocks=cap.num_blocks,
                              host=host, block_bytes=block_bytes_for(cap), config=scheduler,
                              manager_factory=cap.factory,
                              wrap=observer.wrap if observer is not None else None)
    if observer is not None:
        observer.attach(sim)
    return sim


def _row(result: SimResult, stats: HostRunStats | None) -> HostSweepRow:
    hit, query = result.totals()
    ttft = [f - a for a, f in zip(result.arrival_s, result.first_token_s, strict=True)
            if f is not None]
    host_hit = stats.host_hit_tokens if stats else 0
    return HostSweepRow(
        host_memory_bytes=stats.memory_bytes if stats else None,
        host_blocks=stats.num_blocks if stats else 0,
        hit_rate=hit / query if query else 0.0,
        device_hit_rate=(hit - host_hit) / query if query else 0.0,
        host_hit_rate=host_hit / query if query else 0.0,
        ttft_p50_s=percentile(ttft, 50), ttft_p99_s=percentile(ttft, 99),
        preemptions=result.preemptions)


def with_host_tier(report: SimReport, sim: HostEngineSimulator, workload: Workload,
                   cap: CapacityPlan, host: HostMemoryConfig,
                   scheduler: SchedulerConfig) -> SimReport:
    """``report`` with the host tier's figures and the host-memory table: this run, a
    device-only replay (``host.device_only_baseline``) and one replay per further size
    (``host.sweep_memory_bytes``)."""
    sweep: tuple[HostSweepRow, ...] = ()
    if host.sweep_memory_bytes or host.device_only_baseline:
        assert report.result is not None
        rows = [_row(report.result, sim.host_stats)]
        if host.device_only_baseline:
            rows.insert(0, _row(EngineSimulator(
                workload, block_size=cap.block_size, num_blocks=cap.num_blocks,
                config=scheduler, manager_factory=cap.factory).run(), None))
        for size in host.sweep_memory_bytes:
            other = host_simulator(workload, cap, replace(host, memory_bytes=size,
                                                          sweep_memory_bytes=()), scheduler)
            rows.append(_row(other.run(), other.host_stats))
        sweep = tuple(rows)
    return replace(report, host_tier=sim.host_stats, host_sweep=sweep)


def host_sections(s: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The report section of a run's JSON form ``s`` (none without a host tier)."""
    tier = s.get("host_tier")
    if not tier:
        return []
    stats = HostRunStats(**tier)
    return [("Host tier", stats.lines(s["prompt_tokens"]))]


_HEAD = ["host memory", "host blocks", "hit rate", "device hits", "host hits",
         "TTFT p50", "TTFT p99", "preemptions"]


def _sec(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def host_sweep_table(s: dict[str, Any]) -> tuple[str, list[str], list[list[str]]] | None:
    """(title, header, rows) of the host sweep in ``s``, or None."""
    rows = s.get("host_sweep")
    if not rows:
        return None
    out = []
    for r in rows:
        size = r["host_memory_bytes"]
        out.append([
            "device only" if size is None else format_bytes(size),
            f"{r['host_blocks']:,}", f"{100 * r['hit_rate']:.1f} %",
            f"{100 * r['device_hit_rate']:.1f} %", f"{100 * r['host_hit_rate']:.1f} %",
            _sec(r["ttft_p50_s"]), _sec(r["ttft_p99_s"]), f"{r['preemptions']:,}",
        ])
    return "Host memory: effect on hits and TTFT (hit rates of all prompt tokens)", _HEAD, out
