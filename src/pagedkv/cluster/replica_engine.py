"""One simulated engine replica that a driver steps from outside (the multi-replica
simulation needs N of them on one clock, which :class:`pagedkv.sim.EngineSimulator`'s
single ``run()`` cannot give).

A step, vLLM's v1 scheduler in miniature:

1. **running requests first** (oldest first) while the token budget lasts: a prefill
   chunk or one decode token each; when ``allocate_slots`` says no, the newest running
   request is preempted (freed, back to the front of the queue; recompute) and the
   allocation is retried;
2. **admissions** from the front of the queue (only in a step without preemption) while
   fewer than ``max_running`` run: a prefix-cache lookup, then ``allocate_slots`` for the
   (chunked) rest of the prompt; no room stops admission for the step;
3. the step lasts ``StepTimeModel.step_time_s(prefill tokens, decoding sequences)``; a
   request whose computed tokens reach its known tokens samples one output token (the
   first is its time to first token) and finishes after its output length.

A decode token that neither starts nor fills a block changes nothing in the manager, so
no call is made for it (same state, a few times faster).

KV usage is sampled as :class:`pagedkv.sim.EngineSimulator` samples it (at the end of the
first step ending at or after each sampling time, a sampling time ``sample_every_s``
after the last sample, and once before an idle gap), so one replica reports the single
engine's mean usage.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pagedkv import (
    FullAttentionSpec,
    InvalidArgumentError,
    KVCacheEvent,
    KVCacheManager,
    Request,
)
from pagedkv.checks import check_whole
from pagedkv.sim import StepTimeModel

__all__ = ["EngineConfig", "ReplicaEngine", "Tracked"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """One replica: ``num_blocks`` blocks of ``block_size`` tokens (one full-attention
    group), ``token_budget`` tokens per step, ``max_running`` sequences, step times, and
    about ``num_usage_samples`` KV-usage samples over the arrivals' span."""

    num_blocks: int
    block_size: int = 16
    max_model_len: int = 1 << 20
    token_budget: int = 8192
    max_running: int = 256
    step_time: StepTimeModel = field(default_factory=StepTimeModel)
    num_usage_samples: int = 400

    def __post_init__(self) -> None:
        check_whole("EngineConfig.num_blocks", self.num_blocks, minimum=2)
        for name in ("block_size", "max_model_len", "token_budget", "max_running",
                     "num_usage_samples"):
            check_whole(f"EngineConfig.{name}", getattr(self, name), minimum=1)
        if not isinstance(self.step_time, StepTimeModel):
            raise InvalidArgumentError(
                f"EngineConfig.step_time must be a StepTimeModel, got {self.step_time!r}")


class Tracked:
    """A request inside a replica, with what the report needs."""

    __slots__ = (
        "arrival_s", "computed", "finish_s", "first_scheduled_s", "first_token_s",
        "generated", "hit_tokens", "index", "looked_up", "req", "target",
    )

    def __init__(self, index: int, req: Request, arrival_s: float, num_output: int) -> None:
        self.index = index
        self.req = req
        self.arrival_s = arrival_s
        self.target = max(1, num_output)
        self.generated = 0
        self.computed = 0
        self.hit_tokens = 0
        self.looked_up = False
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None


