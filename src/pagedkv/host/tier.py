"""The host tier: the host block pool plus the plans in flight, the write policy, the
admission rule, statistics and CPU events. The manager
(:class:`~pagedkv.host.manager.HostTieredKVCacheManager`) drives it; the engine sees only
plans.

Store lifecycle (one key): offered (device eviction or registration) -> admitted? ->
already in the host tier? (then only touched) -> a host block is reserved (an LRU entry
may be evicted: a CPU ``BlockRemoved``), the key is *pending* (lookups see
``HIT_PENDING``) and the copy goes into a :class:`StorePlan` -> ``complete_store(plan,
True)``: ready (loadable, evictable; a CPU ``BlockStored``) or ``complete_store(plan,
False)``: the entry and its block are gone, no event.

Load lifecycle: a lookup finds ready keys continuing the device hit -> ``allocate_slots``
pins them (no eviction) and queues a :class:`LoadPlan` -> ``complete_load(plan, ...)``
unpins them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pagedkv.core.components import DeviceBlock
from pagedkv.core.recorder import GroupInfo
from pagedkv.core.records import MEDIUM_CPU, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.host.config import HostTierSettings
from pagedkv.host.device import BlockMeta
from pagedkv.host.plans import (
    GroupLoad,
    GroupStore,
    HostHit,
    HostKey,
    LoadPlan,
    StorePlan,
)
from pagedkv.host.policy import HitTracker
from pagedkv.host.pool import HostBlockPool
from pagedkv.host.rules import ContinuationQuery, find_continuation

#: Where one group's load lands: (first table position, device block ids).
LoadTarget = tuple[int, Sequence[int]]

__all__ = ["DeviceBlock", "HostTier", "HostTierStats"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostTierStats:
    """Host-tier counters over one interval (``make_host_stats``): lookups and their hit
    tokens per tier, blocks loaded, store blocks planned / completed / failed, blocks
    offered but not admitted or not placed (every host block pinned or pending), and host
    blocks evicted."""

    lookups: int = 0
    lookup_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    loads: int = 0
    loaded_blocks: int = 0
    failed_loads: int = 0
    stored_blocks_planned: int = 0
    stored_blocks: int = 0
    failed_store_blocks: int = 0
    not_admitted_blocks: int = 0
    no_room_blocks: int = 0
    evicted_blocks: int = 0


@dataclass(slots=True)
class _Counters:
    """The mutable twin of :class:`HostTierStats`."""

    lookups: int = 0
    lookup_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    loads: int = 0
    loaded_blocks: int = 0
    failed_loads: int = 0
    stored_blocks_planned: int = 0
    stored_blocks: int = 0
    failed_store_blocks: int = 0
    not_admitted_blocks: int = 0
    no_room_blocks: int = 0
    evicted_blocks: int = 0

    def value(self) -> HostTierStats:
        return HostTierStats(**asdict(self))


class HostTier:
    """The host pool and everything in flight. Not thread-safe (the scheduler thread)."""

    def __init__(
        self, config: HostTierSettings, groups: Sequence[GroupInfo], events_on: bool
    ) -> None:
        self.config = config
        self.groups = list(groups)
        self.pool = HostBlockPool(config.num_blocks)
        self.write_policy = config.write_policy
        self.tracker: HitTracker | None = config.admission.tracker()
        self.events_on = events_on
        #: Device block id -> meta (filled by the recorder when events are on).
        self.device_meta: dict[int, BlockMeta] = {}
        self._next_plan_id = 1
        self._new_store_plans: list[StorePlan] = []
        self._new_load_plans: list[LoadPlan] = []
        self.stores_in_flight: dict[int, StorePlan] = {}
        self.loads_in_flight: dict[int, LoadPlan] = {}
        self.loads_by_request: dict[str, LoadPlan] = {}
        # Load plan id -> the host keys it pinned, per group.
        self._load_keys: dict[int, tuple[tuple[HostKey, ...], ...]] = {}
        self._events: list[KVCacheEvent] = []
        self.counters = _Counters()

    # ------------------------------------------------------------------ stores

    def device_evicted(self, blocks: list[DeviceBlock]) -> None:
        self.write_policy.on_device_evicted(self, blocks)

    def device_registered(self, blocks: list[DeviceBlock]) -> None:
        self.write_policy.on_device_registered(self, blocks)

    def offer_stores(self, blocks: list[DeviceBlock], timing: str) -> StorePlan | None:
        """Plan copies of the offered device blocks that are admitted and not in the host
        tier yet (keys already there are touched), as far as host blocks can be freed.
        Returns the plan (also queued for ``take_store_plans``) or ``None``."""
        pool = self.pool
        tracker = self.tracker
        c = self.counters
        per_group: dict[int, tuple[list[int], list[int], list[bytes]]] = {}
        present: list[HostKey] = []
        meta = self.device_meta
        for b, h, g in blocks:
            key = (h, g)
            if key in pool.entries:
                present.append(key)
                continue
            if tracker is not None and not tracker.admits(key):
                c.not_admitted_blocks += 1
                continue
            hb, evicted = pool.reserve(key, meta.get(b) if self.events_on else None)
            if hb < 0:
                c.no_room_blocks += 1
                continue
            if evicted is not None:
                self._announce_removed(evicted[0])
                c.evicted_blocks += 1
            d, hs, hashes = per_group.setdefault(g, ([], [], []))
            d.append(b)
            hs.append(hb)
            hashes.append(h)
        if present:
            pool.touch(present)
        if not per_group:
            return None
        plan = StorePlan(
            plan_id=self._new_id(), timing=timing,
            groups=tuple(GroupStore(group=g, device_block_ids=tuple(d),
                                    host_block_ids=tuple(hs), block_hashes=tuple(hashes))
                         for g, (d, hs, hashes) in sorted(per_group.items())),
        )
        self.stores_in_flight[plan.plan_id] = plan
        self._new_store_plans.append(plan)
        c.stored_blocks_planned += plan.num_blocks
        return plan

    def complete_store(self, plan: StorePlan, success: bool) -> None:
        """Make the plan's keys ready (``success``) or drop them. Precondition: in flight."""
        del self.stores_in_flight[plan.plan_id]
        pool = self.pool
        c = self.counters
        for gs in plan.groups:
            for h in gs.block_hashes:
                key = (h, gs.group)
                if success:
                    pool.commit(key)
                    self._announce_stored(key)
                else:
                    pool.rollback(key)
            if success:
                c.stored_blocks += len(gs.block_hashes)
            else:
                c.failed_store_blocks += len(gs.block_hashes)

    def take_store_plans(self) -> list[StorePlan]:
        plans = self._new_store_plans
        self._new_store_plans = []
        return plans

    # ------------------------------------------------------------------ lookups and loads

    def continuation(self, query: ContinuationQuery) -> HostHit:
        """The ready keys continuing a device hit, every group by its own rule
        (:mod:`pagedkv.host.rules`). No state change. O(positions scanned x groups)."""
        entries = self.pool.entries
        state = self.pool.state
        cont = find_continuation(query, state)
        ids: list[tuple[int, ...]] = []
        keys: list[tuple[HostKey, ...]] = []
        hashes = query.block_hashes
        for g, start in enumerate(cont.starts):
            gkeys = tuple((hashes[p], g) for p in range(start, cont.end_block))
            keys.append(gkeys)
            ids.append(tuple(entries[k].block_id for k in gkeys))
        num_blocks = cont.end_block - cont.first_block
        return HostHit(first_block=cont.first_block,
                       num_tokens=num_blocks * query.block_size,
                       host_block_ids=tuple(ids), keys=tuple(keys),
                       num_pending_blocks=cont.num_pending_blocks)

    def hit_problem(self, hit: HostHit) -> str | None:
        """Why ``hit`` cannot be loaded now (a key gone, pending, or moved), or None."""
        entries = self.pool.entries
        for keys, ids in zip(hit.keys, hit.host_block_ids, strict=True):
            for k, b in zip(keys, ids, strict=True):
                e = entries.get(k)
                if e is None or not e.ready or e.block_id != b:
                    return ("the host part of the hit is stale (a host block was evicted or "
                            "replaced since the lookup); look the request up again")
        return None

    def pin(self, hit: HostHit) -> None:
        for keys in hit.keys:
            for k in keys:
                self.pool.pin(k)

    def unpin(self, hit_keys: Sequence[Sequence[HostKey]]) -> None:
        for keys in hit_keys:
            for k in keys:
                self.pool.unpin(k)

    def start_load(self, request_id: str, hit: HostHit, targets: Sequence[LoadTarget],
                   num_device_tokens: int, resumable: bool) -> LoadPlan:
        """Record the load of the (already pinned) ``hit`` into each group's target
        (``(first table position, device block ids)``); touch its keys (the chain's head
        most recent)."""
        plan = LoadPlan(
            plan_id=self._new_id(), request_id=request_id,
            groups=tuple(
                GroupLoad(group=g, host_block_ids=hit.host_block_ids[g],
                          device_block_ids=tuple(ids), first_block=first,
                          num_tokens=hit.num_tokens)
                for g, (first, ids) in enumerate(targets)),
            num_device_tokens=num_device_tokens, num_host_tokens=hit.num_tokens,
            resumable=resumable,
        )
        for keys in hit.keys:
            self.pool.touch(reversed(keys))
        self.loads_in_flight[plan.plan_id] = plan
        self.loads_by_request[request_id] = plan
        self._load_keys[plan.plan_id] = hit.keys
        self._new_load_plans.append(plan)
        c = self.counters
        c.loads += 1
        c.loaded_blocks += plan.num_blocks
        return plan

    def finish_load(self, plan: LoadPlan, success: bool) -> None:
        """Unpin the plan's host blocks. Precondition: in flight."""
        del self.loads_in_flight[plan.plan_id]
        del self.loads_by_request[plan.request_id]
        self.unpin(self._load_keys.pop(plan.plan_id))
        if not success:
            self.counters.failed_loads += 1

    def take_load_plans(self) -> list[LoadPlan]:
        plans = self._new_load_plans
        self._new_load_plans = []
        return plans

    # ------------------------------------------------------------------ events

    def _announce_stored(self, key: HostKey) -> None:
        if not self.events_on:
            return
        h, g = key
        e = self.pool.entries[key]
        meta: BlockMeta | None = e.meta
        info = self.groups[g]
        if meta is None:
            self._events.append(BlockStored([h], None, [], info.block_size, None, MEDIUM_CPU,
                                            None, None, g, info.kind, info.sliding_window))
            return
        self._events.append(BlockStored(
            [h], meta.parent_block_hash, meta.token_ids, info.block_size, meta.lora_id,
            MEDIUM_CPU, meta.lora_name, [meta.extra_keys], g, info.kind, info.sliding_window))

    def _announce_removed(self, key: HostKey) -> None:
        if self.events_on:
            self._events.append(BlockRemoved([key[0]], MEDIUM_CPU, key[1]))

    def take_events(self) -> list[KVCacheEvent]:
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    def reset(self) -> bool:
        """Drop every ready entry, only when nothing is in flight; returns whether done."""
        if self.loads_in_flight or self.stores_in_flight:
            return False
        for key, _ in self.pool.drop_unpinned():
            self._announce_removed(key)
        return True

    # ------------------------------------------------------------------ misc

    def _new_id(self) -> int:
        i = self._next_plan_id
        self._next_plan_id = i + 1
        return i

    def take_stats(self) -> HostTierStats:
        v = self.counters.value()
        self.counters = _Counters()
        return v

    def check_invariants(self) -> None:
        """The pool's checks; every in-flight store's keys pending; every pin belongs to an
        in-flight load (pin counts equal). O(host blocks + keys in flight)."""
        pool = self.pool
        pool.check_invariants()
        pending = {k for k, e in pool.entries.items() if not e.ready}
        planned: set[HostKey] = set()
        for plan in self.stores_in_flight.values():
            for gs in plan.groups:
                for h, hb in zip(gs.block_hashes, gs.host_block_ids, strict=True):
                    key = (h, gs.group)
                    assert key not in planned, f"host key {key!r} in two store plans"
                    planned.add(key)
                    assert pool.entries[key].block_id == hb, "store plan and entry disagree"
        assert planned == pending, "pending host entries and store plans in flight differ"
        pins: dict[HostKey, int] = {}
        for load in self.loads_in_flight.values():
            assert self.loads_by_request.get(load.request_id) is load, "load index broken"
            keys = self._load_keys[load.plan_id]
            for gl, gkeys in zip(load.groups, keys, strict=True):
                for b, key in zip(gl.host_block_ids, gkeys, strict=True):
                    assert pool.entries[key].block_id == b, "a loading host block moved"
                    pins[key] = pins.get(key, 0) + 1
        assert len(self.loads_by_request) == len(self.loads_in_flight), "load index broken"
        assert self._load_keys.keys() == self.loads_in_flight.keys(), "load keys leaked"
        for k, e in pool.entries.items():
            assert e.pins == pins.get(k, 0), (
                f"host key {k!r}: {e.pins} pins but {pins.get(k, 0)} loads read it")
