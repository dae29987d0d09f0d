"""The multi-replica simulation: a trace replayed over N simulated engines behind a router.

Each replica is a :class:`~pagedkv.cluster.replica_engine.ReplicaEngine` (its own
manager and scheduler). One clock drives them all: the next event is either an arrival
(routed at once: the router reads each replica's load and the cluster index as they are
at that moment) or the next step of the replica that is due first. After every step the
replica's KV-cache events go through :class:`~pagedkv.cluster.ingest.IndexIngest` into an
in-process :class:`~pagedkv.cluster.index.MemoryIndex` — the same path as the live
service, with no propagation delay.

Step-time model: each replica's step lasts
``step_overhead_s + prefill_token_s * prefill tokens + decode_seq_s * decoding sequences``
(:class:`pagedkv.sim.StepTimeModel`, defaults 4 ms, 20 µs, 0.1 ms: an 8B model in BF16 on
one H100-class GPU); hits are not computed, so they cost nothing.

Entry point: :func:`run_replicas` (one policy) and :func:`compare_policies`; rendering and
plots live in :mod:`pagedkv.cluster.replica_report`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagedkv.cluster.index import MemoryIndex, Replica
from pagedkv.cluster.ingest import IndexIngest
from pagedkv.cluster.replica_engine import EngineConfig, ReplicaEngine, Tracked
from pagedkv.cluster.router import POLICIES, CostWeights, ReplicaLoad, Router, make_policy
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.wire import wire_hash
from pagedkv.sim import Workload, request_block_hashes
from pagedkv.sim.scheduler import request_blocks_needed

__all__ = ["PolicyResult", "ReplicaReport", "compare_policies", "run_replicas"]

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyResult:
    """What one policy achieved over ``num_replicas`` replicas (times in seconds)."""

    policy: str
    num_replicas: int
    num_requests: int
    hit_rate: float
    """Hit tokens of each request's admission lookup / prompt tokens, over all requests."""
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    queue_p50_s: float | None
    """Arrival to first scheduled step."""
    queue_p99_s: float | None
    requests_per_replica: tuple[int, ...]
    prefill_tokens_per_replica: tuple[int, ...]
    mean_usage_per_replica: tuple[float, ...]
    """KV-cache usage averaged over each replica's steps."""
    load_imbalance: float
    """Max over mean of the prefill tokens computed per replica (1.0 = even)."""
    num_preemptions: int
    makespan_s: float
    wall_s: float
    num_rejected: int = 0
    """Requests longer than a whole replica's cache (prompt + output - 1 tokens), refused
    on arrival as the single engine refuses them (they could never run)."""
    tpot_p50_s: float | None = None
    """Time per output token after the first, (finish - first token) / (outputs - 1), of
    the finished requests with two or more output tokens."""
    tpot_p99_s: float | None = None
    e2e_p50_s: float | None = None
    """Arrival to last token, of the finished requests."""
    e2e_p99_s: float | None = None
    output_tokens_per_s: float | None = None
    """Output tokens of the finished requests over the makespan."""
    usage_max: float | None = None
    """The highest KV-cache usage any replica sampled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaReport:
    """Several policies on one workload and one cluster shape."""

    workload: str
    num_requests: int
    num_replicas: int
    engine: EngineConfig
    weights: CostWeights
    results: tuple[PolicyResult, ...]


def _percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear interpolation; None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _replica_name(i: int) -> Replica:
    return Replica(pod=f"replica-{i}", dp_rank=None)


def run_replicas(
    workload: Workload,
    *,
    num_replicas: int,
    policy: str,
    engine: EngineConfig,
    weights: CostWeights | None = None,
    progress: Progress | None = None,
) -> PolicyResult:
    """Replay ``workload`` over ``num_replicas`` replicas routed by ``policy`` (one of
    :data:`~pagedkv.cluster.router.POLICIES`). Requests' ``parent`` links are ignored:
    every request arrives at its trace time.

    Raises InvalidArgumentError for fewer than one replica, an unknown policy, or a
    block size the workload's hashes cannot be replayed at.
    """
    if num_replicas < 1:
        raise InvalidArgumentError(f"num_replicas must be >= 1, got {num_replicas}")
    wall0 = time.perf_counter()
    weights = weights or CostWeights()
    bs = engine.block_size
    index = MemoryIndex(model=workload.name)
    ingest = IndexIngest(index)
    names = [_replica_name(i) for i in range(num_replicas)]
    engines = [ReplicaEngine(engine) for _ in names]
    router = Router(index, specs=engines[0].manager.config.groups,
                    policy=make_policy(policy, weights))
    uses_index = router.policy.uses_index
    reqs = workload.requests
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_s)
    last_arrival_s = max((r.arrival_s for r in reqs), default=0.0)
    capacity = engine.num_blocks - 1
    num_rejected = 0
    for e in engines:  # the single engine's sampling period
        e.sample_every_s = max(last_arrival_s, 1.0) / engine.num_usage_samples
    next_step = [0.0] * num_replicas
    routed = [0] * num_replicas
    last_report = 0
    inf = float("inf")

    def advance(until_s: float) -> None:
        """Run every replica's steps that start before ``until_s``."""
        for k, e in enumerate(engines):
            while e.has_work and next_step[k] < until_s:
                next_step[k] += e.step(next_step[k], until_s)

    for done, i in enumerate(order):
        r = reqs[i]
        now = r.arrival_s
        advance(now)
        for name, e in zip(names, engines, strict=True):
            events = e.take_events()
            if uses_index:
                ingest.apply(name.pod, events)  # the index as of this moment
        if request_blocks_needed(r, bs) > capacity:
            num_rejected += 1  # it could never run: preempted forever otherwise
            continue
        hashes = request_block_hashes(r, bs, source_block_size=workload.source_block_size,
                                      index=i)
        tokens = r.prompt_token_ids or [0] * r.num_prompt_tokens
        if hashes is None:  # token ids given: hash them as every replica would
            hashes = engines[0].manager.new_request(r.request_id, tokens).block_hashes
        loads = {
            name: ReplicaLoad(queued_prefill_tokens=e.queued_prefill_tokens(),
                              running_seqs=len(e.running))
            for name, e in zip(names, engines, strict=True)
        }
        choice = router.route([wire_hash(h) for h in hashes], num_tokens=r.num_prompt_tokens,
                              loads=loads)
        k = names.index(choice.replica)
        target = engines[k]
        if not target.has_work and now > next_step[k]:
            target.sample_usage(next_step[k], force=True)  # the idle state, before the gap
            next_step[k] = now
        target.submit(Tracked(i, target.manager.new_request(r.request_id, tokens,
                                                            block_hashes=hashes),
                              now, r.num_output_tokens))
        routed[k] += 1
        if progress is not None and done - last_report >= 100:
            last_report = done
            progress(done, len(reqs))
    advance(inf)
    if progress is not None:
        progress(len(reqs), len(reqs))
    now = max(next_step)
    result = _result(policy, names, engines, routed, len(reqs), now,
                     time.perf_counter() - wall0)
    return dataclasses.replace(result, num_rejected=num_rejected)


