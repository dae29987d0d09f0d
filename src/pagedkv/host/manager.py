"""The host tier as a component: :class:`HostTierConfig` (``CacheConfig(host_tier=...)``)
attaches a :class:`HostTierComponent`, reachable as ``mgr.host``, whose lookups continue
into host memory.

Without it the plain manager pays nothing. With it, device block ids, hits, evictions and
device events are those of the plain manager for the same calls, except where a host load
adds tokens. It combines with retention, attribution and events.

One scheduler step with the host tier::

    hit = mgr.host.lookup(req)                     # device prefix, then host continuation
    new = mgr.allocate_slots(req, n, new_computed_blocks=hit)   # None: no room
    stores = mgr.host.take_store_plans()           # copies device -> host
    loads = mgr.host.take_load_plans()             # copies host -> device
    # engine: run BEFORE_FORWARD stores, then loads, then the forward pass, then the
    # AFTER_FORWARD stores; confirm each plan:
    mgr.host.complete_store(plan, success); mgr.host.complete_load(plan, success)

**Contract with the engine.** (1) An eviction store (``before_forward``) reads a device
block that was just handed to another request: the engine executes every store plan of a
step before anything writes into that step's blocks (loads included). (2) A request with a
load in flight is neither allocated nor freed until ``complete_load`` (both raise
:class:`~pagedkv.errors.InvalidArgumentError`). (3) After ``complete_load(plan, False)``
the request's tokens past ``plan.num_device_tokens`` are not computed: the engine
recomputes them (its blocks are there, unregistered) or frees the request; when
``plan.resumable`` is False (a window or Mamba group released the device hit's blocks)
it frees the request. (4) A write-through (``after_forward``) store runs before its
block's request is freed. (5) A Mamba group's state is loaded into the request's live
block: the engine starts the step from it.

Supported layouts: any mix of full attention (MLA, sinks), sliding window, chunked local
and Mamba groups, each served by its own host hit rule (:mod:`pagedkv.host.rules`, from
the managers' ``hit_span``), every group's block size equal to the hash block size;
caching on; no ``drop_last_hit``. Others (cross attention, mixed block sizes) raise
:class:`~pagedkv.errors.ConfigError` naming the group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pagedkv.core.components import AllocateCall, ManagerBuild, ManagerComponent
from pagedkv.core.config import CacheConfig
from pagedkv.core.coordinator import BlockTables, ComputedBlocks
from pagedkv.core.manager import KVCacheManager
from pagedkv.core.managers import manager_class_for
from pagedkv.core.records import KVCacheEvent
from pagedkv.core.request import RequestLike
from pagedkv.errors import ConfigError, InvalidArgumentError, InvalidHitError
from pagedkv.host.config import HostTierSettings
from pagedkv.host.device import EvictionListener, HostFeedingRecorder
from pagedkv.host.plans import HostHit, LoadPlan, StorePlan, TieredHit
from pagedkv.host.policy import WriteThrough
from pagedkv.host.rules import ContinuationQuery
from pagedkv.host.tier import HostTier, HostTierStats

__all__ = ["HostTierComponent", "HostTierConfig", "HostTieredKVCacheManager", "make_manager"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostTierConfig(HostTierSettings):
    """A host tier (``CacheConfig(host_tier=...)``; fields:
    :class:`~pagedkv.host.config.HostTierSettings`)."""

    def attach(self, build: ManagerBuild) -> HostTierComponent:
        """Attach the host tier to a manager being built (a component spec, see
        :mod:`pagedkv.core.components`): the recorder feeds the host tier, an eviction
        listener offers evicted blocks to it.

        Raises:
            ConfigError: a layout the host tier does not support (module docstring).
        """
        return HostTierComponent(self, build)


def make_manager(config: CacheConfig, host: HostTierSettings | None = None) -> KVCacheManager:
    """The manager for ``config``, with the host tier ``host`` attached when given
    (``KVCacheManager(replace(config, host_tier=host))``).

    Raises:
        ConfigError: a layout the host tier does not support (see the module docstring).
        InvalidArgumentError: ``host`` is not a HostTierConfig.
    """
    if host is None:
        return KVCacheManager(config)
    if not isinstance(host, HostTierConfig):
        raise InvalidArgumentError(f"host must be a HostTierConfig, got {host!r}")
    return KVCacheManager(replace(config, host_tier=host))


#: Deprecated name of :func:`make_manager` (the host tier is the ``mgr.host`` component).
HostTieredKVCacheManager = make_manager


def _check_supported(config: CacheConfig) -> None:
    hbs = config.hash_block_size or min(s.block_size for s in config.groups)
    for g, spec in enumerate(config.groups):
        cls = manager_class_for(spec, enable_caching=config.enable_caching)
        if not cls.cacheable:
            raise ConfigError(
                f"group {g} is {type(spec).__name__}, whose blocks are never cached "
                f"({cls.__name__}): a host tier has nothing to continue; run this model "
                "without a host tier")
        if spec.block_size != hbs:
            raise ConfigError(
                f"the host tier needs every group's block size equal to the hash block size; "
                f"group {g} has block size {spec.block_size}, hashes are at {hbs}: give "
                "every group one block size and leave CacheConfig.hash_block_size unset"
            )
    if not config.enable_caching:
        raise ConfigError("a host tier needs prefix caching on (CacheConfig.enable_caching)")
    if config.drop_last_hit:
        raise ConfigError("a host tier cannot be combined with CacheConfig.drop_last_hit yet")


class HostTierComponent(ManagerComponent):
    """The host tier of one manager: ``mgr.host`` (module docstring).

    >>> from pagedkv import FullAttentionSpec
    >>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    >>> mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=5, max_model_len=64,
    ...                                  host_tier=HostTierConfig(num_blocks=8)))
    >>> a = mgr.new_request("a", list(range(13)))          # 3 full blocks + 1 token
    >>> mgr.allocate_slots(a, 13, new_computed_blocks=mgr.host.lookup(a))
    ([1, 2, 3, 4],)
    >>> mgr.free(a)
    >>> b = mgr.new_request("b", list(range(100, 113)))     # evicts a's blocks
    >>> mgr.allocate_slots(b, 13, new_computed_blocks=mgr.host.lookup(b))
    ([4, 3, 2, 1],)
    >>> [p.groups[0].device_block_ids for p in mgr.host.take_store_plans()]  # a's, to host
    [(3, 2, 1)]
    """

    def __init__(self, host: HostTierSettings, build: ManagerBuild) -> None:
        super().__init__("host")
        config = build.config
        _check_supported(config)
        self.host_config = host
        events_on = config.events_on if host.enable_events is None else host.enable_events
        self.tier = HostTier(host, build.groups, events_on)
        feeding = HostFeedingRecorder(
            build.recorder, groups=build.groups, on_registered=self.tier.device_registered,
            wants_registrations=isinstance(host.write_policy, WriteThrough),
            keep_meta=events_on)
        self.tier.device_meta = feeding.meta
        build.recorder = feeding
        build.listeners.append(EvictionListener(self.tier.device_evicted))
        self._block_size = config.groups[0].block_size
        self._num_groups = len(config.groups)
        self._hit_tracker = self.tier.tracker

    def bind(self, manager: KVCacheManager) -> None:
        self.mgr = manager
        #: Per group, the positions a hit of N tokens needs (the managers' rule).
        self._spans = [m.hit_span for m in manager.managers]

    # ---------------------------------------------------------------- lookup

    def lookup(self, request: RequestLike) -> TieredHit:
        """The longest hit across tiers: the device hit (``get_computed_blocks``,
        statistics included), then the longest continuation every group can be served
        for from the host tier by its own rule (:mod:`pagedkv.host.rules`: full attention
        every block, a sliding window the blocks in its window, a Mamba group the state
        at the hit's end), all within ``num_tokens - 1`` tokens. No state change besides
        the lookup statistics. O(blocks scanned x groups).

        Raises:
            InvalidArgumentError: as ``get_computed_blocks``.
        """
        device = self.mgr.get_computed_blocks(request)
        bs = self._block_size
        host = self.tier.continuation(ContinuationQuery(
            block_hashes=request.block_hashes, spans=self._spans,
            device_tables=device.block_ids, first_block=device.num_computed_tokens // bs,
            block_size=bs, end_block=(request.num_tokens - 1) // bs))
        c = self.tier.counters
        c.lookups += 1
        c.lookup_tokens += request.num_tokens
        c.device_hit_tokens += device.num_computed_tokens
        c.host_hit_tokens += host.num_tokens
        return TieredHit(device=device, host=host)

    # ---------------------------------------------------------------- allocation hooks

    def before_allocate(self, request: RequestLike) -> None:
        """A request with a load in flight is not allocated for (InvalidArgumentError)."""
        rid = getattr(request, "request_id", None)
        if type(rid) is str and rid in self.tier.loads_by_request:
            raise InvalidArgumentError(
                f"request {rid!r} has a load in flight; call complete_load(plan, success) "
                "before allocating for it again")

    def allocate_hit(self, request: RequestLike, call: AllocateCall) -> BlockTables | None:
        """``allocate_slots`` with a :class:`TieredHit` from :meth:`lookup`. With a host
        part, ``num_new_tokens`` counts tokens after the whole hit; the request gets device
        blocks for the host tokens too, its host blocks are pinned, and a
        :class:`LoadPlan` is queued (:meth:`take_load_plans`, :meth:`load_plan`); those
        device blocks are registered only by ``complete_load(plan, True)``. A refused
        allocation (``None``) changes nothing, in either tier.

        Raises:
            InvalidArgumentError: a host hit with ``num_external_computed_tokens``,
                ``num_new_computed_tokens`` or ``delay_caching``.
            InvalidHitError: a stale host part (a host block evicted since the lookup).
        """
        hit = call.new_computed_blocks
        if not isinstance(hit, TieredHit):
            raise NotImplementedError
        mgr = self.mgr
        if not hit.host.num_tokens:
            return mgr.allocate_slots(request, call.num_new_tokens,
                                      **{**call.as_kwargs(), "new_computed_blocks": hit.device})
        host_hit = hit.host
        self._check_host_hit(request, hit, call)
        self.tier.pin(host_hit)  # before the device allocation can evict into the host
        kwargs = {**call.as_kwargs(), "new_computed_blocks": hit.device,
                  "num_external_computed_tokens": host_hit.num_tokens, "delay_caching": True}
        try:
            new = mgr.allocate_slots(request, call.num_new_tokens, **kwargs)
        except BaseException:
            self.tier.unpin(host_hit.keys)
            raise
        if new is None:
            self.tier.unpin(host_hit.keys)
            return None
        self.tier.start_load(request.request_id, host_hit,
                             self._load_targets(request.request_id, host_hit),
                             hit.device.num_computed_tokens,
                             self._holds_hit(request.request_id, hit.device.num_computed_tokens))
        # the device part was counted by after_allocate; count the host keys loaded
        if self._hit_tracker is not None:
            self._hit_tracker.on_hits(k for keys in host_hit.keys for k in keys)
        return new

    def _load_targets(self, rid: str, host_hit: HostHit) -> list[tuple[int, list[int]]]:
        """Per group, where its host blocks land: (first table position, device ids), as
        each manager places KV that arrives as external tokens (``load_position``)."""
        end = host_hit.first_block + host_hit.num_tokens // self._block_size
        out: list[tuple[int, list[int]]] = []
        for m, ids in zip(self.mgr.managers, host_hit.host_block_ids, strict=True):
            if not ids:
                out.append((end, []))
                continue
            first = m.load_position(rid, end - len(ids))
            out.append((first, m.req_to_blocks[rid][first:first + len(ids)]))
        return out

    def _holds_hit(self, rid: str, num_tokens: int) -> bool:
        """Whether every group's table still holds the blocks a hit of ``num_tokens``
        needs (so a failed load can be recomputed from there)."""
        for m, span in zip(self.mgr.managers, self._spans, strict=True):
            start, end = span(num_tokens)
            table = m.req_to_blocks[rid]
            if not all(table[start:end]):
                return False
        return True

    def after_allocate(self, request: RequestLike, hit: object,
                       new: BlockTables | None) -> None:
        """A device-only hit that was adopted counts for the admission rule's hits."""
        if new is not None and isinstance(hit, ComputedBlocks) and self._hit_tracker:
            self._count_hits(request, hit.num_computed_tokens)

    def _check_host_hit(self, request: RequestLike, hit: TieredHit,
                        call: AllocateCall) -> None:
        if (call.num_new_computed_tokens is not None or call.num_external_computed_tokens
                or call.delay_caching):
            raise InvalidArgumentError(
                "a hit with a host part sets the external tokens and delayed caching itself; "
                "leave num_new_computed_tokens, num_external_computed_tokens and "
                "delay_caching at their defaults")
        if hit.device.request_id != request.request_id or hit.device.issuer is not \
                self.mgr.issuer_token:
            raise InvalidHitError(
                "this TieredHit was not issued by this manager's lookup for this request; "
                "call lookup(request) again")
        bs = self._block_size
        if hit.host.first_block * bs != hit.device.num_computed_tokens or \
                len(hit.host.keys) != self._num_groups:
            raise InvalidHitError("the host part does not continue the device hit; "
                                  "use the TieredHit lookup() returned")
        why = self.tier.hit_problem(hit.host)
        if why is not None:
            raise InvalidHitError(why)

    def _count_hits(self, request: RequestLike, num_tokens: int) -> None:
        """The admission rule hears of a device hit of ``num_tokens`` tokens: per group,
        the keys of the positions its rule needs."""
        tracker = self._hit_tracker
        if tracker is None:
            return
        hashes = request.block_hashes
        tracker.on_hits((hashes[p], g) for g, span in enumerate(self._spans)
                        for p in range(*span(num_tokens)))

    def before_free(self, request: RequestLike | str, live: RequestLike | None) -> None:
        """A request with a load in flight is not freed (its device blocks are being
        written; InvalidArgumentError: call ``complete_load`` first)."""
        rid = request if isinstance(request, str) else getattr(request, "request_id", None)
        if type(rid) is str and rid in self.tier.loads_by_request:
            raise InvalidArgumentError(
                f"request {rid!r} has a load in flight; call complete_load(plan, success) "
                "before freeing it")

    # ---------------------------------------------------------------- plans

    def take_store_plans(self) -> list[StorePlan]:
        """The store plans made since the previous call (call once per step, like
        ``take_events``). Execute ``before_forward`` ones before anything writes into
        this step's blocks, ``after_forward`` ones after the forward pass."""
        return self.tier.take_store_plans()

    def take_load_plans(self) -> list[LoadPlan]:
        """The load plans made since the previous call (call once per step)."""
        return self.tier.take_load_plans()

    def load_plan(self, request_id: str) -> LoadPlan | None:
        """The request's load in flight, if any. O(1)."""
        return self.tier.loads_by_request.get(request_id)

    def complete_store(self, plan: StorePlan, success: bool = True) -> None:
        """Confirm a store plan: ``success`` makes its host blocks loadable (CPU
        ``BlockStored`` events); otherwise they are freed and their keys forgotten (no
        event; a later eviction may offer them again).

        Raises:
            InvalidArgumentError: ``plan`` is not a store plan in flight (never issued, or
                completed already); nothing changes.
        """
        if not isinstance(plan, StorePlan) or self.tier.stores_in_flight.get(plan.plan_id) \
                is not plan:
            raise InvalidArgumentError(
                f"{plan!r} is not a store plan in flight (completed already, or not from "
                "take_store_plans of this manager)")
        if type(success) is not bool:
            raise InvalidArgumentError(f"success must be a bool, got {success!r}")
        self.tier.complete_store(plan, success)

    def complete_load(self, plan: LoadPlan, success: bool = True) -> None:
        """Confirm a load plan: its host blocks are unpinned; with ``success`` the request's
        full blocks within ``max(plan.num_computed_tokens, request.num_computed_tokens)``
        tokens are registered on the device (device ``BlockStored`` events). Without, the
        loaded positions stay unregistered: the engine recomputes them from
        ``plan.num_device_tokens`` or frees the request.

        Raises:
            InvalidArgumentError: ``plan`` is not a load plan in flight; nothing changes.
        """
        if not isinstance(plan, LoadPlan) or self.tier.loads_in_flight.get(plan.plan_id) \
                is not plan:
            raise InvalidArgumentError(
                f"{plan!r} is not a load plan in flight (completed already, or not from "
                "this manager)")
        if type(success) is not bool:
            raise InvalidArgumentError(f"success must be a bool, got {success!r}")
        self.tier.finish_load(plan, success)
        if success:
            mgr = self.mgr
            request = mgr.live_requests[plan.request_id]
            rid = plan.request_id
            n = max(plan.num_computed_tokens, request.num_computed_tokens)
            n = min(n, request.num_tokens, mgr.coordinator.num_token_slots(rid))
            mgr.coordinator.cache_blocks(request, n)

    # ---------------------------------------------------------------- events, stats

    def take_events(self) -> list[KVCacheEvent]:
        """Host events (medium ``"CPU"``), after the device's in ``mgr.take_events()``."""
        return self.tier.take_events()

    def make_host_stats(self) -> HostTierStats:
        """Host-tier counters since the previous call (then a new interval starts)."""
        return self.tier.take_stats()

    def reset_host_cache(self) -> bool:
        """Forget every host block (CPU ``BlockRemoved`` events), only when no load or
        store is in flight; returns whether it happened."""
        return self.tier.reset()

    @property
    def num_free_host_blocks(self) -> int:
        return self.tier.pool.num_free

    # ---------------------------------------------------------------- checks

    def debug_state(self, state: dict[str, Any]) -> None:
        state["host"] = self.tier.pool.debug_state()

    def check_invariants(self) -> None:
        """The host tier's checks, and across tiers: every load in flight belongs to a
        live request whose table holds its device blocks at its positions, unregistered.
        O(device blocks + host blocks)."""
        self.tier.check_invariants()
        mgr = self.mgr
        bh = mgr.pool.block_hash
        for plan in self.tier.loads_in_flight.values():
            assert plan.request_id in mgr.live_requests, "a load for a freed request"
            for gl in plan.groups:
                table = mgr.managers[gl.group].req_to_blocks[plan.request_id]
                n = len(gl.device_block_ids)
                assert tuple(table[gl.first_block:gl.first_block + n]) == gl.device_block_ids, (
                    "a load's device blocks left the request's table")
                for b in gl.device_block_ids:
                    assert bh[b] is None, f"device block {b} registered before its load completed"
