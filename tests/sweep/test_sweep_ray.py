"""The Ray backend on a real local Ray (two CPUs, started here, 127.0.0.1 only): the same
rows as local processes, and no Ray server listening beyond loopback."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sweep_helpers import small_grid

from pagedkv.cli import main
from pagedkv.sweep import LocalBackend, SweepSpec, grid_from_mapping, run_sweep
from pagedkv.sweep.ray_backend import RayBackend, local_ray_env
from pagedkv.sweep.rows import comparable

local_ray_env()  # before ray is imported: loopback only, no usage statistics
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_session() -> Iterator[Any]:
    """One Ray for the module (starting one costs seconds on two cores)."""
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, logging_level="ERROR")
    try:
        yield ray
    finally:
        ray.shutdown()


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found = {root}
    grew = True
    while grew:
        new = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= new
        grew = bool(new)
    return found


def test_ray_listens_on_loopback_only(ray_session: Any) -> None:
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed")
    mine = _descendants(os.getpid())
    lines = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    ours = []
    for line in lines:
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if pids & mine:
            ours.append(line.split()[3])  # local address:port
    assert len(ours) >= 3, lines  # the GCS, the raylet, this driver's worker at least
    loopback = re.compile(r"^(127\.0\.0\.1|\[::ffff:127\.0\.0\.1\]|\[::1\]):\d+$")
    assert [a for a in ours if not loopback.match(a)] == []


def test_same_rows_on_ray_and_local_processes(ray_session: Any, tmp_path: Path) -> None:
    grid = tmp_path / "g.json"
    # A 70B leaves no KV memory on one 40 GB GPU: its points fail, with an error row.
    data = small_grid(model=["Llama-3.1-8B", "Llama-3.1-70B"], replicas=[1, 2, 3])
    data["gpu"] = "A100-40GB"
    grid.write_text(json.dumps(data))
    common = [str(grid), "--no-plot", "--no-progress"]
    assert main(["sweep", *common, "--out", str(tmp_path / "local"), "--jobs", "2"]) == 1
    assert main(["sweep", *common, "--out", str(tmp_path / "ray"), "--ray"]) == 1
    local = json.loads((tmp_path / "local" / "rows.json").read_text())
    on_ray = json.loads((tmp_path / "ray" / "rows.json").read_text())
    assert [r["status"] for r in on_ray] == ["ok"] * 3 + ["error"] * 3
    assert not any(r["cached"] for r in on_ray)  # its own cache: all computed on Ray
    assert [comparable(r) for r in on_ray] == [comparable(r) for r in local]
    assert ray.is_initialized()  # a session the sweep did not start is left running


def test_ray_backend_streams_outcomes(ray_session: Any, tmp_path: Path) -> None:
    grid = grid_from_mapping(small_grid(num_blocks=[300, 400, 500]), where="grid")
    backend = RayBackend("auto")
    res = run_sweep(SweepSpec(grid=grid, out_dir=tmp_path, plot=False, backend=backend),
                    log=lambda _s: None)
    ref = run_sweep(SweepSpec(grid=grid, out_dir=tmp_path / "l", plot=False,
                              backend=LocalBackend(jobs=1)), log=lambda _s: None)
    assert backend.workers == 2
    assert res.computed == 3
    assert [comparable(r) for r in res.rows] == [comparable(r) for r in ref.rows]


def test_the_deployment_search_runs_on_ray_as_on_local_processes(ray_session: Any) -> None:
    # simulate --find-capacity --ray: the same answer and figures as local processes
    from pagedkv.sim import system_prompts
    from pagedkv.sim.search import search_deployment

    wl = system_prompts(num_groups=2, questions_per_group=4)
    values = {"gpu_memory": None, "ray": None, "jobs": 2}
    targets = {"ttft_p99_s": 1e-6, "tpot_p99_s": 1e-6}  # nothing meets: every pair tried
    local = search_deployment(wl, values, **targets)
    on_ray = search_deployment(wl, {**values, "ray": "auto"}, **targets)
    assert len(on_ray.tried) == len(local.tried) > 0
    assert [(t.deployment, t.metrics) for t in on_ray.tried] == \
        [(t.deployment, t.metrics) for t in local.tried]
