"""N single engines behind a router on one event clock (``simulate --replicas N``).

Every replica is a :class:`pagedkv.sim.EngineSimulator` — the engine ``pagedkv simulate``
runs, with the same manager factory (every KV-cache group of the model), scheduler and
clock (each step timed from its own batch), so ``--replicas 1 --router round-robin`` *is*
``simulate``: the same steps at the same times, every figure equal.

The clock: the next event is either the next arrival or the step of the replica due
first, an arrival first on a tie (a single engine takes a request whose time has come
before its step). An arrival is routed at once: the router reads each replica's load
(prompt tokens not yet computed, running sequences) and the cluster index as they are at
that moment, and the request joins that replica's queue at its arrival time (plus the
clock's request latency, as in ``simulate``). A chat turn with a ``parent`` arrives its
think time after the parent finished, wherever the parent ran, and is routed then.

With a policy that reads the index (cache-aware), each replica's manager publishes its
KV-cache events once per step into a :class:`~pagedkv.sim.replicas.live_index.LiveIndex`
(what a :class:`~pagedkv.cluster.index.MemoryIndex` fed by the production ingest with no
delay holds, without its bookkeeping) that the production router reads — and,
with an events endpoint, onto that one endpoint under its data-parallel rank
(:mod:`pagedkv.sim.replicas.events`).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from pagedkv.cluster.index import ClusterIndex, Replica
from pagedkv.cluster.router import POLICIES, CostWeights, ReplicaLoad, Router, make_policy
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.wire import wire_hash
from pagedkv.sim.api import SimConfig, capacity_for, with_clock
from pagedkv.sim.engine import EngineSimulator
from pagedkv.sim.host_sweep import host_simulator
from pagedkv.sim.models import CapacityPlan
from pagedkv.sim.observe_engine import ReplayObserver
from pagedkv.sim.options import MAX_REPLICAS
from pagedkv.sim.replicas.events import ReplicaFeed, SharedEvents
from pagedkv.sim.replicas.live_index import LiveIndex
from pagedkv.sim.replicas.merge import PolicyResult, ReplicaReport, policy_result
from pagedkv.sim.scheduler import SchedulerConfig
from pagedkv.sim.workloads import Workload, request_block_hashes

__all__ = ["MAX_REPLICAS", "compare_policies", "run_replicas"]
#: ``(done, total)`` progress callback (requests finished).
Progress = Callable[[int, int], None]


def _check(num_replicas: int, policy: str, config: SimConfig) -> None:
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or \
            not 1 <= num_replicas <= MAX_REPLICAS:
        raise InvalidArgumentError(
            f"num_replicas must be a whole number from 1 to {MAX_REPLICAS}, got "
            f"{num_replicas!r}")
    if policy not in POLICIES:
        raise InvalidArgumentError(
            f"unknown router policy {policy!r}: choose one of {', '.join(POLICIES)}")
    if config.mode != "engine":
        raise InvalidArgumentError("--replicas simulates engines: use it with --mode engine")
    if config.host is not None and config.host.sweep_memory_bytes:
        raise InvalidArgumentError("a host-memory sweep compares sizes on one engine: give "
                                   "--replicas one --host-memory size")


def run_replicas(
    workload: Workload,
    config: SimConfig,
    *,
    num_replicas: int,
    policy: str,
    weights: CostWeights | None = None,
    progress: Progress | None = None,
    stop_above_ttft_p99_s: float | None = None,
    observers: Sequence[ReplayObserver] | None = None,
) -> PolicyResult:
    """Replay ``workload`` over ``num_replicas`` single engines configured by ``config``
    (each the engine ``simulate`` runs on its capacity), routed by ``policy`` (one of
    :data:`~pagedkv.cluster.router.POLICIES`).

    Every replica gets what ``config`` gives ``simulate``'s engine: its own host tier,
    and with ``config.scheduler.kv_events`` its events on that one endpoint, each batch
    tagged with the replica's data-parallel rank (:mod:`pagedkv.sim.replicas.events`).
    ``observers``: one :class:`~pagedkv.sim.observe_engine.ReplayObserver` per replica
    (missed tokens by reason, Prometheus), each observing its replica's engine as
    ``simulate``'s observer observes its one.

    ``stop_above_ttft_p99_s``: stop as soon as the TTFT p99 is sure to exceed it (more
    than 1 % of the requests, plus 2, already waited longer for their first token); the
    result then has ``stopped_early`` set and figures of the run so far.

    Raises:
        InvalidArgumentError: fewer than 1 or more than :data:`MAX_REPLICAS` replicas,
            an unknown policy, pure-cache mode, a host-memory sweep (one size per
            replica's own host tier is simulated), or not one observer per replica.
        PagedKVError: what ``simulate`` raises for ``config`` on ``workload``.
    """
    _check(num_replicas, policy, config)
    if not workload.requests:
        raise InvalidArgumentError("the workload has no requests")
    if observers is not None and len(observers) != num_replicas:
        raise InvalidArgumentError(f"observers: one per replica ({num_replicas}), got "
                                   f"{len(observers)}")
    wall0 = time.perf_counter()
    cfg = with_clock(config, workload)
    cap = capacity_for(workload, cfg)
    chosen = make_policy(policy, weights or CostWeights())
    sims: list[EngineSimulator] = []
    shared = None
    if cfg.scheduler.kv_events is not None:
        shared = SharedEvents(cfg.scheduler.kv_events, snapshot_fn=(
            (lambda: sims[0].manager.prefix_index_snapshot()) if num_replicas == 1 else None))
    try:
        names = [Replica(pod=f"replica-{k}", dp_rank=None) for k in range(num_replicas)]
        index = LiveIndex() if chosen.uses_index else None
        for k, name in enumerate(names):
            sims.append(_replica(workload, cfg, cap, ReplicaFeed(
                replica=name, rank=k + (shared.base_rank if shared else 0), index=index,
                shared=shared) if index is not None or shared is not None else None,
                None if observers is None else observers[k]))
        router = Router(cast(ClusterIndex, index), specs=sims[0].manager.config.groups,
                        policy=chosen)
        clock = _Clock(workload, sims, names, router, progress)
        clock.stop_above_s = stop_above_ttft_p99_s
        owner = clock.run()
        results = [s.result(close=True) for s in sims]
    finally:
        if shared is not None:
            shared.close()
    out = policy_result(policy, workload, cfg, cap, results, owner,
                        wall_s=time.perf_counter() - wall0)
    return replace(out, stopped_early=clock.stopped) if clock.stopped else out


def _checked(cfg: SimConfig) -> SchedulerConfig:
    """The scheduler config with ``--check-invariants`` on every step, as ``simulate``."""
    s = cfg.scheduler
    if cfg.check_invariants and not s.check_invariants_every_step:
        return replace(s, check_invariants_every_step=True)
    return s


def _replica(workload: Workload, cfg: SimConfig, cap: CapacityPlan, feed: ReplicaFeed | None,
             observer: ReplayObserver | None) -> EngineSimulator:
    """One replica: the engine ``simulate`` builds for ``cfg`` (its host tier, its
    observer), its events into ``feed``."""
    sched = _checked(cfg) if feed is None else replace(_checked(cfg), kv_events=feed)
    if cfg.host is not None:  # each replica its own host tier, as simulate's engine
        return host_simulator(workload, cap, cfg.host, sched, observer)
    factory = cap.factory if observer is None else observer.wrap(cap.factory)
    sim = EngineSimulator(workload, block_size=cap.block_size, num_blocks=cap.num_blocks,
                          config=sched, manager_factory=factory)
    if observer is not None:
        observer.attach(sim)
    return sim


class _Clock:
    """The event loop of one multi-replica run (module docstring)."""

    def __init__(self, workload: Workload, sims: list[EngineSimulator],
                 names: list[Replica], router: Router, progress: Progress | None) -> None:
        self.workload = workload
        self.sims = sims
        self.names = names
        self.router = router
        self.progress = progress
        cfg = sims[0].config
        self.scale = 1.0 / cfg.rate_scale
        at_once = cfg.arrivals == "at-once"
        self.arrivals: list[tuple[float, int]] = [
            (0.0 if at_once else r.arrival_s * self.scale, i)
            for i, r in enumerate(workload.requests) if r.parent is None]
        heapq.heapify(self.arrivals)
        last = max((t for t, _ in self.arrivals), default=0.0)
        for s in sims:
            s.sample_every_s = max(last, 1.0) / max(cfg.num_samples, 1)
            s.on_child = self._child
        self.owner = [-1] * len(workload.requests)
        self.routed_at = [0.0] * len(workload.requests)
        self.stop_above_s: float | None = None
        self.stopped = False
        self.uses_index = router.policy.uses_index
        self.needs_load = router.policy.name != "round-robin"

    def _child(self, index: int, at_s: float) -> None:
        heapq.heappush(self.arrivals, (at_s, index))

    def run(self) -> list[int]:
        """Route and step until every replica is idle; returns the replica of each
        request (-1: never arrived)."""
        sims = self.sims
        arrivals = self.arrivals
        total = len(self.workload.requests)
        done = 0
        steps = 0
        inf = float("inf")
        while True:
            due: EngineSimulator | None = None
            due_s = inf
            for s in sims:
                t = s.next_event_s
                if t is not None and t < due_s:
                    due, due_s = s, t
            if arrivals and arrivals[0][0] <= due_s:
                at_s, i = heapq.heappop(arrivals)
                self._route(i, at_s)
                continue
            if due is None:
                break
            due.step()
            done += len(due.finished)
            steps += 1
            if steps % 1024 == 0:
                if self.progress is not None:
                    self.progress(done, total)
                if self.stop_above_s is not None and self._slo_lost(self.stop_above_s):
                    self.stopped = True
                    break
        if self.progress is not None:
            self.progress(done, total)
        return self.owner

    def _slo_lost(self, limit_s: float) -> bool:
        """Whether more than 1 % of the requests (plus 2) already waited over
        ``limit_s`` for their first token: the TTFT p99 cannot end below it."""
        late = 0
        need = 0.01 * len(self.owner) + 2
        for i, k in enumerate(self.owner):
            if k < 0:
                continue
            sim = self.sims[k]
            first = sim.res.first_token_s[i]
            end = sim.now_s if first is None else first
            if end - self.routed_at[i] > limit_s:
                late += 1
                if late >= need:
                    return True
        return False

    def _route(self, i: int, at_s: float) -> None:
        r = self.workload.requests[i]
        hashes: list[int] = []
        if self.uses_index:
            bs = self.sims[0].block_size
            raw = request_block_hashes(r, bs, source_block_size=self.workload.source_block_size,
                                       index=i)
            if raw is None:
                raw = self.sims[0].manager.new_request(
                    r.request_id, r.prompt_token_ids or [0] * r.num_prompt_tokens).block_hashes
            hashes = [wire_hash(h) for h in raw]
        loads = {n: _load(s) if self.needs_load else ReplicaLoad()
                 for n, s in zip(self.names, self.sims, strict=True)}
        choice = self.router.route(hashes, num_tokens=r.num_prompt_tokens, loads=loads)
        k = self.names.index(choice.replica)
        self.owner[i] = k
        self.routed_at[i] = at_s
        self.sims[k].submit(i, at_s=at_s)


def _load(sim: EngineSimulator) -> ReplicaLoad:
    """What the router reads of a replica: prompt tokens not computed yet (pending,
    waiting, or running in prefill) and the running sequences."""
    reqs = sim.workload.requests
    queued = sum(reqs[i].num_prompt_tokens for _, i in sim.pending)
    queued += sum(x.num_tokens - x.computed for x in sim.waiting)
    for x in sim.running:
        if x.generated == 0:
            queued += x.num_tokens - x.computed
    return ReplicaLoad(queued_prefill_tokens=queued, running_seqs=len(sim.running))


def compare_policies(
    workload: Workload,
    config: SimConfig,
    *,
    num_replicas: int,
    policies: Sequence[str] = POLICIES,
    weights: CostWeights | None = None,
    phase: Callable[[str], None] | None = None,
    progress: Progress | None = None,
    observers: Callable[[str, int], Sequence[ReplayObserver]] | None = None,
) -> ReplicaReport:
    """:func:`run_replicas` once per policy on the one loaded ``workload`` (default:
    round-robin, least-loaded, cache-aware), each on fresh replicas. ``phase(policy)`` is
    called before each policy; ``observers(policy, num_replicas)`` gives that run's
    observers (one per replica)."""
    results = []
    for policy in policies:
        if phase is not None:
            phase(policy)
        results.append(run_replicas(
            workload, config, num_replicas=num_replicas, policy=policy, weights=weights,
            progress=progress,
            observers=None if observers is None else observers(policy, num_replicas)))
    return ReplicaReport(workload=workload.name, num_requests=len(workload.requests),
                         num_replicas=num_replicas, weights=weights or CostWeights(),
                         results=tuple(results))