def _result(
    policy: str,
    names: Sequence[Replica],
    engines: Sequence[ReplicaEngine],
    routed: Sequence[int],
    num_requests: int,
    end_s: float,
    wall_s: float,
) -> PolicyResult:
    tracked = [t for e in engines for t in e.finished]
    prompt = sum(t.req.num_prompt_tokens for t in tracked)
    hit = sum(t.hit_tokens for t in tracked)
    ttft = [t.first_token_s - t.arrival_s for t in tracked if t.first_token_s is not None]
    queue = [t.first_scheduled_s - t.arrival_s for t in tracked
             if t.first_scheduled_s is not None]
    prefill = tuple(e.prefill_tokens for e in engines)
    mean_prefill = sum(prefill) / len(prefill)
    tpot: list[float] = []
    e2e: list[float] = []
    out_tokens = 0
    for t in tracked:
        if t.finish_s is None or t.first_token_s is None:
            continue
        e2e.append(t.finish_s - t.arrival_s)
        out_tokens += t.target
        if t.target > 1:
            tpot.append((t.finish_s - t.first_token_s) / (t.target - 1))
    return PolicyResult(
        policy=policy,
        num_replicas=len(names),
        num_requests=num_requests,
        hit_rate=hit / prompt if prompt else 0.0,
        ttft_p50_s=_percentile(ttft, 50),
        ttft_p99_s=_percentile(ttft, 99),
        queue_p50_s=_percentile(queue, 50),
        queue_p99_s=_percentile(queue, 99),
        requests_per_replica=tuple(routed),
        prefill_tokens_per_replica=prefill,
        mean_usage_per_replica=tuple(e.mean_usage for e in engines),
        load_imbalance=max(prefill) / mean_prefill if mean_prefill else 1.0,
        num_preemptions=sum(e.num_preemptions for e in engines),
        makespan_s=end_s,
        wall_s=wall_s,
        tpot_p50_s=_percentile(tpot, 50),
        tpot_p99_s=_percentile(tpot, 99),
        e2e_p50_s=_percentile(e2e, 50),
        e2e_p99_s=_percentile(e2e, 99),
        output_tokens_per_s=out_tokens / end_s if end_s > 0 else None,
        usage_max=max((u for e in engines for u in e.usage_samples), default=None),
    )


def compare_policies(
    workload: Workload,
    *,
    num_replicas: int,
    engine: EngineConfig,
    policies: Sequence[str] = POLICIES,
    weights: CostWeights | None = None,
    phase: Callable[[str], None] | None = None,
    progress: Progress | None = None,
) -> ReplicaReport:
    """:func:`run_replicas` once per policy (default: round-robin, least-loaded,
    cache-aware), each on fresh replicas. ``phase(policy)`` is called before each policy,
    ``progress(done, total)`` (requests routed) during it."""
    weights = weights or CostWeights()
    results = []
    for policy in policies:
        if phase is not None:
            phase(policy)
        results.append(run_replicas(workload, num_replicas=num_replicas, policy=policy,
                                    engine=engine, weights=weights, progress=progress))
    return ReplicaReport(workload=workload.name, num_requests=len(workload.requests),
                         num_replicas=num_replicas, engine=engine, weights=weights,
                         results=tuple(results))
