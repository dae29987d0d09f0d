"""Executing the host tier's load and store plans with real tensors.

:class:`HostKVTensors` is the host tier's memory: one ``[host_blocks, page_numel]`` tensor
per KV-cache tensor of the plan (pinned when the device cache is on a GPU, so loads can
run asynchronously), the twin of :class:`~pagedkv.torch.tensors.KVCacheTensors`. A block id
names one page in every tensor, whatever its group, so a copy moves whole pages of every
tensor:

* a **store** (device -> host) is ``host.index_copy_(0, host_ids,
  device.index_select(0, physical(device_ids)))``;
* a **load** (host -> device) is ``device.index_copy_(0, physical(device_ids),
  host.index_select(0, host_ids))``.

``physical`` is the engine's :class:`~pagedkv.torch.tables.Placement` (manager ids ->
pages). :class:`HostTierEngine` (an :class:`~pagedkv.torch.engine.Engine` over a
:class:`~pagedkv.host.HostTierComponent`) runs one step in the order the plans
require:

1. schedule (``lookup`` across tiers, ``allocate_slots``: evictions make store plans, host
   hits make load plans);
2. eviction stores (``before_forward``): copy out the device blocks just handed to another
   request before anything writes them, ``complete_store``;
3. the engine NaN-poisons the step's fresh blocks (loaded ones included);
4. loads: copy into their fresh device blocks, ``complete_load`` (registers them);
5. the forward pass;
6. write-through stores (``after_forward``) of blocks the step computed.

Worked case (identity placement): a store plan ``device 1 -> host 2`` copies page 1 of
every device tensor into row 2 of the matching host tensor; a later load plan ``host 2 ->
device 4`` copies it back to page 4, and a request adopting those tokens reads exactly
the K/V that was computed for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pagedkv import CacheConfig, KVCacheManager, Request
from pagedkv.errors import InvalidArgumentError
from pagedkv.host import (
    BEFORE_FORWARD,
    HostTierComponent,
    HostTierConfig,
    HostTieredKVCacheManager,
    StoreOnEviction,
    WriteThrough,
)
from pagedkv.torch._deps import torch
from pagedkv.torch.check import _MODEL as MODEL
from pagedkv.torch.check import (
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_RUNNING,
    PREEMPT_EVERY_STEPS,
    Layout,
    RunResult,
    workload,
)
from pagedkv.torch.engine import Engine
from pagedkv.torch.model import TinyDecoder
from pagedkv.torch.tables import Placement
from pagedkv.torch.tensors import KVCacheTensors

__all__ = [
    "HostKVTensors",
    "HostRunResult",
    "HostTierEngine",
    "TransferStats",
    "run_layout_with_host",
]


class _GroupCopies(Protocol):
    @property
    def host_block_ids(self) -> tuple[int, ...]: ...

    @property
    def device_block_ids(self) -> tuple[int, ...]: ...


class _Plan(Protocol):
    @property
    def groups(self) -> Sequence[_GroupCopies]: ...


class HostKVTensors:
    """Host memory for ``num_blocks`` host blocks of ``device``'s layout: one tensor per
    planned tensor, ``[num_blocks, page_numel]`` of the device cache's dtype, on the CPU.
    ``pin``: page-locked memory (default: when the device cache is on a CUDA device).

    Raises:
        InvalidArgumentError: ``num_blocks`` < 1.
    """

    def __init__(self, device: KVCacheTensors, num_blocks: int, *,
                 pin: bool | None = None, fill: float | None = None) -> None:
        if type(num_blocks) is not int or num_blocks < 1:
            raise InvalidArgumentError(f"host tensors need >= 1 block, got {num_blocks!r}")
        self.device_cache = device
        self.num_blocks = num_blocks
        self.pinned = device.device.type == "cuda" if pin is None else pin
        self.pages: tuple[torch.Tensor, ...] = tuple(
            torch.empty((num_blocks, device.page_numel), dtype=device.dtype,
                        pin_memory=self.pinned)
            for _ in device.pages
        )
        if fill is not None:
            for p in self.pages:
                p.fill_(fill)

    @property
    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.pages)

    def store(self, device_pages: torch.Tensor, host_ids: torch.Tensor) -> None:
        """Copy device pages ``device_pages`` (physical ids) into host rows ``host_ids``."""
        for dev, host in zip(self.device_cache.pages, self.pages, strict=True):
            rows = dev.index_select(0, device_pages.to(dev.device))
            host.index_copy_(0, host_ids, rows.to("cpu"))  # synchronous: done on return

    def load(self, host_ids: torch.Tensor, device_pages: torch.Tensor) -> None:
        """Copy host rows ``host_ids`` into device pages ``device_pages`` (physical ids).
        With pinned memory the rows are gathered into a pinned buffer and copied
        asynchronously: synchronize the device before reading them."""
        for dev, host in zip(self.device_cache.pages, self.pages, strict=True):
            rows = host.index_select(0, host_ids)
            if self.pinned:
                rows = rows.pin_memory()
            dev.index_copy_(0, device_pages.to(dev.device),
                            rows.to(dev.device, non_blocking=self.pinned))

    def check_invariants(self) -> None:
        """One host tensor per device tensor, same dtype and page width, on the CPU."""
        assert len(self.pages) == len(self.device_cache.pages)
        for p in self.pages:
            assert p.shape == (self.num_blocks, self.device_cache.page_numel)
            assert p.dtype == self.device_cache.dtype and p.device.type == "cpu"


@dataclass(slots=True, kw_only=True)
class TransferStats:
    """Copies executed (blocks, all groups) and plans confirmed."""

    loads: int = 0
    loaded_blocks: int = 0
    stores: int = 0
    stored_blocks: int = 0


class HostTierEngine(Engine):
    """:class:`~pagedkv.torch.engine.Engine` over a host-tiered manager
    (a manager with a ``host_tier`` component) that executes its plans on ``host``
    tensors in the order of the module docstring; other arguments as ``Engine``.
    ``transfers`` counts what was copied.
    """

    def __init__(self, manager: KVCacheManager, model: TinyDecoder,
                 cache: KVCacheTensors, host: HostKVTensors, **kwargs: Any) -> None:
        super().__init__(manager, model, cache, **kwargs)
        self.tiered = manager.component(HostTierComponent)
        self.host = host
        self.transfers = TransferStats()
        self._after: list[Any] = []

    def _lookup(self, request: Request) -> Any:
        return self.tiered.lookup(request)

    def _ids(self, plan: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
        host_ids = [b for g in plan.groups for b in g.host_block_ids]
        dev_ids = [b for g in plan.groups for b in g.device_block_ids]
        pages = self.placement.physical(torch.tensor(dev_ids, dtype=torch.long))
        return torch.tensor(host_ids, dtype=torch.long), pages

    def _store(self, plan: Any) -> None:
        host_ids, pages = self._ids(plan)
        self.host.store(pages, host_ids)
        self.tiered.complete_store(plan, True)
        self.transfers.stores += 1
        self.transfers.stored_blocks += int(host_ids.numel())

    def _copy_out_before_forward(self) -> None:
        """Eviction stores now; write-through stores wait for the forward pass."""
        for plan in self.tiered.take_store_plans():
            if plan.timing == BEFORE_FORWARD:
                self._store(plan)
            else:
                self._after.append(plan)

    def _copy_in_before_forward(self) -> None:
        """Every load planned this step, then ``complete_load`` (registers its blocks)."""
        mgr = self.tiered
        for plan in mgr.take_load_plans():
            host_ids, pages = self._ids(plan)
            self.host.load(host_ids, pages)
            mgr.complete_load(plan, True)
            self.transfers.loads += 1
            self.transfers.loaded_blocks += int(host_ids.numel())
        if self.host.pinned and self.cache.device.type == "cuda":
            torch.cuda.synchronize(self.cache.device)

    def _copy_out_after_forward(self) -> None:
        mgr = self.tiered
        for plan in mgr.take_store_plans():
            assert plan.timing != BEFORE_FORWARD, "an eviction store made after scheduling"
            self._after.append(plan)
        for plan in self._after:
            self._store(plan)
        self._after = []

    def check_invariants(self) -> None:
        super().check_invariants()
        self.host.check_invariants()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class HostRunResult:
    """A host-tier run of a check layout: the run (comparable with
    :func:`~pagedkv.torch.check.compare_runs`), the copies executed, and the host tier's
    own counters (``make_host_stats``)."""

    run: RunResult
    transfers: TransferStats
    host_hit_tokens: int


def run_layout_with_host(
    layout: Layout,
    *,
    num_host_blocks: int,
    device: torch.device | str = "cpu",
    placement: Callable[[int], Placement] | None = None,
    write_through: bool = False,
    requests: Sequence[tuple[str, list[int], int]] | None = None,
) -> HostRunResult:
    """:func:`~pagedkv.torch.check.run_layout` with prefix caching **and** a host tier of
    ``num_host_blocks`` blocks (host tensors NaN-filled, device fresh blocks NaN-poisoned,
    so a wrong copy or a read before a load shows up in the logits).

    Raises:
        ConfigError: a layout the host tier does not support (see
            :mod:`pagedkv.host.manager`).
    """
    plan = layout.plan()
    nan = float("nan")
    cache = KVCacheTensors(plan, dtype=torch.float32, device=device, fill=nan)
    null_before = cache.block_bytes(0)
    policy = WriteThrough() if write_through else StoreOnEviction()
    manager = HostTieredKVCacheManager(
        CacheConfig(groups=tuple(g.spec for g in plan.groups), num_blocks=plan.num_blocks,
                    max_model_len=MODEL.max_model_len),
        HostTierConfig(num_blocks=num_host_blocks, write_policy=policy))
    host = HostKVTensors(cache, num_host_blocks, fill=nan)
    model = TinyDecoder(MODEL, cache, [name for name, _ in layout.layers])
    engine = HostTierEngine(
        manager, model, cache, host, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_num_running=MAX_NUM_RUNNING,
        placement=placement(plan.num_blocks) if placement else None, poison_value=nan,
        preempt_every_steps=PREEMPT_EVERY_STEPS)
    for rid, prompt, max_new in requests if requests is not None else workload():
        engine.add_request(rid, prompt, max_new)
    engine.run()
    run = RunResult(logits=engine.logits, outputs=engine.finished, stats=engine.stats,
                    num_evicted_blocks=manager.num_evicted_blocks,
                    null_block_untouched=cache.block_bytes(0) == null_before)
    return HostRunResult(run=run, transfers=engine.transfers,
                         host_hit_tokens=manager.host.make_host_stats().host_hit_tokens)
