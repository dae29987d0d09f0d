"""Engine mode: continuous batching on a :class:`pagedkv.KVCacheManager`, simulated clock.

One step, as vLLM's v1 scheduler does it:

1. **Arrivals**: requests whose arrival time has come join the back of the waiting queue.
   Arrival times are the workload's (divided by ``rate_scale``), or all 0 with
   ``arrivals="at-once"``; a chat turn with a ``parent`` arrives ``think_s`` after it.
2. **Running requests first**, oldest admission first, while the step's token budget
   lasts: each gets ``min(tokens not yet computed, budget left)`` tokens — a prefill chunk
   or one decode token. If ``allocate_slots`` says there is no room, the **newest running
   request is preempted** (freed, its computed tokens dropped, put at the *front* of the
   waiting queue; itself if newest) and the allocation retried (recompute preemption).
3. **Admissions** (only in a step without preemption): from the front of the waiting queue
   while fewer than ``max_running`` run and budget is left: a fresh prefix-cache lookup,
   then ``allocate_slots`` for the rest of the prompt (chunked to the budget). No room
   stops admission for this step (first come, first served), and the blocked request is
   tried again only once more blocks are free than at its failure (no futile lookup per
   step; a hit that grew meanwhile is noticed a little late). A preempted request comes
   back through here and looks up its own blocks again.
4. **Clock**: the step takes the roofline clock's time for its batch
   (:mod:`pagedkv.sim.clock`: every scheduled request's context and new tokens), or with
   the linear model ``StepTimeModel.step_time_s(prefill tokens, decode sequences)``; then
   every scheduled request advances; one that completes its known tokens samples an
   output token (the first: its time to first token) or, with all of them, finishes.

The clock jumps to the next arrival when nothing runs or waits. A request longer than
``max_model_len`` or than an empty cache holds is rejected on arrival and counted by reason.

**One replica stepped from outside** (:mod:`pagedkv.sim.replicas`: N of these on one
clock): :meth:`~EngineSimulator.submit` requests (workload indices) at their arrival times
as the router assigns them, :meth:`~EngineSimulator.step` while ``sim.next_event_s`` is due
(:meth:`~EngineSimulator.run_until`); ``on_child(index, at_s)``, when set, takes a chained
turn instead of the replica's own queue. :meth:`~EngineSimulator.run` is ``submit`` of
every root request, then ``step`` until idle::

    >>> from pagedkv.sim import EngineSimulator, system_prompts
    >>> wl = system_prompts(num_groups=1, questions_per_group=3)
    >>> sim = EngineSimulator(wl, block_size=16, num_blocks=400)
    >>> for i in range(3):
    ...     sim.submit(i, at_s=0.5 * i)
    >>> sim.run_until(10.0)
    >>> sim.has_work, sim.result().num_finished
    (False, 3)

Skipped calls (one full-attention group): a decode token inside a held block makes no
manager call (3-4x faster), or only ``cache_blocks`` when it fills the block; the
manager's state is identical either way.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable

from pagedkv import FullAttentionSpec, KVCacheManager
from pagedkv.sim.results import SimResult
from pagedkv.sim.scheduler import (
    LiveRequest,
    ManagerFactory,
    Progress,
    SchedulerConfig,
    build_manager,
    make_request,
)
from pagedkv.sim.workloads import SimRequest, Workload

__all__ = ["EngineSimulator"]


class EngineSimulator:
    """One engine replica replaying (part of) a workload through continuous batching
    (module docstring) on a fresh manager of ``num_blocks`` blocks; ``block_size`` is the
    block size request hashes are made at (the manager's smallest group block size).

    ``manager_factory`` builds the manager (default: one full-attention group). Drive it
    with :meth:`run`, or from outside with :meth:`submit` / :meth:`step` /
    :meth:`run_until`.
    """

    def __init__(
        self,
        workload: Workload,
        *,
        block_size: int,
        num_blocks: int,
        config: SchedulerConfig | None = None,
        manager_factory: ManagerFactory | None = None,
    ) -> None:
        self.workload = workload
        self.block_size = block_size
        self.config = cfg = config or SchedulerConfig()
        factory = manager_factory or build_manager
        self.manager: KVCacheManager = factory(
            workload, block_size=block_size, num_blocks=num_blocks, kv_events=cfg.kv_events
        )
        mgr = self.manager
        groups = mgr.config.groups
        self._groups = groups
        #: decode tokens inside a held block skip the manager (one full-attention group)
        self._fast_decode = (
            len(groups) == 1 and type(groups[0]) is FullAttentionSpec
            and groups[0].block_size == block_size
        )
        self.capacity_blocks = mgr.num_free_blocks
        reqs = workload.requests
        n = len(reqs)
        self.res = SimResult(
            mode="engine", workload=workload.name, block_size=block_size,
            num_blocks=self.capacity_blocks + 1,
            query_tokens=[r.num_prompt_tokens for r in reqs], hit_tokens=[0] * n,
            lookup_time_s=[None] * n, arrival_s=[0.0] * n, first_scheduled_s=[None] * n,
            first_token_s=[None] * n, finish_s=[None] * n,
            output_tokens=[max(1, r.num_output_tokens) for r in reqs],
        )
        self._scale = 1.0 / cfg.rate_scale
        self._children: dict[int, list[int]] = {}
        for i, r in enumerate(reqs):
            if r.parent is not None:
                self._children.setdefault(r.parent, []).append(i)
        self._pending: list[tuple[float, int]] = []
        self.waiting: deque[LiveRequest] = deque()
        self.running: list[LiveRequest] = []
        self.now_s = 0.0
        #: Workload indices finished (or rejected) in the last :meth:`step`.
        self.finished: list[int] = []
        self.num_done = 0
        self.sample_every_s = 1.0
        #: where a chained turn goes when its parent ends (None: this replica's queue)
        self.on_child: Callable[[int, float], None] | None = None
        self._next_sample = 0.0
        self._wall_s = 0.0
        self._publish = cfg.kv_events is not None
        #: the roofline clock's batch-aware step time (None: the linear model)
        self._batch_time = getattr(cfg.step_time, "batch_time_s", None)
        #: client -> engine per request (the roofline clock's; 0 with the linear model):
        #: the engine sees a request this long after its arrival time
        self._latency_s = float(getattr(cfg.step_time, "request_latency_s", 0.0))
        self._batch: tuple[list[LiveRequest], list[tuple[LiveRequest, int]]] = ([], [])
        #: seconds charged per clock term (weights, compute, KV reads, overhead, comm.)
        self.clock_terms_s = [0.0] * 5

    # ------------------------------------------------------------ driving from outside

    def submit(self, index: int, *, at_s: float) -> None:
        """Let request ``index`` arrive at ``at_s`` s (if past: taken at the next step)."""
        heapq.heappush(self._pending, (at_s + self._latency_s, index))

    @property
    def pending(self) -> list[tuple[float, int]]:
        """Submitted requests not arrived yet: (engine-side time, index), a heap."""
        return self._pending

    @property
    def has_work(self) -> bool:
        """Whether a request is pending, waiting or running."""
        return bool(self._pending or self.waiting or self.running)

    @property
    def next_event_s(self) -> float | None:
        """When the next :meth:`step` happens: now while requests wait or run, else the
        next arrival (None when idle)."""
        if self.waiting or self.running:
            return self.now_s
        return self._pending[0][0] if self._pending else None

    def run_until(self, t_s: float) -> None:
        """Step while the next event is at or before ``t_s``."""
        while True:
            nxt = self.next_event_s
            if nxt is None or nxt > t_s:
                return
            self.step()

    def run(self, progress: Progress | None = None) -> SimResult:
        """Submit every root request of the workload at its arrival time and step until
        idle; returns the measurements. ``progress`` is called every few hundred steps.
        Raises AssertionError from ``check_invariants`` (debug only)."""
        wall0 = time.perf_counter()
        cfg = self.config
        at_once = cfg.arrivals == "at-once"
        last = 0.0
        for i, r in enumerate(self.workload.requests):
            if r.parent is None:
                t = 0.0 if at_once else r.arrival_s * self._scale
                self._pending.append((t + self._latency_s, i))
                last = max(last, t)
        heapq.heapify(self._pending)
        self.sample_every_s = max(last, 1.0) / max(cfg.num_samples, 1)
        n = len(self.workload.requests)
        steps = 0
        while self.has_work:
            self.step()
            steps += 1
            if progress is not None and steps % 256 == 0:
                progress(self.num_done, n)
        if progress is not None:
            progress(self.num_done, n)
        self._wall_s += time.perf_counter() - wall0
        return self.result(close=True)

    def result(self, *, close: bool = False) -> SimResult:
        """The measurements so far (``close``: also flush and close the event publisher)."""
        res = self.res
        mgr = self.manager
        res.evicted_blocks = mgr.num_evicted_blocks
        res.sim_duration_s = self.now_s
        res.wall_s = self._wall_s
        if self._batch_time is not None:
            res.clock_terms_s = list(self.clock_terms_s)
        if close and self._publish:
            mgr.publish_events()
            mgr.close()
        return res

    # ------------------------------------------------------------ one step

    def step(self) -> None:
        """One engine step (module docstring): arrivals, running requests, admissions,
        clock. With nothing waiting or running, jumps the clock to the next arrival."""
        self.finished = []
        self._take_arrivals()
        if not self.waiting and not self.running:
            if self._pending:
                nxt = self._pending[0][0]
                if nxt > self.now_s:
                    self._sample(force=True)  # the idle state, before the clock jumps
                    self.now_s = nxt
            return
        self.manager.new_step_starts()  # states registered last step may now be hit
        budget = self.config.token_budget
        decode: list[LiveRequest] = []
        prefill: list[tuple[LiveRequest, int]] = []
        budget, preempted = self._schedule_running(budget, decode, prefill)
        if not preempted:
            self._admit_waiting(budget, prefill)
        copies = self.manager.take_block_copies()  # sub-block hits: copied with the step
        if copies.retained:
            self.manager.release_blocks(copies.retained)
        self._advance_clock(decode, prefill)
        self._sample()

    def _take_arrivals(self) -> None:
        pending = self._pending
        reqs = self.workload.requests
        res = self.res
        while pending and pending[0][0] <= self.now_s:
            t, i = heapq.heappop(pending)
            res.arrival_s[i] = t - self._latency_s
            over = reqs[i].over_context(self.config.max_model_len)
            if over or self._blocks_needed(reqs[i]) > self.capacity_blocks:
                res.count_rejected(over_context=over)
                self._done(i, t)
            else:
                self.waiting.append(
                    LiveRequest(i, make_request(self.manager, self.workload, i, self.block_size),
                          reqs[i], self.block_size))

    def _blocks_needed(self, r: SimRequest) -> int:
        total = r.num_prompt_tokens + max(1, r.num_output_tokens) - 1
        budget = self.config.token_budget
        return sum(g.max_admission_blocks(total, max_num_batched_tokens=budget)
                   for g in self._groups)

    def _schedule_running(
        self, budget: int, decode: list[LiveRequest], prefill: list[tuple[LiveRequest, int]]
    ) -> tuple[int, bool]:
        """Give running requests, oldest first, their next chunk or decode token;
        preempt the newest on no room. Returns (budget left, whether it preempted)."""
        mgr = self.manager
        allocate = mgr.allocate_slots
        cache = mgr.cache_blocks
        running = self.running
        bs = self.block_size
        fast = self._fast_decode
        preempted = False
        k = 0
        while k < len(running) and budget > 0:
            live = running[k]
            computed = live.computed
            todo = live.num_tokens - computed
            is_decode = todo == 1 and live.generated > 0
            if fast and is_decode and computed % bs:
                # the token lands in a held block: nothing to allocate. If it fills the
                # block, register it (what allocate_slots would do, without its checks).
                if not (computed + 1) % bs:
                    cache(live.sync(), computed + 1)
                decode.append(live)
                budget -= 1
                k += 1
                continue
            num_new = todo if todo < budget else budget
            while allocate(live.sync(), num_new) is None:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is live:
                    break
            else:
                if is_decode:
                    decode.append(live)
                else:
                    prefill.append((live, num_new))
                budget -= num_new
                k += 1
        return budget, preempted

    def _preempt(self, victim: LiveRequest) -> None:
        victim.sync()
        self.manager.free(victim.req)
        victim.computed = victim.req.num_computed_tokens = 0
        victim.req.num_preemptions += 1
        self.waiting.appendleft(victim)
        self.res.preemptions += 1

    def _admit_waiting(self, budget: int, prefill: list[tuple[LiveRequest, int]]) -> None:
        """Admit from the front of the waiting queue (first come, first served) while
        there is budget, room and fewer than ``max_running`` run."""
        mgr = self.manager
        waiting = self.waiting
        running = self.running
        res = self.res
        max_running = self.config.max_running
        now = self.now_s
        while waiting and len(running) < max_running and budget > 0:
            live = waiting[0]
            if live.blocked_at is not None and mgr.num_free_blocks <= live.blocked_at:
                break
            req = live.req
            num_hit = self._lookup_and_allocate(live, budget)
            if num_hit is None:
                live.blocked_at = mgr.num_free_blocks
                break
            todo = req.num_tokens - num_hit
            num_new = todo if todo < budget else budget
            live.blocked_at = None
            waiting.popleft()
            live.computed = req.num_computed_tokens = num_hit
            live.num_tokens = req.num_tokens
            i = live.index
            if req.num_preemptions:
                res.preempted_query_tokens += req.num_tokens
                res.preempted_hit_tokens += num_hit
            else:
                res.hit_tokens[i] = num_hit
                res.lookup_time_s[i] = now
            if not live.first_scheduled:
                live.first_scheduled = True
                res.first_scheduled_s[i] = now
            running.append(live)
            prefill.append((live, num_new))
            budget -= num_new

    def _lookup_and_allocate(self, live: LiveRequest, budget: int) -> int | None:
        """Admission of ``live``: look up its cached prefix and allocate its prompt's
        next ``min(rest, budget)`` tokens. Returns the hit tokens, or None when there is
        no room (nothing changed). A subclass may look further (a host tier)."""
        mgr = self.manager
        req = live.req
        hit = mgr.get_computed_blocks(req)
        num_hit = hit.num_computed_tokens
        todo = req.num_tokens - num_hit
        num_new = todo if todo < budget else budget
        if mgr.allocate_slots(req, num_new, new_computed_blocks=hit) is None:
            return None
        return num_hit

    def _step_duration_s(self, num_prefill_tokens: int, num_decode_seqs: int) -> float:
        """The step's simulated duration (the step-time model: the roofline clock on the
        step's batch, or the linear model on its counts); a subclass may add the work the
        step carries besides compute (host-tier copies) and settle it."""
        batch_time = self._batch_time
        if batch_time is not None:
            decode, prefill = self._batch
            return float(batch_time(decode, prefill, self.clock_terms_s))
        return self.config.step_time.step_time_s(num_prefill_tokens, num_decode_seqs)

    def _advance_clock(
        self, decode: list[LiveRequest], prefill: list[tuple[LiveRequest, int]]
    ) -> None:
        """End the step: advance the clock by its duration, then every scheduled request
        by what it computed; sample tokens and finish requests that have them all."""
        cfg = self.config
        num_prefill = sum(n for _, n in prefill)
        if self._batch_time is not None:
            self._batch = (decode, prefill)
        self.now_s += self._step_duration_s(num_prefill, len(decode))
        self.res.num_steps += 1
        if self._publish:
            self.manager.publish_events()
        finished = False
        # Sampling a token, inlined (a million times in a long replay): a request whose
        # known tokens are all computed samples one; with all of them it finishes.
        for live in decode:
            live.computed += 1
            live.generated += 1
            if live.generated < live.target:
                live.num_tokens += 1
            else:
                self._finish(live)
                finished = True
        first_token = self.res.first_token_s
        for live, num_new in prefill:
            live.computed += num_new
            if live.computed < live.num_tokens:
                continue
            if live.generated == 0:
                first_token[live.index] = self.now_s
            live.generated += 1
            if live.generated < live.target:
                live.num_tokens += 1
            else:
                self._finish(live)
                finished = True
        if finished:
            self.running = [x for x in self.running if x.generated < x.target]
        if cfg.check_invariants_every_step:
            for x in self.running:
                x.sync()
            self.manager.check_invariants()

    def _finish(self, live: LiveRequest) -> None:
        """The request has all its tokens: free it and record when."""
        self.manager.free(live.req)
        self.res.finish_s[live.index] = self.now_s
        live.outputs = None
        self._done(live.index, self.now_s)

    def _done(self, index: int, t: float) -> None:
        """``index`` finished or was rejected at ``t``: release its chained children."""
        self.num_done += 1
        self.finished.append(index)
        reqs = self.workload.requests
        for c in self._children.get(index, ()):
            at_s = t + reqs[c].think_s * self._scale
            if self.on_child is not None:
                self.on_child(c, at_s)
            else:
                heapq.heappush(self._pending, (at_s + self._latency_s, c))

    def _sample(self, *, force: bool = False) -> None:
        if self.now_s < self._next_sample and not force:
            return
        res = self.res
        self._next_sample = self.now_s + self.sample_every_s
        res.sample_time_s.append(self.now_s)
        res.sample_usage.append(self.manager.usage)
        res.sample_running.append(len(self.running))
        res.sample_waiting.append(len(self.waiting))
