"""Engine mode: continuous batching on a :class:`pagedkv.KVCacheManager`, simulated clock.

One step, as vLLM's v1 scheduler does it:

1. **Arrivals**: requests whose arrival time has come join the back of the waiting queue.
   Arrival times are the workload's (divided by ``rate_scale``), or all 0 with
   ``arrivals="at-once"``; a request with a ``parent`` (next chat turn) arrives
   ``think_s`` after its parent finished.
2. **Running requests first**, oldest admission first, while the step's token budget
   lasts: each gets ``min(tokens not yet computed, budget left)`` tokens — a prefill chunk
   (chunked prefill) or one decode token. If ``allocate_slots`` says there is no room, the
   **newest running request is preempted** (freed, its computed tokens dropped, put at the
   *front* of the waiting queue) and the allocation is retried; when the request itself is
   the newest, it is the one preempted. This is vLLM's recompute preemption: the oldest
   request always makes progress.
3. **Admissions** (only in a step without preemption): from the front of the waiting queue
   while fewer than ``max_running`` run and budget is left: a fresh prefix-cache lookup,
   then ``allocate_slots`` for the rest of the prompt (chunked to the budget). No room
   stops admission for this step (first come, first served), and the blocked request is
   tried again only once more blocks are free than at its failure (a futile lookup per
   step would dominate the run time of an overloaded replay; a hit that grew meanwhile
   because another request cached the blocks it needs is thereby noticed a little late).
   A preempted request comes back through here: it looks up its own blocks again, which
   may still be cached.
4. **Clock**: the step takes ``StepTimeModel.step_time_s(prefill tokens, decode
   sequences)``; then every scheduled request advances, a request whose last scheduled
   token completes its known tokens samples one output token (the first one is its time to
   first token), and a request with all its output tokens finishes and is freed.

The clock jumps to the next arrival when nothing runs or waits. A request that could not
fit even in an empty cache (``ceil((prompt + output - 1) / block_size)`` blocks >
capacity) is rejected on arrival and counted.

Skipped calls: with one full-attention group, a decode step whose token lands in a block
the request already holds and fills no block changes nothing in the manager, so the
scheduler does not call ``allocate_slots`` for it (a measured 3-4x speed-up; the state is
identical).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pagedkv import FullAttentionSpec, InvalidArgumentError, KVCacheManager, Request
from pagedkv.events.config import KVEventsConfig
from pagedkv.sim.results import SimResult
from pagedkv.sim.workloads import SimRequest, Workload, check_block_size, request_block_hashes

__all__ = [
    "EngineResult",
    "EngineSimulator",
    "SchedulerConfig",
    "StepTimeModel",
    "build_manager",
    "request_blocks_needed",
]

EngineResult = SimResult

#: Progress callback: (requests finished or rejected, total requests).
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimeModel:
    """Duration of one engine step::

        step_time_s = step_overhead_s
                      + prefill_token_s * (prefill tokens computed in the step)
                      + decode_seq_s * (sequences decoding one token in the step)

    Defaults are round figures for an 8B-parameter model in BF16 on one 80 GB H100-class
    GPU (the default capacity of ``pagedkv simulate`` is the planner's for that setup):
    4 ms per step (reading the weights once), 20 µs per prefill token (50,000 prefill
    tokens/s), 0.1 ms per decoding sequence. Prefix-cache hits are not computed, so they
    cost nothing. Change them to match your hardware; read the shape of queueing and TTFT
    from the defaults, not their absolute values.
    """

    step_overhead_s: float = 0.004
    prefill_token_s: float = 20e-6
    decode_seq_s: float = 0.1e-3

    def __post_init__(self) -> None:
        for name in ("step_overhead_s", "prefill_token_s", "decode_seq_s"):
            if getattr(self, name) < 0:
                raise InvalidArgumentError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.step_overhead_s + self.prefill_token_s + self.decode_seq_s <= 0:
            raise InvalidArgumentError("a step must take some time: all step costs are 0")

    def step_time_s(self, num_prefill_tokens: int, num_decode_seqs: int) -> float:
        return (
            self.step_overhead_s
            + self.prefill_token_s * num_prefill_tokens
            + self.decode_seq_s * num_decode_seqs
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Engine-mode knobs (module docstring). ``token_budget``: tokens computed per step
    (vLLM's ``max_num_batched_tokens``); ``max_running``: ``max_num_seqs``."""

    token_budget: int = 8192
    max_running: int = 256
    arrivals: str = "trace"
    rate_scale: float = 1.0
    step_time: StepTimeModel = field(default_factory=StepTimeModel)
    num_samples: int = 400
    check_invariants_every_step: bool = False
    kv_events: KVEventsConfig | None = None

    def __post_init__(self) -> None:
        if self.token_budget < 1 or self.max_running < 1:
            raise InvalidArgumentError(
                f"token_budget and max_running must be >= 1, got {self.token_budget} and "
                f"{self.max_running}"
            )
        if self.arrivals not in ("trace", "at-once"):
            raise InvalidArgumentError(
                f"arrivals must be 'trace' or 'at-once', got {self.arrivals!r}"
            )
        if not self.rate_scale > 0:
            raise InvalidArgumentError(f"rate_scale must be > 0, got {self.rate_scale}")


class ManagerFactory(Protocol):
    """Builds the manager a simulation runs on (:func:`build_manager` is the default; a
    hybrid model's factory builds every group, :mod:`pagedkv.sim.models`)."""

    def __call__(
        self,
        workload: Workload,
        *,
        block_size: int,
        num_blocks: int,
        kv_events: KVEventsConfig | None = None,
    ) -> KVCacheManager: ...


def request_blocks_needed(r: SimRequest, block_size: int) -> int:
    """Blocks the request holds at its largest: ``ceil((prompt + output - 1) / b)``."""
    total = r.num_prompt_tokens + max(1, r.num_output_tokens) - 1
    return -(-total // block_size)


def workload_max_len(workload: Workload, block_size: int) -> int:
    """``max_model_len`` for replaying ``workload``: its longest prompt + output, and room
    for a prompt padded to whole blocks plus one token (reference semantics)."""
    return max(
        (max(r.num_prompt_tokens + max(1, r.num_output_tokens),
             -(-r.num_prompt_tokens // block_size) * block_size + 1)
         for r in workload.requests),
        default=1,
    )


def build_manager(
    workload: Workload,
    *,
    block_size: int,
    num_blocks: int,
    kv_events: KVEventsConfig | None = None,
) -> KVCacheManager:
    """A one-group full-attention manager sized for ``workload`` (``max_model_len`` = its
    longest prompt + output), SHA-256 hashing of generated tokens; KV-cache events are
    published per ``kv_events`` (off by default).

    Raises:
        InvalidArgumentError: a block size the workload's hashes cannot be replayed at, or
            fewer than 2 blocks.
    """
    check_block_size(block_size, workload.source_block_size)
    if num_blocks < 2:
        raise InvalidArgumentError(
            f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}"
        )
    max_len = workload_max_len(workload, block_size)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128,
                             dtype_bytes=2)
    return KVCacheManager.from_spec(spec, num_blocks=num_blocks, max_model_len=max_len,
                                    kv_events=kv_events)


def make_request(
    mgr: KVCacheManager,
    workload: Workload,
    index: int,
    block_size: int,
    *,
    num_tokens: int | None = None,
    num_hashed_blocks: int | None = None,
) -> Request:
    """The manager request for ``workload.requests[index]`` (hashes per workloads.py).
    ``num_tokens`` / ``num_hashed_blocks``: placeholder prompt length and hashed blocks
    other than the prompt's (reference semantics, :mod:`pagedkv.sim.semantics`)."""
    r = workload.requests[index]
    hashes = request_block_hashes(
        r, block_size, source_block_size=workload.source_block_size, index=index,
        num_blocks=num_hashed_blocks,
    )
    if r.prompt_token_ids is not None:
        return mgr.new_request(r.request_id, r.prompt_token_ids, block_hashes=hashes)
    n = r.num_prompt_tokens if num_tokens is None else num_tokens
    return mgr.new_request(r.request_id, [0] * n, block_hashes=hashes)


class _Live:
    """A request inside the engine.

    ``computed`` and ``num_tokens`` are the engine's view; output tokens are pushed to the
    manager's request (and its block hashes extended) lazily, by :meth:`sync`, before any
    manager call that reads it — so a decode step that needs no manager call costs a few
    integer operations.
    """

    __slots__ = (
        "blocked_at", "computed", "first_scheduled", "generated", "index", "num_tokens",
        "outputs", "pushed", "req", "target",
    )

    def __init__(self, index: int, req: Request, sim: SimRequest) -> None:
        self.index = index
        self.req = req
        self.target = max(1, sim.num_output_tokens)
        self.generated = 0
        self.pushed = 0
        self.computed = 0
        self.num_tokens = req.num_tokens
        self.outputs = sim.output_token_ids
        self.first_scheduled = False
        #: Free blocks when its admission last failed (None: not blocked).
        self.blocked_at: int | None = None

    def sync(self) -> Request:
        """Push pending output tokens and the computed count to the manager's request."""
        req = self.req
        if self.pushed < self.generated:
            a, b = self.pushed, self.generated
            outs = self.outputs
            if outs is None:
                req.append_output_tokens([self.index + 1] * (b - a))  # unique per request
            else:
                req.append_output_tokens(
                    [outs[k] if k < len(outs) else self.index + 1 for k in range(a, b)]
                )
            self.pushed = b
        req.num_computed_tokens = self.computed
        return req


class EngineSimulator:
    """Replays a workload through continuous batching (module docstring) on a fresh
    manager of ``num_blocks`` blocks of ``block_size`` tokens.

    ``run`` may be called once per instance.
    """

    def __init__(
        self,
        workload: Workload,
        *,
        block_size: int,
        num_blocks: int,
        config: SchedulerConfig | None = None,
    ) -> None:
        self.workload = workload
        self.block_size = block_size
        self.config = config or SchedulerConfig()
        self.manager = build_manager(workload, block_size=block_size, num_blocks=num_blocks,
                                     kv_events=self.config.kv_events)

    def run(self, progress: Progress | None = None) -> SimResult:
        """Run to completion; returns the measurements. ``progress`` is called every few
        hundred steps. Raises AssertionError from ``check_invariants`` (debug only)."""
        wall0 = time.perf_counter()
        cfg = self.config
        wl = self.workload
        reqs = wl.requests
        mgr = self.manager
        bs = self.block_size
        n = len(reqs)
        capacity = mgr.num_free_blocks
        res = SimResult(
            mode="engine", workload=wl.name, block_size=bs, num_blocks=capacity + 1,
            query_tokens=[r.num_prompt_tokens for r in reqs], hit_tokens=[0] * n,
            lookup_time_s=[None] * n, arrival_s=[0.0] * n, first_scheduled_s=[None] * n,
            first_token_s=[None] * n, finish_s=[None] * n,
        )
        scale = 1.0 / cfg.rate_scale
        at_once = cfg.arrivals == "at-once"
        children: dict[int, list[int]] = {}
        pending: list[tuple[float, int]] = []
        for i, r in enumerate(reqs):
            if r.parent is None:
                pending.append((0.0 if at_once else r.arrival_s * scale, i))
            else:
                children.setdefault(r.parent, []).append(i)
        heapq.heapify(pending)
        last_arrival = max((t for t, _ in pending), default=0.0)
        sample_every = max(last_arrival, 1.0) / max(cfg.num_samples, 1)
        next_sample = 0.0

        budget0 = cfg.token_budget
        max_running = cfg.max_running
        step_model = cfg.step_time
        check = cfg.check_invariants_every_step
        publish = cfg.kv_events is not None
        allocate = mgr.allocate_slots
        waiting: deque[_Live] = deque()
        running: list[_Live] = []
        now = 0.0
        done = 0
        steps = 0
        preemptions = 0
        pre_query = 0
        pre_hit = 0

        def release(i: int, t: float) -> None:
            for c in children.get(i, ()):
                heapq.heappush(pending, (t + reqs[c].think_s * scale, c))

        def finish(live: _Live) -> None:
            nonlocal done
            mgr.free(live.req)
            res.finish_s[live.index] = now
            live.outputs = None
            done += 1
            release(live.index, now)

        while pending or waiting or running:
            while pending and pending[0][0] <= now:
                t, i = heapq.heappop(pending)
                res.arrival_s[i] = t
                if request_blocks_needed(reqs[i], bs) > capacity:
                    res.rejected += 1
                    done += 1
                    release(i, t)
                else:
                    waiting.append(_Live(i, make_request(mgr, wl, i, bs), reqs[i]))
            if not waiting and not running:
                if pending:
                    now = pending[0][0]
                continue
            budget = budget0
            decode: list[_Live] = []
            prefill: list[tuple[_Live, int]] = []
            num_prefill = 0
            preempted = False
            k = 0
            while k < len(running) and budget > 0:
                live = running[k]
                computed = live.computed
                todo = live.num_tokens - computed
                is_decode = todo == 1 and live.generated > 0
                if is_decode and computed % bs and (computed + 1) % bs:
                    # the token lands in a held block and fills none: no manager call
                    decode.append(live)
                    budget -= 1
                    k += 1
                    continue
                num_new = todo if todo < budget else budget
                while allocate(live.sync(), num_new) is None:
                    victim = running.pop()
                    victim.sync()
                    mgr.free(victim.req)
                    victim.computed = victim.req.num_computed_tokens = 0
                    victim.req.num_preemptions += 1
                    waiting.appendleft(victim)
                    preemptions += 1
                    preempted = True
                    if victim is live:
                        break
                else:
                    if is_decode:
                        decode.append(live)
                    else:
                        prefill.append((live, num_new))
                        num_prefill += num_new
                    budget -= num_new
                    k += 1

            if not preempted:
                while waiting and len(running) < max_running and budget > 0:
                    live = waiting[0]
                    if live.blocked_at is not None and mgr.num_free_blocks <= live.blocked_at:
                        break
                    req = live.req
                    hit = mgr.get_computed_blocks(req)
                    num_hit = hit.num_computed_tokens
                    todo = req.num_tokens - num_hit
                    num_new = todo if todo < budget else budget
                    if allocate(req, num_new, new_computed_blocks=hit) is None:
                        live.blocked_at = mgr.num_free_blocks
                        break
                    live.blocked_at = None
                    waiting.popleft()
                    live.computed = req.num_computed_tokens = num_hit
                    live.num_tokens = req.num_tokens
                    i = live.index
                    if req.num_preemptions:
                        pre_query += req.num_tokens
                        pre_hit += num_hit
                    else:
                        res.hit_tokens[i] = num_hit
                        res.lookup_time_s[i] = now
                    if not live.first_scheduled:
                        live.first_scheduled = True
                        res.first_scheduled_s[i] = now
                    running.append(live)
                    prefill.append((live, num_new))
                    num_prefill += num_new
                    budget -= num_new

            now += step_model.step_time_s(num_prefill, len(decode))
            steps += 1
            if publish:
                mgr.publish_events()
            finished = False
            for live in decode:
                live.computed += 1
                live.generated += 1
                if live.generated >= live.target:
                    finish(live)
                    finished = True
                else:
                    live.num_tokens += 1
            for live, num_new in prefill:
                live.computed += num_new
                if live.computed < live.num_tokens:
                    continue
                if live.generated == 0:
                    res.first_token_s[live.index] = now
                live.generated += 1
                if live.generated >= live.target:
                    finish(live)
                    finished = True
                else:
                    live.num_tokens += 1
            if finished:
                running = [x for x in running if x.generated < x.target]
            if check:
                for x in running:
                    x.sync()
                mgr.check_invariants()
            if now >= next_sample:
                next_sample = now + sample_every
                res.sample_time_s.append(now)
                res.sample_usage.append(mgr.usage)
                res.sample_running.append(len(running))
                res.sample_waiting.append(len(waiting))
            if progress is not None and steps % 256 == 0:
                progress(done, n)

        if progress is not None:
            progress(done, n)
        res.evicted_blocks = mgr.num_evicted_blocks
        res.preemptions = preemptions
        res.preempted_query_tokens = pre_query
        res.preempted_hit_tokens = pre_hit
        res.num_steps = steps
        res.sim_duration_s = now
        res.wall_s = time.perf_counter() - wall0
        if publish:
            mgr.publish_events()
            mgr.close()
        return res
