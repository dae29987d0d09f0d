"""The simulated engine with a host-memory tier: :class:`HostEngineSimulator` executes the
tier's load and store plans in simulated time (the model: :mod:`pagedkv.sim.host_tier`).

Per step, on top of :class:`~pagedkv.sim.engine.EngineSimulator`:

* **admission**: the lookup runs across tiers; when the hit reaches into host memory the
  load policy decides whether to load it (the allocation adopts the whole hit and the
  manager queues a load plan) or to recompute it (the allocation adopts the device part
  only);
* **duration**: ``compute + max(loads, eviction stores)`` (the forward pass waits for its
  blocks to arrive and for evicted blocks to be copied out; the two directions of the link
  run in parallel), then write-through stores of the step's blocks overlap the step and
  lengthen it only when they take longer than it;
* **completion**: at the end of the step every plan it made is confirmed
  (``complete_store``, ``complete_load``), so loaded blocks are registered before any
  later step looks them up.

A request's split of hit tokens (device / host / declined) counts its first lookup only,
like the report's hit rate; transfers count every lookup (re-lookups after a preemption
load too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pagedkv import KVCacheManager
from pagedkv.core.coordinator import ComputedBlocks
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.config import KVEventsConfig
from pagedkv.host import (
    BEFORE_FORWARD,
    HostTierComponent,
    HostTierConfig,
    LoadPlan,
    StoreOnEviction,
    TieredHit,
    WriteThrough,
)
from pagedkv.sim.engine import EngineSimulator
from pagedkv.sim.host_tier import (
    CostBasedLoad,
    HostMemoryConfig,
    HostRunStats,
    LoadPolicy,
    TransferCost,
)
from pagedkv.sim.scheduler import LiveRequest, ManagerFactory, SchedulerConfig, build_manager
from pagedkv.sim.workloads import Workload

__all__ = ["HostEngineSimulator", "host_manager_factory"]


def host_manager_factory(inner: ManagerFactory, num_host_blocks: int,
                         write_policy: str = "on-eviction") -> ManagerFactory:
    """A factory building what ``inner`` builds, as a host-tiered manager with
    ``num_host_blocks`` host blocks (the same groups, pool size and settings) storing
    blocks per ``write_policy`` (``"on-eviction"`` or ``"write-through"``)."""
    policy = WriteThrough() if write_policy == "write-through" else StoreOnEviction()

    def factory(workload: Workload, *, block_size: int, num_blocks: int,
                kv_events: KVEventsConfig | None = None) -> KVCacheManager:
        # the plain manager only gives its config (built without events: no socket)
        config = inner(workload, block_size=block_size, num_blocks=num_blocks).config
        host = HostTierConfig(num_blocks=num_host_blocks, write_policy=policy)
        return KVCacheManager(replace(config, kv_events=kv_events, host_tier=host))

    return factory


class HostEngineSimulator(EngineSimulator):
    """An engine replica whose manager has a host tier of ``host.memory_bytes`` (blocks
    of ``block_bytes``); ``policy`` decides load versus recompute (default: the cheaper);
    ``wrap`` wraps the manager factory (an observer's). Other arguments as
    :class:`EngineSimulator`. ``host_stats`` holds the tier's figures.

    Raises:
        InvalidArgumentError: host memory smaller than one block.
    """

    def __init__(
        self,
        workload: Workload,
        *,
        block_size: int,
        num_blocks: int,
        host: HostMemoryConfig,
        block_bytes: int,
        config: SchedulerConfig | None = None,
        manager_factory: ManagerFactory | None = None,
        policy: LoadPolicy | None = None,
        wrap: Callable[[ManagerFactory], ManagerFactory] | None = None,
    ) -> None:
        num_host = host.num_blocks(block_bytes)
        if num_host < 1:
            raise InvalidArgumentError(
                f"--host-memory {host.memory_bytes:,} bytes holds no block of "
                f"{block_bytes:,} bytes; give at least that")
        factory = host_manager_factory(manager_factory or build_manager, num_host,
                                       host.write_policy)
        super().__init__(
            workload, block_size=block_size, num_blocks=num_blocks, config=config,
            manager_factory=wrap(factory) if wrap is not None else factory)
        self.cost = TransferCost(block_bytes=block_bytes, bandwidth_gbps=host.bandwidth_gbps)
        self.policy: LoadPolicy = policy or CostBasedLoad()
        self.host_stats = HostRunStats(
            memory_bytes=host.memory_bytes, block_bytes=block_bytes, num_blocks=num_host,
            bandwidth_gbps=host.bandwidth_gbps)
        self.tiered = self.manager.component(HostTierComponent)
        self._prefill_token_s = self.config.step_time.prefill_token_s
        self._step_loads: list[LoadPlan] = []

    def _lookup_and_allocate(self, live: LiveRequest, budget: int) -> int | None:
        mgr = self.tiered
        req = live.req
        hit = mgr.lookup(req)  # the host component's lookup (device, then host)
        host_tokens = hit.num_host_tokens
        use: TieredHit | ComputedBlocks = hit
        if host_tokens:
            host_blocks = sum(len(ids) for ids in hit.host.host_block_ids)
            if not self.policy.worth_loading(
                    num_tokens=host_tokens, num_blocks=host_blocks, cost=self.cost,
                    prefill_token_s=self._prefill_token_s):
                use = hit.device
        num_hit = use.num_computed_tokens
        todo = req.num_tokens - num_hit
        num_new = todo if todo < budget else budget
        if self.manager.allocate_slots(req, num_new, new_computed_blocks=use) is None:
            return None
        self._step_loads.extend(mgr.take_load_plans())
        if not req.num_preemptions:
            st = self.host_stats
            st.device_hit_tokens += hit.num_device_tokens
            if use is hit:
                st.host_hit_tokens += host_tokens
            else:
                st.declined_host_tokens += host_tokens
        return num_hit

    def _step_duration_s(self, num_prefill_tokens: int, num_decode_seqs: int) -> float:
        compute_s = super()._step_duration_s(num_prefill_tokens, num_decode_seqs)
        mgr = self.tiered
        st = self.host_stats
        loads = self._step_loads
        self._step_loads = []
        stores = mgr.take_store_plans()
        load_blocks = sum(p.num_blocks for p in loads)
        before = sum(p.num_blocks for p in stores if p.timing == BEFORE_FORWARD)
        after = sum(p.num_blocks for p in stores) - before
        load_s = self.cost.seconds(load_blocks)
        before_s = self.cost.seconds(before)
        stall_s = before_s - load_s if before_s > load_s else 0.0
        step_s = compute_s + load_s + stall_s
        after_s = self.cost.seconds(after)
        if after_s > step_s:
            stall_s += after_s - step_s
            step_s = after_s
        st.loads += len(loads)
        st.loaded_blocks += load_blocks
        st.stored_blocks += before + after
        st.load_s += load_s
        st.store_stall_s += stall_s
        for store in stores:
            mgr.complete_store(store, True)
        for load in loads:
            mgr.complete_load(load, True)
        return step_s
