"""``--find-capacity``: the cheapest deployment meeting ``--ttft-p99`` and ``--tpot-p99``
(:mod:`pagedkv.sweep.capacity` searches GPU x TP x replicas x router x KV memory on
the sweep's backends: local processes, or Ray with ``--ray``);
here the durations are parsed and the run's own options become the search's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.sim.durations import parse_seconds
from pagedkv.sim.workloads import Workload

if TYPE_CHECKING:
    from pagedkv.sweep.capacity import CapacityAnswer

__all__ = ["SEARCHED_FLAGS", "parse_seconds", "reproducing_args", "search_deployment"]

#: Flags the search sets itself (left out of the command that reproduces an answer).
SEARCHED_FLAGS = ("--gpu", "--tp", "--replicas", "--router", "--gpu-memory",
                  "--num-blocks")
#: Flags of the run's output, not of what it simulates (left out too).
_OUTPUT_FLAGS = ("--find-capacity", "--no-find-capacity", "--ttft-p99", "--tpot-p99",
                 "--json", "--no-plots", "--no-progress", "--quiet", "--no-bounds", "--plot-dir",
                 "--jobs")
#: Options that shape the run's output (not passed to the search's replays).
_NOT_SEARCHED = ("find_capacity", "no_find_capacity", "ttft_p99", "tpot_p99", "json",
                 "plot_dir", "no_plots", "no_progress", "quiet", "no_bounds", "jobs", "func",
                 "command", "argv", "ray")


def reproducing_args(argv: Sequence[str]) -> list[str]:
    """``simulate``'s arguments ``argv`` without the searched and output flags (and
    their values): what, with an answer's flags, replays that deployment alone."""
    out: list[str] = []
    skip = False
    for k, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name == "--ray":  # its value is optional
            skip = "=" not in arg and k + 1 < len(argv) and not argv[k + 1].startswith("-")
            continue
        if name in SEARCHED_FLAGS or name in _OUTPUT_FLAGS:
            takes_value = name not in ("--find-capacity", "--no-find-capacity", "--json",
                                       "--no-plots", "--no-progress", "--no-bounds")
            skip = takes_value and "=" not in arg
            continue
        out.append(arg)
    return [*out, "--no-bounds"]


def search_deployment(workload: Workload, values: Mapping[str, Any], *, ttft_p99_s: float,
                      tpot_p99_s: float, log: Callable[[str], None] | None = None,
                      ) -> CapacityAnswer:
    """The cheapest deployment for ``workload`` with the run's option ``values`` (dest ->
    parsed value) meeting the targets (:func:`pagedkv.sweep.capacity.find_deployment`) on
    the sweep's backends: local processes (the run's ``--jobs``, default the CPU count),
    or Ray tasks with ``--ray``.

    Raises:
        MissingDependencyError: ``--ray`` without the ``ray`` extra.
        PagedKVError: ``--ray`` names a cluster that cannot be reached.
    """
    from pagedkv.sweep.backends import LocalBackend
    from pagedkv.sweep.capacity import find_deployment
    from pagedkv.sweep.rows import Slo

    base = {k: v for k, v in values.items() if k not in _NOT_SEARCHED}
    slo = Slo(ttft_p99_s=ttft_p99_s, tpot_p99_ms=tpot_p99_s * 1e3)
    if values.get("ray") is None:
        return find_deployment(workload, base, slo,
                               backend=LocalBackend(jobs=values.get("jobs")), log=log)
    from pagedkv.sweep.ray_backend import RayBackend

    ray_backend = RayBackend(values["ray"], num_cpus=values.get("jobs"))
    ray_backend.open()  # a missing extra or an unreachable cluster: one line, now
    try:
        return find_deployment(workload, base, slo, backend=ray_backend, log=log)
    finally:
        ray_backend.close()
