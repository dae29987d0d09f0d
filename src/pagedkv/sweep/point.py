"""One grid point: the ``simulate`` run its options ask for, reduced to its figures.

A point's options are the grid's fixed values, then the point's axis values, on top of
what a sweep sets for every point (:data:`SWEEP_DEFAULTS`: no bounds, no plots, no
progress, one process, no device-only host baseline). They become a run through
:func:`pagedkv.sim.setup.simulate_request`, exactly as ``pagedkv simulate`` with those
flags: the same rules, the same clock, the same seeds. With ``replicas`` the point is the
multi-replica simulation of ``simulate --replicas N --router R``
(:mod:`pagedkv.sim.replicas`: N of the same engine on one clock), one policy: ``router``
(default round-robin); a point with one replica and round-robin gives ``simulate``'s row.

:func:`run_point` returns the figures (:data:`METRICS`), all deterministic: a point
replayed anywhere gives the same ones.

>>> from pagedkv.sim import system_prompts
>>> wl = system_prompts(num_groups=2, questions_per_group=4)
>>> m = run_point(wl, {"num_blocks": 2000})
>>> round(m["hit_rate"], 4), m["preemptions"], m["gpus"]
(0.6636, 0, 1)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pagedkv.errors import InvalidArgumentError
from pagedkv.sim.api import SimConfig, run, with_clock
from pagedkv.sim.setup import CalibrateRequest, SimulateRequest, simulate_request
from pagedkv.sim.summary import Latency, SimReport
from pagedkv.sim.workloads import Workload

__all__ = ["DEFAULT_ROUTER", "METRICS", "STOP_OPTION", "SWEEP_DEFAULTS", "point_options",
           "point_request", "run_point"]

#: What every point sets unless the grid says otherwise.
SWEEP_DEFAULTS: dict[str, Any] = {"no_bounds": True, "no_plots": True, "no_progress": True,
                                  "jobs": 1}
#: A point option that is no ``simulate`` flag: stop the replay once its TTFT p99 is sure
#: to exceed this many seconds (the capacity search's early exit; TTFT p99 then None).
STOP_OPTION = "stop_above_ttft_p99_s"
#: The router of a replica point without one (``compare`` is several runs, not a point).
DEFAULT_ROUTER = "round-robin"
#: The figures of a point, in row order (None where the run has no such figure).
METRICS = ("requests", "rejected", "num_blocks", "hit_rate", "ttft_mean_s", "ttft_p50_s",
           "ttft_p99_s", "tpot_mean_s", "tpot_p50_s", "tpot_p99_s", "e2e_mean_s", "e2e_p50_s",
           "e2e_p99_s", "output_tokens_per_s", "preemptions", "kv_usage_mean",
           "kv_usage_max", "retention_hit_rate", "host_hit_rate", "gpus", "stopped_early")


def point_options(fixed: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """Every option a point sets: :data:`SWEEP_DEFAULTS`, ``fixed``, then ``values``."""
    out = dict(SWEEP_DEFAULTS)
    out.update(fixed)
    out.update(values)
    if out.get("host_memory") is not None and "no_host_baseline" not in out:
        out["no_host_baseline"] = True
    return out


def point_request(options: Mapping[str, Any]) -> SimulateRequest:
    """The run ``options`` ask for, checked by ``simulate``'s own rules.

    Raises:
        InvalidArgumentError: contradictory options, ``--calibrate``, ``--router compare``.
    """
    req = simulate_request(options)
    if isinstance(req, CalibrateRequest):  # not sweepable; kept for a clear message
        raise InvalidArgumentError("--calibrate is not a sweep option")
    if req.replicas is not None and options.get("router") == "compare":
        raise InvalidArgumentError("router 'compare' runs every policy: make router an axis "
                                   "(round-robin, least-loaded, cache-aware) instead")
    return req


def run_point(workload: Workload, options: Mapping[str, Any]) -> dict[str, Any]:
    """Simulate ``workload`` with ``options`` (dest -> parsed value, on top of
    :data:`SWEEP_DEFAULTS`) and return its :data:`METRICS`.

    Raises:
        PagedKVError: the point cannot be simulated (it does not fit, a bad value).
    """
    opts = point_options({}, options)
    stop_s = opts.pop(STOP_OPTION, None)
    req = point_request(opts)
    config = req.config
    if config.mode == "engine":
        config = with_clock(config, workload)
    gpus = config.tp * (req.replicas.replicas if req.replicas is not None else 1)
    if req.replicas is not None or stop_s is not None:
        router = opts.get("router") or DEFAULT_ROUTER
        out = _replica_metrics(workload, config, gpus // config.tp, router, stop_s)
    else:
        out = _report_metrics(run(workload, config))
    out["gpus"] = gpus
    return {k: _finite(out.get(k)) for k in METRICS}


def _finite(value: Any) -> Any:
    """A figure as stored: a non-finite float (no samples) as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _report_metrics(report: SimReport) -> dict[str, Any]:
    e = report.engine
    out: dict[str, Any] = {
        "requests": report.requests, "rejected": report.rejected_requests,
        "num_blocks": report.num_blocks, "hit_rate": report.hit_rate,
        "preemptions": report.preemptions,
    }
    if e is not None:
        out.update(_latency_metrics(e.ttft, e.tpot, e.e2e),
                   output_tokens_per_s=e.output_tokens_per_s, kv_usage_mean=e.usage_mean,
                   kv_usage_max=e.usage_max)
    if report.retention is not None:
        out["retention_hit_rate"] = report.retention.get("policy_hit_rate")
    host = report.host_tier
    if host is not None and report.prompt_tokens:
        out["host_hit_rate"] = host.host_hit_tokens / report.prompt_tokens
    return out


def _latency_metrics(ttft: Latency, tpot: Latency, e2e: Latency) -> dict[str, Any]:
    return {f"{name}_{stat}_s": getattr(lat, stat)
            for name, lat in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))
            for stat in ("mean", "p50", "p99")}


def _replica_metrics(workload: Workload, config: SimConfig, replicas: int,
                     router: str, stop_s: float | None) -> dict[str, Any]:
    from pagedkv.sim.replicas import run_replicas

    r = run_replicas(workload, config, num_replicas=replicas, policy=router,
                     stop_above_ttft_p99_s=stop_s)
    if r.stopped_early:  # the TTFT p99 is over stop_s: its figures are the run so far
        return {"requests": r.num_requests, "ttft_p99_s": math.inf, "stopped_early": True,
                "preemptions": r.num_preemptions}
    return {
        "requests": r.num_requests, "rejected": r.num_rejected,
        "num_blocks": r.report.num_blocks, "hit_rate": r.hit_rate,
        **_latency_metrics(r.ttft, r.tpot, r.e2e),
        "output_tokens_per_s": r.output_tokens_per_s, "preemptions": r.num_preemptions,
        "kv_usage_mean": r.usage_mean, "kv_usage_max": r.usage_max,
    }
