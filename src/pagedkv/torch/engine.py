"""A small continuous-batching engine over :class:`~pagedkv.KVCacheManager` and the tiny
decoder: chunked prefill, decode, prefix hits, preemption with recompute, eviction and
reuse of blocks, and any physical placement of blocks.

One :meth:`Engine.step`:

1. running requests, oldest first, each get their remaining prompt (or one decode token),
   capped by the step's token budget; when ``allocate_slots`` says no, the newest running
   request is preempted (its blocks freed, its progress forgotten, it goes back to the
   front of the queue) and the allocation is retried;
2. waiting requests are admitted while budget and blocks last, starting from their
   longest cached prefix (``get_computed_blocks``);
3. tables for the batch are built (:func:`~pagedkv.torch.tables.build_batch_tables`),
   fresh blocks are optionally poisoned, the model runs, and every request whose step
   reached its last token samples greedily. Logits of every sampled position are kept,
   keyed by ``(request_id, position)``, so two runs can be compared position by position.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pagedkv import KVCacheManager, Request
from pagedkv.errors import InvalidArgumentError
from pagedkv.torch._deps import torch
from pagedkv.torch.model import TinyDecoder
from pagedkv.torch.tables import Placement, build_batch_tables
from pagedkv.torch.tensors import KVCacheTensors

__all__ = ["Engine", "EngineStats"]


@dataclass(slots=True, kw_only=True)
class EngineStats:
    """Counters of one engine run."""

    steps: int = 0
    computed_tokens: int = 0
    hit_tokens: int = 0
    preemptions: int = 0
    forced_preemptions: int = 0
    poisoned_blocks: int = 0
    max_batch_requests: int = 0


@dataclass(slots=True, eq=False)
class _Entry:
    request: Request
    max_new_tokens: int


class Engine:
    """Drives ``manager`` and ``model`` over a set of requests (see module docstring).

    ``poison_value``: when set, every block the manager hands out fresh is overwritten with
    it (e.g. NaN) before the step writes it, so stale data can never be read unnoticed.
    ``check``: run ``check_invariants()`` of the manager, the tensors and the engine after
    every step. ``preempt_every_steps``: also preempt the newest running request (when
    more than one runs) before every that-many-th step, as a scheduler does for priority,
    so preemption and recompute happen whatever the pool size.
    """

    def __init__(
        self,
        manager: KVCacheManager,
        model: TinyDecoder,
        cache: KVCacheTensors,
        *,
        max_num_batched_tokens: int,
        max_num_running: int,
        placement: Placement | None = None,
        poison_value: float | None = None,
        check: bool = True,
        preempt_every_steps: int | None = None,
    ) -> None:
        if max_num_batched_tokens < 1 or max_num_running < 1:
            raise InvalidArgumentError("max_num_batched_tokens and max_num_running must be >= 1")
        self.manager, self.model, self.cache = manager, model, cache
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_running = max_num_running
        self.placement = placement or Placement()
        self.poison_value = poison_value
        self.check = check
        self.preempt_every_steps = preempt_every_steps
        specs = [g.spec for g in cache.plan.groups]
        self.block_sizes = [s.block_size for s in specs]
        self.slot_groups = [s.bytes_per_token > 0 for s in specs]
        max_len = model.cfg.max_model_len
        self.num_table_blocks = [-(-max_len // bs) for bs in self.block_sizes]
        self.waiting: deque[_Entry] = deque()
        self.running: list[_Entry] = []
        self.finished: dict[str, list[int]] = {}
        self.logits: dict[tuple[str, int], torch.Tensor] = {}
        self.stats = EngineStats()

    def add_request(self, request_id: str, prompt: Sequence[int], max_new_tokens: int) -> None:
        """Queue a request.

        Raises:
            InvalidArgumentError: empty prompt, ``max_new_tokens`` < 1, a request longer
                than ``max_model_len``, or an id already queued or running.
        """
        if any(e.request.request_id == request_id for e in (*self.waiting, *self.running)):
            raise InvalidArgumentError(f"request id {request_id!r} is already in the engine")
        if max_new_tokens < 1:
            raise InvalidArgumentError(f"{request_id}: max_new_tokens must be >= 1")
        if len(prompt) + max_new_tokens > self.model.cfg.max_model_len:
            raise InvalidArgumentError(
                f"{request_id}: {len(prompt)} + {max_new_tokens} tokens exceed max_model_len "
                f"{self.model.cfg.max_model_len}")
        self.waiting.append(_Entry(self.manager.new_request(request_id, prompt), max_new_tokens))

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def run(self, max_steps: int = 100_000) -> None:
        """Step until every request finished.

        Raises:
            InvalidArgumentError: ``max_steps`` passed without finishing (a request that can
                never fit the pool).
        """
        for _ in range(max_steps):
            if not self.has_work:
                return
            self.step()
        raise InvalidArgumentError(f"not finished after {max_steps} steps; is the pool too small?")

    # ------------------------------------------------------------------ scheduling

    def _preempt(self, entry: _Entry) -> None:
        self.running.remove(entry)
        self.manager.free(entry.request)
        entry.request.num_computed_tokens = 0
        entry.request.num_preemptions += 1
        self.waiting.appendleft(entry)
        self.stats.preemptions += 1

    def _schedule(self) -> list[tuple[_Entry, int, list[int]]]:
        budget = self.max_num_batched_tokens
        batch: list[tuple[_Entry, int, list[int]]] = []  # (entry, new tokens, fresh blocks)
        for entry in list(self.running):
            if budget == 0:
                break
            if entry not in self.running:  # preempted while making room for an older one
                continue
            req = entry.request
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            while True:
                new = self.manager.allocate_slots(req, num_new)
                if new is not None:
                    batch.append((entry, num_new, [b for g in new for b in g]))
                    budget -= num_new
                    break
                victim = self.running[-1]
                self._preempt(victim)
                if victim is entry:
                    break
        while self.waiting and budget and len(self.running) < self.max_num_running:
            entry = self.waiting[0]
            req = entry.request
            hit = self._lookup(req)
            num_new = min(req.num_tokens - hit.num_computed_tokens, budget)
            new = self.manager.allocate_slots(req, num_new, new_computed_blocks=hit)
            if new is None:
                break
            self.waiting.popleft()
            req.num_computed_tokens = hit.num_computed_tokens
            self.stats.hit_tokens += hit.num_computed_tokens
            self.running.append(entry)
            batch.append((entry, num_new, [b for g in new for b in g]))
            budget -= num_new
        return batch

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        """Schedule, build tables, run the model, sample, free finished requests."""
        every = self.preempt_every_steps
        if every and self.stats.steps % every == every - 1 and len(self.running) > 1:
            self._preempt(self.running[-1])
            self.stats.forced_preemptions += 1
        batch = self._schedule()
        if not batch:
            if self.waiting and not self.running:
                raise InvalidArgumentError(
                    f"request {self.waiting[0].request.request_id!r} cannot fit an empty pool")
            return
        device = self.cache.device
        requests = [e.request for e, _, _ in batch]
        num_new = [n for _, n, _ in batch]
        computed = [r.num_computed_tokens for r in requests]
        tables = build_batch_tables(
            [self.manager.get_block_ids(r.request_id) for r in requests], computed, num_new,
            block_sizes=self.block_sizes, num_table_blocks=self.num_table_blocks,
            token_slot_groups=self.slot_groups, placement=self.placement, device=device)
        fresh = [b for _, _, blocks in batch for b in blocks]
        self._copy_out_before_forward()
        if self.poison_value is not None and fresh:
            physical = self.placement.physical(torch.tensor(fresh, dtype=torch.long))
            self.cache.fill_blocks(physical.to(device), self.poison_value)
            self.stats.poisoned_blocks += len(fresh)
        self._copy_in_before_forward()
        token_ids = torch.tensor(
            [t for r, c, n in zip(requests, computed, num_new, strict=True)
             for t in r.all_token_ids[c:c + n]], dtype=torch.long, device=device)
        ends = tables.query_start_loc[1:].tolist()
        sampling = [i for i, (r, c, n) in enumerate(zip(requests, computed, num_new,
                                                          strict=True))
                    if c + n == r.num_tokens]
        rows = torch.tensor([ends[i] - 1 for i in sampling], dtype=torch.long, device=device)
        logits = self.model.forward(token_ids, tables, rows)
        self._copy_out_after_forward()
        self.stats.steps += 1
        self.stats.computed_tokens += sum(num_new)
        self.stats.max_batch_requests = max(self.stats.max_batch_requests, len(batch))
        for req, n in zip(requests, num_new, strict=True):
            req.num_computed_tokens += n
        for row, i in enumerate(sampling):
            self._sample(batch[i][0], logits[row])
        if self.check:
            self.check_invariants()

    # ------------------------------------------------------------------ tier hooks

    def _lookup(self, request: Request) -> Any:
        """The admission lookup (a subclass may look past the device, e.g. a host tier:
        :mod:`pagedkv.torch.host_tier`)."""
        return self.manager.get_computed_blocks(request)

    def _copy_out_before_forward(self) -> None:
        """Hook: copies out of blocks this step's allocations took over, before fresh
        blocks are poisoned or written."""

    def _copy_in_before_forward(self) -> None:
        """Hook: copies into this step's fresh blocks (after poisoning, before the
        forward pass)."""

    def _copy_out_after_forward(self) -> None:
        """Hook: copies out of blocks the forward pass just wrote."""

    def _sample(self, entry: _Entry, logits: torch.Tensor) -> None:
        req = entry.request
        self.logits[(req.request_id, req.num_tokens - 1)] = logits.detach().cpu().clone()
        token = int(torch.argmax(logits))
        req.append_output_tokens(token)
        if req.num_output_tokens >= entry.max_new_tokens:
            self.running.remove(entry)
            self.manager.free(req)
            self.finished[req.request_id] = list(req.all_token_ids[req.num_prompt_tokens:])

    def check_invariants(self) -> None:
        """Manager, tensors, and that running requests are exactly the manager's requests
        with their tokens in order. O(num_blocks + requests)."""
        self.manager.check_invariants()
        self.cache.check_invariants()
        for entry in self.running:
            req = entry.request
            assert self.manager.has_request(req.request_id), f"{req.request_id} not held"
            assert req.num_computed_tokens <= req.num_tokens
        for entry in self.waiting:
            assert not self.manager.has_request(entry.request.request_id)
