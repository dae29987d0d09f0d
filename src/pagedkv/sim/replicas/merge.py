"""One multi-replica run's figures: the replicas' measurements merged into one
:class:`~pagedkv.sim.results.SimResult`, reported by the single engine's own
:func:`~pagedkv.sim.summary.build_report` (so one replica reports exactly what
``simulate`` reports), plus what only a cluster has (requests and prompt tokens per
replica, load imbalance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pagedkv.cluster.router import CostWeights
from pagedkv.sim.api import SimConfig
from pagedkv.sim.models import CapacityPlan
from pagedkv.sim.results import SimResult
from pagedkv.sim.summary import CapacityInfo, Latency, SimReport, build_report
from pagedkv.sim.workloads import Workload

__all__ = ["PolicyResult", "ReplicaReport", "merge_results", "policy_result"]

_PER_REQUEST = ("hit_tokens", "lookup_time_s", "arrival_s", "first_scheduled_s",
                "first_token_s", "finish_s")
_SUMMED = ("evicted_blocks", "preemptions", "preempted_query_tokens",
           "preempted_hit_tokens", "rejected", "num_steps")


def merge_results(results: Sequence[SimResult], owner: Sequence[int]) -> SimResult:
    """The replicas' results as one run's: each request's figures from the replica that
    ran it (``owner[i]``; -1: none, the first replica's defaults), counters summed, the
    simulated time the latest replica's, KV-usage samples of all replicas in time order.
    One replica's result is returned unchanged."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    merged = SimResult(
        mode=first.mode, workload=first.workload, block_size=first.block_size,
        num_blocks=first.num_blocks, query_tokens=list(first.query_tokens),
        hit_tokens=[], lookup_time_s=[], output_tokens=list(first.output_tokens),
    )
    for name in _PER_REQUEST:
        columns = [getattr(r, name) for r in results]
        setattr(merged, name, [columns[max(k, 0)][i] for i, k in enumerate(owner)])
    for name in _SUMMED:
        setattr(merged, name, sum(getattr(r, name) for r in results))
    merged.sim_duration_s = max(r.sim_duration_s for r in results)
    merged.wall_s = max(r.wall_s for r in results)
    if first.clock_terms_s:
        merged.clock_terms_s = [math.fsum(t) for t in zip(*(r.clock_terms_s for r in results),
                                                             strict=True)]
    samples = sorted(
        (t, k, j) for k, r in enumerate(results) for j, t in enumerate(r.sample_time_s))
    for t, k, j in samples:
        r = results[k]
        merged.sample_time_s.append(t)
        merged.sample_usage.append(r.sample_usage[j])
        merged.sample_running.append(r.sample_running[j])
        merged.sample_waiting.append(r.sample_waiting[j])
    return merged


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyResult:
    """What one routing policy achieved over ``num_replicas`` replicas (times in
    seconds; rates fractions). The figures are ``report``'s, the single engine's report
    of the merged run (:func:`merge_results`)."""

    policy: str
    num_replicas: int
    num_requests: int
    num_rejected: int
    hit_rate: float
    """Hit tokens of each request's admission lookup / prompt tokens (admitted ones)."""
    ttft: Latency
    tpot: Latency
    e2e: Latency
    queue_delay: Latency
    """Arrival to first scheduled step."""
    output_tokens_per_s: float | None
    num_preemptions: int
    usage_mean: float | None
    """KV-cache usage over every replica's samples."""
    usage_max: float | None
    requests_per_replica: tuple[int, ...]
    prefill_tokens_per_replica: tuple[int, ...]
    """Prompt tokens not found in the cache at admission, per replica."""
    load_imbalance: float
    """Max over mean of ``prefill_tokens_per_replica`` (1.0 = even)."""
    makespan_s: float
    wall_s: float
    report: SimReport = field(repr=False, compare=False)
    stopped_early: bool = False
    """Stopped once the TTFT p99 was sure to miss its limit (figures: the run so far)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaReport:
    """Several policies on one workload and one cluster shape."""

    workload: str
    num_requests: int
    num_replicas: int
    weights: CostWeights
    results: tuple[PolicyResult, ...]


def policy_result(policy: str, workload: Workload, config: SimConfig, cap: CapacityPlan,
                  results: Sequence[SimResult], owner: Sequence[int], *,
                  wall_s: float) -> PolicyResult:
    """The figures of one run of ``policy`` (module docstring)."""
    merged = merge_results(results, owner)
    merged.wall_s = wall_s
    report = build_report(
        merged, description=workload.description, semantics=config.semantics,
        capacity=CapacityInfo(source=cap.source, groups=cap.group_names, note=cap.note),
        warmup_start=int(len(workload.requests) * config.warmup_fraction))
    n = len(results)
    routed = [0] * n
    prefill = [0] * n
    for i, k in enumerate(owner):
        if k < 0:
            continue
        routed[k] += 1
        if merged.lookup_time_s[i] is not None:
            prefill[k] += merged.query_tokens[i] - merged.hit_tokens[i]
    mean_prefill = sum(prefill) / n
    e = report.engine
    assert e is not None  # an engine run
    return PolicyResult(
        policy=policy, num_replicas=n, num_requests=report.requests,
        num_rejected=report.rejected_requests, hit_rate=report.hit_rate or 0.0,
        ttft=e.ttft, tpot=e.tpot, e2e=e.e2e, queue_delay=e.queue_delay,
        output_tokens_per_s=e.output_tokens_per_s, num_preemptions=report.preemptions,
        usage_mean=e.usage_mean, usage_max=e.usage_max, requests_per_replica=tuple(routed),
        prefill_tokens_per_replica=tuple(prefill),
        load_imbalance=max(prefill) / mean_prefill if mean_prefill else 1.0,
        makespan_s=e.simulated_s, wall_s=wall_s, report=report,
    )
