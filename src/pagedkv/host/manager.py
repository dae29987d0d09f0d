"""The manager with a host tier: :class:`HostTieredKVCacheManager`, a
:class:`~pagedkv.KVCacheManager` whose lookups continue into host memory.

A class, not a flag: :func:`make_manager` without a host tier builds the plain manager,
which pays nothing. With one, device block ids, hits, evictions and device events are
those of the plain manager for the same calls, except where a host load adds tokens.

One scheduler step with the host tier::

    hit = mgr.lookup(req)                          # device prefix, then host continuation
    new = mgr.allocate_slots(req, n, new_computed_blocks=hit)   # None: no room
    stores = mgr.take_store_plans()                # copies device -> host
    loads = mgr.take_load_plans()                  # copies host -> device
    # engine: run BEFORE_FORWARD stores, then loads, then the forward pass, then the
    # AFTER_FORWARD stores; confirm each plan:
    mgr.complete_store(plan, success); mgr.complete_load(plan, success)

**Contract with the engine.** (1) An eviction store (``before_forward``) reads a device
block that was just handed to another request: the engine executes every store plan of a
step before anything writes into that step's blocks (loads included). (2) A request with a
load in flight is neither allocated nor freed until ``complete_load`` (both raise
:class:`~pagedkv.errors.InvalidArgumentError`). (3) After ``complete_load(plan, False)``
the request's tokens past ``plan.num_device_tokens`` are not computed: the engine
recomputes them (its blocks are there, unregistered) or frees the request. (4) A
write-through (``after_forward``) store runs before its block's request is freed.

Supported layouts: every group full attention (MLA, sinks included) with the group block
size equal to the hash block size; caching on; no retention; no ``drop_last_hit``.
Others raise :class:`~pagedkv.errors.ConfigError` naming the group (sliding-window and
Mamba groups would need their own host hit rules: not built yet).
"""

from __future__ import annotations

from typing import Any

from pagedkv.config import CacheConfig
from pagedkv.coordinator import ComputedBlocks
from pagedkv.errors import ConfigError, InvalidArgumentError, InvalidHitError
from pagedkv.events.recorder import EventRecorder, GroupInfo
from pagedkv.events.records import BlockStored, KVCacheEvent
from pagedkv.host.config import HostTierConfig
from pagedkv.host.device import EvictionReportingPool, HostFeedingRecorder
from pagedkv.host.plans import LoadPlan, StorePlan, TieredHit
from pagedkv.host.policy import WriteThrough
from pagedkv.host.tier import HostTier, HostTierStats
from pagedkv.manager import KVCacheManager
from pagedkv.pool import BlockPool
from pagedkv.request import RequestLike
from pagedkv.specs import FullAttentionSpec

__all__ = ["HostTieredKVCacheManager", "make_manager"]


def make_manager(config: CacheConfig, host: HostTierConfig | None = None) -> KVCacheManager:
    """The plain :class:`~pagedkv.KVCacheManager` when ``host`` is ``None``, else a
    :class:`HostTieredKVCacheManager` with that host tier.

    Raises:
        ConfigError: a layout the host tier does not support (see the module docstring).
    """
    if host is None:
        return KVCacheManager(config)
    return HostTieredKVCacheManager(config, host)


def _check_supported(config: CacheConfig) -> None:
    hbs = config.hash_block_size or min(s.block_size for s in config.groups)
    for g, spec in enumerate(config.groups):
        if not isinstance(spec, FullAttentionSpec):
            raise ConfigError(
                f"the host tier supports full-attention groups (MLA and sinks included) "
                f"only; group {g} is {type(spec).__name__}: run this model without a host "
                "tier (sliding-window and Mamba host hit rules are not built yet)"
            )
        if spec.block_size != hbs:
            raise ConfigError(
                f"the host tier needs every group's block size equal to the hash block size; "
                f"group {g} has block size {spec.block_size}, hashes are at {hbs}: leave "
                "CacheConfig.hash_block_size unset"
            )
    if len({s.block_size for s in config.groups}) != 1:
        raise ConfigError("the host tier needs one block size for every group")
    if not config.enable_caching:
        raise ConfigError("a host tier needs prefix caching on (CacheConfig.enable_caching)")
    if config.retention is not None:
        raise ConfigError("a host tier cannot be combined with CacheConfig.retention yet")
    if config.drop_last_hit:
        raise ConfigError("a host tier cannot be combined with CacheConfig.drop_last_hit yet")


