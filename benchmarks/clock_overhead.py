"""The roofline clock's cost in ``simulate``'s wall time.

Two figures per trace, same process, median of ``--repeat`` runs:

* ``roofline / linear``: the default run against ``--step-model linear`` (what the issue
  asks; the two runs schedule differently, because their clocks differ, so this ratio
  also carries the change in what is simulated);
* ``roofline / replayed``: the roofline run against the very same run whose step times
  are replayed from a list (identical schedule and manager calls): the clock's own cost.

    PYTHONPATH=src python benchmarks/clock_overhead.py [--trace PATH] [--limit N]
        [--repeat N] [--no-replayed]

The runs alternate (roofline, linear[, replayed]) so that drift in the machine's load
falls on every variant alike; ``--no-replayed`` leaves the third out (the full trace's
runs take minutes each).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pagedkv.sim import SimConfig, run
from pagedkv.sim.api import with_clock
from pagedkv.sim.loaders import load_trace
from pagedkv.sim.scheduler import StepTimeModel
from pagedkv.sim.workloads import bundled_trace_path


@dataclass(frozen=True, slots=True, kw_only=True)
class Replayed(StepTimeModel):
    """Step times taken in order from a recorded list (no computation)."""

    times: list[float] = field(default_factory=list)

    def batch_time_s(self, decode: Sequence[object], prefill: Sequence[object],
                     ledger: list[float] | None = None) -> float:
        return self.times.pop()


@dataclass(frozen=True, slots=True, kw_only=True)
class Recording(StepTimeModel):
    inner: object = None
    times: list[float] = field(default_factory=list)

    def batch_time_s(self, decode: Sequence[object], prefill: Sequence[object],
                     ledger: list[float] | None = None) -> float:
        t = float(self.inner.batch_time_s(decode, prefill, ledger))  # type: ignore[attr-defined]
        self.times.append(t)
        return t


def _wall(wl: object, cfg: SimConfig) -> float:
    t0 = time.perf_counter()
    run(wl, cfg)  # type: ignore[arg-type]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(bundled_trace_path()))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-replayed", action="store_true",
                    help="time only roofline and linear (not the replayed clock)")
    args = ap.parse_args()
    wl = load_trace(Path(args.trace), limit=args.limit)
    base = SimConfig(bounds=False, jobs=1)
    roof = with_clock(base, wl)
    linear = replace(base, step_model="linear")
    recorded: list[float] = []
    if not args.no_replayed:
        rec = Recording(inner=roof.scheduler.step_time)
        run(wl, replace(roof, scheduler=replace(roof.scheduler, step_time=rec)))
        recorded = list(reversed(rec.times))
    rows: dict[str, list[float]] = {"roofline": [], "linear": []}
    if not args.no_replayed:
        rows["replayed"] = []
    for i in range(args.repeat):
        rows["roofline"].append(_wall(wl, roof))
        rows["linear"].append(_wall(wl, linear))
        if not args.no_replayed:
            rep = Replayed(times=list(recorded))
            rows["replayed"].append(_wall(wl, replace(roof, scheduler=replace(
                roof.scheduler, step_time=rep))))
        print(f"  run {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in rows.items()),
              flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"trace {args.trace} ({len(wl.requests)} requests), median of {args.repeat}:")
    for k, v in med.items():
        print(f"  {k:<9} {v:6.2f} s")
    print(f"  roofline / linear   {med['roofline'] / med['linear']:.3f}  (schedules differ)")
    if "replayed" in med:
        print(f"  roofline / replayed {med['roofline'] / med['replayed']:.3f}  "
              "(the clock's cost)")


if __name__ == "__main__":
    main()
