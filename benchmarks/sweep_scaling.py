"""Parallel efficiency and per-worker memory of ``pagedkv sweep``: one 16-point grid,
serial, on 2 local worker processes and on a local Ray of 2 CPUs; then 4 points of the
same grid on each (the two highest rate scales: the most loaded points), to show that a
worker's peak memory does not grow with the number of points (the workload is shared,
not copied per point).

    python benchmarks/sweep_scaling.py      # alone on the machine: it measures parallelism

The grid: the bundled trace (1,500 requests, engine mode, the roofline clock),
``gpu`` H100-SXM / H200 × 8 ``rate_scale`` values from 0.80 to 1.15; every point is one
independent simulation of several seconds. Each configuration runs in a fresh child
process with a fresh cache (so nothing is served from the cache, and each child's memory
figures are its own). Prints one table:

* ``wall s``: the sweep alone (Ray's start-up, until both workers have imported pagedkv,
  is printed apart);
* ``efficiency``: serial wall / (2 × wall), 100 % = ideal on 2 workers;
* Ray's workers run at niceness 0 like the local ones (Ray's default is 15);
* ``worker peak RSS``: the largest worker process's peak resident memory (local:
  ``getrusage(RUSAGE_CHILDREN)``; Ray: ``VmHWM`` of the ``ray::`` worker processes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
RATE_SCALES = ("0.8", "0.85", "0.9", "0.95", "1.0", "1.05", "1.1", "1.15")
GPUS = ("H100-SXM", "H200")


def _grid(points: int, limit: int | None) -> Any:
    from pagedkv.sweep.grid import grid_from_mapping

    # The fewer points are the most loaded ones (the highest rates: the most requests in
    # flight, the most memory), so a growth with the count of points cannot hide.
    data: dict[str, Any] = {"gpu": list(GPUS),
                            "rate_scale": list(RATE_SCALES[-(points // 2):])}
    if limit is not None:
        data["limit"] = limit
    return grid_from_mapping(data, where="benchmark grid")


def _ray_workers_peak_mb() -> tuple[list[float], list[int]]:
    """VmHWM (MB) and niceness of every ``ray::`` worker process descending from this
    one."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            names[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0] \
                .decode(errors="replace")
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    mine = {os.getpid()}
    grew = True
    while grew:
        new = {p for p, pp in parents.items() if pp in mine} - mine
        mine |= new
        grew = bool(new)
    out: list[float] = []
    nice: list[int] = []
    for pid in sorted(mine):
        name = names.get(pid, "")
        if not name.startswith("ray::") or name.endswith("Agent"):  # workers only
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                out.append(int(line.split()[1]) / 1024)
                nice.append(int(stat.rsplit(")", 1)[1].split()[16]))
    return out, nice


def _warm_up() -> int:
    import pagedkv.sweep.backends

    time.sleep(0.5)  # long enough that the two calls land on two workers
    return os.getpid() + len(pagedkv.sweep.backends.__name__)


def child(mode: str, points: int, limit: int | None) -> dict[str, Any]:
    """Run one configuration in this (fresh) process; returns its figures."""
    from pagedkv.sweep import LocalBackend, SweepSpec, run_sweep
    from pagedkv.sweep.ray_backend import RayBackend, local_ray_env

    grid = _grid(points, limit)
    startup_s = 0.0
    ray = None
    if mode == "ray":
        local_ray_env()
        import ray as ray_module

        ray = ray_module
        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, logging_level="ERROR")
        warm = ray.remote(num_cpus=1)(_warm_up)  # both workers up, pagedkv imported
        ray.get([warm.remote() for _ in range(2)])
        startup_s = time.perf_counter() - t0
        backend: Any = RayBackend("auto")
    else:
        backend = LocalBackend(jobs=1 if mode == "serial" else 2)
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        res = run_sweep(SweepSpec(grid=grid, out_dir=out, plot=False, backend=backend),
                        log=lambda _s: None)
        wall_s = time.perf_counter() - t0
    nice: list[int] = []
    if ray is not None:
        peaks, nice = _ray_workers_peak_mb()
        ray.shutdown()
    else:
        peaks = [resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024] \
            if mode == "local" else []
    return {"mode": mode, "points": points, "wall_s": wall_s, "startup_s": startup_s,
            "errors": res.errors, "computed": res.computed,
            "point_wall_s": [r["wall_s"] for r in res.rows],
            "worker_peak_mb": max(peaks) if peaks else None, "workers_seen": len(peaks),
            "worker_nice": sorted(set(nice)),
            "driver_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _run_child(mode: str, points: int, limit: int | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--points", str(points)]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    # Ray starts its workers at niceness 15 (RAY_worker_niceness); local workers run at 0.
    # On a machine shared with other work that alone slows Ray's points: compare like
    # with like.
    env = {**os.environ, "PYTHONPATH": str(SRC), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_worker_niceness": "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        sys.exit(f"{mode} x{points} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=None,
                   help="replay only the first N requests (default: the whole bundled trace)")
    p.add_argument("--child", choices=("serial", "local", "ray"), help=argparse.SUPPRESS)
    p.add_argument("--points", type=int, default=16, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.points, a.limit)))
        return 0
    started = time.perf_counter()
    runs = [_run_child(mode, n, a.limit) for mode, n in
            (("serial", 16), ("local", 16), ("ray", 16), ("local", 4), ("ray", 4))]
    serial = runs[0]["wall_s"]
    per_point = sorted(runs[0]["point_wall_s"])
    print(f"grid: bundled trace{'' if a.limit is None else f' (first {a.limit} requests)'}, "
          f"gpu {'/'.join(GPUS)} x rate_scale {RATE_SCALES[0]}..{RATE_SCALES[-1]}; serial "
          f"point time min {per_point[0]:.1f} s / median {per_point[len(per_point) // 2]:.1f} "
          f"s / max {per_point[-1]:.1f} s")
    print(f"{'backend':<22} {'points':>6} {'wall s':>8} {'efficiency':>10} "
          f"{'worker peak RSS':>16} {'errors':>6}")
    for r in runs:
        label = {"serial": "serial (1 process)", "local": "local, 2 processes",
                 "ray": "Ray, 2 CPUs"}[r["mode"]]
        eff = (f"{100 * serial / (2 * r['wall_s']):.0f} %"
               if r["mode"] != "serial" and r["points"] == 16 else "")
        rss = "" if r["worker_peak_mb"] is None else f"{r['worker_peak_mb']:.0f} MB"
        print(f"{label:<22} {r['points']:>6} {r['wall_s']:>8.1f} {eff:>10} {rss:>16} "
              f"{r['errors']:>6}")
    ray16 = runs[2]
    print(f"Ray start-up (not in wall s): {ray16['startup_s']:.1f} s; Ray workers measured: "
          f"{ray16['workers_seen']} (16 points), {runs[4]['workers_seen']} (4 points), "
          f"niceness {ray16['worker_nice']}")
    print(f"total benchmark time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