class HostTieredKVCacheManager(KVCacheManager):
    """A :class:`~pagedkv.KVCacheManager` with a host-memory tier (module docstring).

    >>> from pagedkv import FullAttentionSpec
    >>> from pagedkv.host import HostTierConfig
    >>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    >>> mgr = HostTieredKVCacheManager(
    ...     CacheConfig(groups=(spec,), num_blocks=5, max_model_len=64),
    ...     HostTierConfig(num_blocks=8))
    >>> a = mgr.new_request("a", list(range(13)))          # 3 full blocks + 1 token
    >>> mgr.allocate_slots(a, 13, new_computed_blocks=mgr.lookup(a))
    ([1, 2, 3, 4],)
    >>> mgr.free(a)
    >>> b = mgr.new_request("b", list(range(100, 113)))     # evicts a's blocks
    >>> mgr.allocate_slots(b, 13, new_computed_blocks=mgr.lookup(b))
    ([4, 3, 2, 1],)
    >>> [p.groups[0].device_block_ids for p in mgr.take_store_plans()]  # a's, to host
    [(3, 2, 1)]
    """

    def __init__(self, config: CacheConfig, host: HostTierConfig) -> None:
        if not isinstance(host, HostTierConfig):
            raise InvalidArgumentError(f"host must be a HostTierConfig, got {host!r}")
        _check_supported(config)
        self.host_config = host
        self._host_events_on = (config.events_on if host.enable_events is None
                                else host.enable_events)
        super().__init__(config)
        self._block_size = config.groups[0].block_size
        self._num_groups = len(config.groups)
        self._hit_tracker = self.host.tracker

    def _make_pool(
        self, config: CacheConfig, groups: list[GroupInfo], hash_block_size: int,
        recorder: EventRecorder,
    ) -> BlockPool:
        self.host = HostTier(self.host_config, groups, self._host_events_on)
        feeding = HostFeedingRecorder(
            recorder, groups=groups, on_registered=self.host.device_registered,
            wants_registrations=isinstance(self.host_config.write_policy, WriteThrough),
            keep_meta=self._host_events_on)
        self.host.device_meta = feeding.meta
        return EvictionReportingPool(
            config.num_blocks, on_evicted=self.host.device_evicted,
            enable_caching=config.enable_caching, hash_block_size=hash_block_size,
            groups=groups, recorder=feeding)

    # ---------------------------------------------------------------- lookup

    def lookup(self, request: RequestLike) -> TieredHit:
        """The longest hit across tiers: the device hit (:meth:`get_computed_blocks`,
        statistics included), then the blocks right after it that every group holds ready
        in the host tier, all within ``num_tokens - 1`` tokens. No state change besides
        the lookup statistics. O(hit blocks).

        Raises:
            InvalidArgumentError: as :meth:`get_computed_blocks`.
        """
        device = self.get_computed_blocks(request)
        bs = self._block_size
        host = self.host.continuation(request.block_hashes, self._num_groups, bs,
                                      device.num_computed_tokens // bs, request.num_tokens - 1)
        c = self.host.counters
        c.lookups += 1
        c.lookup_tokens += request.num_tokens
        c.device_hit_tokens += device.num_computed_tokens
        c.host_hit_tokens += host.num_tokens
        return TieredHit(device=device, host=host)

    # ---------------------------------------------------------------- allocation

    def allocate_slots(
        self,
        request: RequestLike,
        num_new_tokens: int,
        *,
        new_computed_blocks: ComputedBlocks | TieredHit | None = None,
        num_new_computed_tokens: int | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        num_encoder_tokens: int = 0,
        delay_caching: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        full_sequence_must_fit: bool = False,
    ) -> tuple[list[int], ...] | None:
        """As :meth:`KVCacheManager.allocate_slots`; ``new_computed_blocks`` may also be a
        :class:`TieredHit` from :meth:`lookup`. With a host part, ``num_new_tokens``
        counts tokens after the whole hit; the request gets device blocks for the host
        tokens too, its host blocks are pinned, and a :class:`LoadPlan` is queued
        (:meth:`take_load_plans`, :meth:`load_plan`); those device blocks are registered
        only by ``complete_load(plan, True)``. A refused allocation (``None``) changes
        nothing, in either tier.

        Raises:
            InvalidArgumentError: as the base method; a request with a load in flight; a
                host hit with ``num_external_computed_tokens``, ``num_new_computed_tokens``
                or ``delay_caching``.
            InvalidHitError: a stale host part (a host block evicted since the lookup).
        """
        rid = getattr(request, "request_id", None)
        if type(rid) is str and rid in self.host.loads_by_request:
            raise InvalidArgumentError(
                f"request {rid!r} has a load in flight; call complete_load(plan, success) "
                "before allocating for it again")
        if not isinstance(new_computed_blocks, TieredHit) or not \
                new_computed_blocks.host.num_tokens:
            device_hit = (new_computed_blocks.device
                          if isinstance(new_computed_blocks, TieredHit) else new_computed_blocks)
            new = super().allocate_slots(
                request, num_new_tokens, new_computed_blocks=device_hit,
                num_new_computed_tokens=num_new_computed_tokens,
                num_lookahead_tokens=num_lookahead_tokens,
                num_external_computed_tokens=num_external_computed_tokens,
                num_encoder_tokens=num_encoder_tokens, delay_caching=delay_caching,
                reserved_blocks=reserved_blocks, has_scheduled_reqs=has_scheduled_reqs,
                full_sequence_must_fit=full_sequence_must_fit)
            if new is not None and device_hit is not None and self._hit_tracker is not None:
                self._count_hits(request, device_hit.num_computed_tokens, 0)
            return new
        hit = new_computed_blocks
        host_hit = hit.host
        self._check_host_hit(request, hit, num_new_computed_tokens,
                             num_external_computed_tokens, delay_caching)
        self.host.pin(host_hit)  # before the device allocation can evict into the host
        try:
            new = super().allocate_slots(
                request, num_new_tokens, new_computed_blocks=hit.device,
                num_lookahead_tokens=num_lookahead_tokens,
                num_external_computed_tokens=host_hit.num_tokens,
                num_encoder_tokens=num_encoder_tokens, delay_caching=True,
                reserved_blocks=reserved_blocks, has_scheduled_reqs=has_scheduled_reqs,
                full_sequence_must_fit=full_sequence_must_fit)
        except BaseException:
            self.host.unpin(host_hit.keys)
            raise
        if new is None:
            self.host.unpin(host_hit.keys)
            return None
        first = host_hit.first_block
        last = first + host_hit.num_blocks
        table_id = request.request_id
        device_ids = [m.req_to_blocks[table_id][first:last] for m in self.managers]
        self.host.start_load(request.request_id, host_hit, device_ids, self._block_size,
                             hit.device.num_computed_tokens)
        self._count_hits(request, hit.device.num_computed_tokens, host_hit.num_tokens)
        return new

    def _check_host_hit(
        self, request: RequestLike, hit: TieredHit, num_new_computed_tokens: int | None,
        num_external_computed_tokens: int, delay_caching: bool,
    ) -> None:
        if num_new_computed_tokens is not None or num_external_computed_tokens or delay_caching:
            raise InvalidArgumentError(
                "a hit with a host part sets the external tokens and delayed caching itself; "
                "leave num_new_computed_tokens, num_external_computed_tokens and "
                "delay_caching at their defaults")
        if hit.device.request_id != request.request_id or hit.device.issuer is not \
                self.issuer_token:
            raise InvalidHitError(
                "this TieredHit was not issued by this manager's lookup for this request; "
                "call lookup(request) again")
        bs = self._block_size
        if hit.host.first_block * bs != hit.device.num_computed_tokens or \
                len(hit.host.keys) != self._num_groups:
            raise InvalidHitError("the host part does not continue the device hit; "
                                  "use the TieredHit lookup() returned")
        why = self.host.hit_problem(hit.host)
        if why is not None:
            raise InvalidHitError(why)

    def _count_hits(self, request: RequestLike, device_tokens: int, host_tokens: int) -> None:
        tracker = self._hit_tracker
        if tracker is None:
            return
        n = (device_tokens + host_tokens) // self._block_size
        hashes = request.block_hashes[:n]
        tracker.on_hits((h, g) for g in range(self._num_groups) for h in hashes)

    # ---------------------------------------------------------------- plans

    def take_store_plans(self) -> list[StorePlan]:
        """The store plans made since the previous call (call once per step, like
        :meth:`take_events`). Execute ``before_forward`` ones before anything writes into
        this step's blocks, ``after_forward`` ones after the forward pass."""
        return self.host.take_store_plans()

    def take_load_plans(self) -> list[LoadPlan]:
        """The load plans made since the previous call (call once per step)."""
        return self.host.take_load_plans()

    def load_plan(self, request_id: str) -> LoadPlan | None:
        """The request's load in flight, if any. O(1)."""
        return self.host.loads_by_request.get(request_id)

    def complete_store(self, plan: StorePlan, success: bool = True) -> None:
        """Confirm a store plan: ``success`` makes its host blocks loadable (CPU
        ``BlockStored`` events); otherwise they are freed and their keys forgotten (no
        event; a later eviction may offer them again).

        Raises:
            InvalidArgumentError: ``plan`` is not a store plan in flight (never issued, or
                completed already); nothing changes.
        """
        if not isinstance(plan, StorePlan) or self.host.stores_in_flight.get(plan.plan_id) \
                is not plan:
            raise InvalidArgumentError(
                f"{plan!r} is not a store plan in flight (completed already, or not from "
                "take_store_plans of this manager)")
        if type(success) is not bool:
            raise InvalidArgumentError(f"success must be a bool, got {success!r}")
        self.host.complete_store(plan, success)

    def complete_load(self, plan: LoadPlan, success: bool = True) -> None:
        """Confirm a load plan: its host blocks are unpinned; with ``success`` the request's
        full blocks within ``max(plan.num_computed_tokens, request.num_computed_tokens)``
        tokens are registered on the device (device ``BlockStored`` events). Without, the
        loaded positions stay unregistered: the engine recomputes them from
        ``plan.num_device_tokens`` or frees the request.

        Raises:
            InvalidArgumentError: ``plan`` is not a load plan in flight; nothing changes.
        """
        if not isinstance(plan, LoadPlan) or self.host.loads_in_flight.get(plan.plan_id) \
                is not plan:
            raise InvalidArgumentError(
                f"{plan!r} is not a load plan in flight (completed already, or not from "
                "this manager)")
        if type(success) is not bool:
            raise InvalidArgumentError(f"success must be a bool, got {success!r}")
        self.host.finish_load(plan, success)
        if success:
            request = self.live_requests[plan.request_id]
            rid = plan.request_id
            n = max(plan.num_computed_tokens, request.num_computed_tokens)
            n = min(n, request.num_tokens, self.coordinator.num_token_slots(rid))
            self.coordinator.cache_blocks(request, n)

    # ---------------------------------------------------------------- requests

    def free(self, request: RequestLike | str) -> None:
        """As :meth:`KVCacheManager.free`.

        Raises:
            InvalidArgumentError: also when the request has a load in flight (its device
                blocks are being written; call ``complete_load`` first).
        """
        rid = request if isinstance(request, str) else getattr(request, "request_id", None)
        if type(rid) is str and rid in self.host.loads_by_request:
            raise InvalidArgumentError(
                f"request {rid!r} has a load in flight; call complete_load(plan, success) "
                "before freeing it")
        super().free(request)

    # ---------------------------------------------------------------- events, stats

    def take_events(self) -> list[KVCacheEvent]:
        """Device events (medium ``"GPU"``), then host events (medium ``"CPU"``)."""
        device = self.recorder.take()
        host = self.host.take_events()
        return device + host if host else device

    def publish_events(self) -> int:
        events = self.take_events()
        if self.publisher is not None:
            self.publisher.publish(events)
        return len(events)

    def prefix_index_snapshot(self) -> list[BlockStored]:
        """The device index's stored events (the host tier's are not included)."""
        return super().prefix_index_snapshot()

    def make_host_stats(self) -> HostTierStats:
        """Host-tier counters since the previous call (then a new interval starts)."""
        return self.host.take_stats()

    def reset_host_cache(self) -> bool:
        """Forget every host block (CPU ``BlockRemoved`` events), only when no load or
        store is in flight; returns whether it happened."""
        return self.host.reset()

    @property
    def num_free_host_blocks(self) -> int:
        return self.host.pool.num_free

    # ---------------------------------------------------------------- checks

    def debug_state(self) -> dict[str, Any]:
        state = super().debug_state()
        state["host"] = self.host.pool.debug_state()
        return state

    def check_invariants(self) -> None:
        """The device checks, the host tier's, and across tiers: every load in flight
        belongs to a live request whose table holds its device blocks at its positions,
        unregistered. O(device blocks + host blocks)."""
        super().check_invariants()
        self.host.check_invariants()
        bh = self.pool.block_hash
        for plan in self.host.loads_in_flight.values():
            assert plan.request_id in self.live_requests, "a load for a freed request"
            for gl in plan.groups:
                table = self.managers[gl.group].req_to_blocks[plan.request_id]
                n = len(gl.device_block_ids)
                assert tuple(table[gl.first_block:gl.first_block + n]) == gl.device_block_ids, (
                    "a load's device blocks left the request's table")
                for b in gl.device_block_ids:
                    assert bh[b] is None, f"device block {b} registered before its load completed"