class ReplicaEngine:
    """A manager and a scheduler queue; :meth:`step` runs one step at a given time."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        spec = FullAttentionSpec(block_size=config.block_size, num_kv_heads=8, head_size=128,
                                 dtype_bytes=2)
        self.manager = KVCacheManager.from_spec(
            spec, num_blocks=config.num_blocks, max_model_len=config.max_model_len,
            enable_events=True,
        )
        self.waiting: deque[Tracked] = deque()
        self.running: list[Tracked] = []
        self.finished: list[Tracked] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self.busy_s = 0.0
        self.usage_samples: list[float] = []
        self.sample_every_s = 1.0
        self._next_sample_s = 0.0
        self.prefill_tokens = 0

    def sample_usage(self, now_s: float, *, force: bool = False) -> None:
        """Record the KV usage at ``now_s`` (a step's end) if a sample is due (or
        ``force``: the idle state before a gap)."""
        if now_s < self._next_sample_s and not force:
            return
        self._next_sample_s = now_s + self.sample_every_s
        self.usage_samples.append(self.manager.usage)

    @property
    def mean_usage(self) -> float:
        """Mean of the usage samples (0.0 before any)."""
        samples = self.usage_samples
        return sum(samples) / len(samples) if samples else 0.0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens admitted or waiting but not computed yet (the router's load)."""
        pending = sum(t.req.num_prompt_tokens - t.hit_tokens for t in self.waiting)
        for t in self.running:
            left = t.req.num_prompt_tokens - t.computed
            if left > 0:
                pending += left
        return pending

    def submit(self, tracked: Tracked) -> None:
        self.waiting.append(tracked)

    def take_events(self) -> list[KVCacheEvent]:
        return self.manager.take_events()

    def step(self, now_s: float, horizon_s: float = float("inf")) -> float:
        """Run one step starting at ``now_s``, or several identical decode-only steps that
        all end by ``horizon_s`` (nothing can arrive before it); returns the duration."""
        if not self.waiting and self.running:
            quiet = self._quiet_decode_steps()
            if quiet:
                step_s = self.config.step_time.step_time_s(0, len(self.running))
                room = (horizon_s - now_s) / step_s if step_s > 0 else quiet
                k = int(min(quiet, room))
                if k >= 1:
                    self._fast_forward(k, step_s)
                    end_s = now_s
                    for _ in range(k):  # the step ends one by one, as a single engine's
                        end_s += step_s
                        self.sample_usage(end_s)
                    return end_s - now_s
        cfg = self.config
        mgr = self.manager
        bs = cfg.block_size
        budget = cfg.token_budget
        scheduled: list[tuple[Tracked, int]] = []
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            t = running[i]
            req = t.req
            n = min(req.num_tokens - t.computed, budget)
            pos = t.computed
            decode_skip = n == 1 and pos >= req.num_prompt_tokens and pos % bs and (pos + 1) % bs
            while not decode_skip and mgr.allocate_slots(req, n) is None:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is t:
                    break
            else:
                scheduled.append((t, n))
                budget -= n
                i += 1
        # A running request's step is a decode when it computes its one sampled token;
        # everything else (prompt chunks, a preempted request's recompute, admissions) is
        # prefill, token by token: the single engine's accounting.
        num_decode = sum(1 for t, _ in scheduled
                         if t.req.num_tokens - t.computed == 1 and t.generated > 0)
        if not preempted:
            self._admit(now_s, budget, scheduled)
        num_prefill = sum(n for _, n in scheduled) - num_decode
        duration = cfg.step_time.step_time_s(num_prefill, num_decode)
        self._advance(now_s + duration, scheduled)
        self.num_steps += 1
        self.busy_s += duration
        self.sample_usage(now_s + duration)
        self.prefill_tokens += num_prefill
        return duration

    def _quiet_decode_steps(self) -> int:
        """How many decode steps in a row need no manager call and finish nobody (0 when
        a request is still in prefill)."""
        bs = self.config.block_size
        quiet = 1 << 30
        for t in self.running:
            req = t.req
            pos = t.computed
            if req.num_tokens - pos != 1 or pos < req.num_prompt_tokens:
                return 0
            offset = pos % bs
            if offset == 0:
                return 0
            quiet = min(quiet, bs - 1 - offset, t.target - t.generated - 1)
            if quiet <= 0:
                return 0
        return quiet

    def _fast_forward(self, k: int, step_s: float) -> None:
        """``k`` quiet decode steps at once: tokens appended, no manager call."""
        for t in self.running:
            t.req.append_output_tokens([t.index + 1] * k)
            t.computed += k
            t.generated += k
            t.req.num_computed_tokens = t.computed
        self.num_steps += k
        self.busy_s += k * step_s

    def _admit(self, now_s: float, budget: int, scheduled: list[tuple[Tracked, int]]) -> None:
        mgr = self.manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running:
            t = self.waiting[0]
            req = t.req
            hit = mgr.get_computed_blocks(req)
            n = min(req.num_tokens - hit.num_computed_tokens, budget)
            if mgr.allocate_slots(req, n, new_computed_blocks=hit) is None:
                break
            self.waiting.popleft()
            if not t.looked_up:
                t.looked_up = True
                t.hit_tokens = hit.num_computed_tokens
            if t.first_scheduled_s is None:
                t.first_scheduled_s = now_s
            t.computed = hit.num_computed_tokens
            req.num_computed_tokens = t.computed
            self.running.append(t)
            scheduled.append((t, n))
            budget -= n

    def _advance(self, end_s: float, scheduled: list[tuple[Tracked, int]]) -> None:
        mgr = self.manager
        for t, n in scheduled:
            req = t.req
            t.computed += n
            req.num_computed_tokens = t.computed
            if t.computed < req.num_tokens:
                continue
            t.generated += 1
            if t.first_token_s is None:
                t.first_token_s = end_s
            if t.generated >= t.target:
                t.finish_s = end_s
                mgr.free(req)
                self.running.remove(t)
                self.finished.append(t)
            else:
                req.append_output_tokens([t.index + 1])

    def _preempt(self, t: Tracked) -> None:
        self.manager.free(t.req)
        t.computed = 0
        t.req.num_computed_tokens = 0
        t.req.num_preemptions += 1
        self.waiting.appendleft(t)
        self.num_preemptions += 1
