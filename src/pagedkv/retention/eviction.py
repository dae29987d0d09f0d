"""Retention as the pool's eviction policy: :class:`RetentionPolicy`, an
:class:`~pagedkv.core.components.EvictionPolicy` whose free queue is a
:class:`~pagedkv.retention.priority_queue.PriorityFreeQueue`, plus pins and tenant quotas.
The block pool calls it where the order of free blocks could change; it never subclasses
the pool.

What the policy adds to the base pool's rules:

* **priorities**: a freed hashed block joins the LRU list of its priority level (set by
  :class:`~pagedkv.retention.control.RetentionControl` from the releasing request's
  :class:`~pagedkv.retention.policy.RequestRetention`); eviction takes unhashed blocks,
  then blocks over a tenant quota, then the lowest level first, LRU within a level.
* **durations**: a level held for ``duration_s`` reverts to the default level that long
  after the block became free (the back of the default level, as in TensorRT-LLM).
* **pins**: a block whose primary key ``(group, hash)`` is pinned is never evicted while
  the pin's lease lasts; free, it is *parked* (not counted as free) unless
  ``preempt_pins``. When the last lease on a key ends, its free blocks join their level as
  if freed at that moment.
* **quotas**: the tenant of a block is the cache salt of the request that registered it
  (salts isolate hashes, so every request that can hit a block has the same tenant).

**Uniform mode.** Until retention is first used — a request carrying a
:class:`~pagedkv.retention.policy.RequestRetention` is freed, or a prefix is pinned — and
when no tenant has a quota, every block would sit at the default level: the pool then
keeps the base pool's single :class:`~pagedkv.core.free_queue.FreeBlockQueue` and its code
(vLLM's order and speed exactly, ``evict_blocks`` included). The first use converts the
queue once (:meth:`RetentionPolicy.specialise`, O(num_blocks)); it never goes back.

Complexity: every operation stays O(blocks it touches), plus O(log levels) per level
visited and O(1) per expiry; no operation scans the pool except ``reset_prefix_cache``,
the checks (as in the base pool) and the one conversion out of uniform mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from pagedkv.core.components import EvictionPolicy
from pagedkv.core.pool import BlockPool
from pagedkv.core.request import RequestLike
from pagedkv.retention.pins import PinKey, PinLease, PinTable
from pagedkv.retention.policy import RetentionSettings, read_clock
from pagedkv.retention.priority_queue import PriorityFreeQueue

__all__ = ["RetentionPolicy"]

_INF = float("inf")


class RetentionPolicy(EvictionPolicy):
    """The eviction order by retention (module docstring); ``pool`` is set by
    :meth:`bind`."""

    pool: BlockPool

    def __init__(self, retention: RetentionSettings, num_blocks: int) -> None:
        self.retention = retention
        self.num_blocks = num_blocks
        #: The retention queue once out of uniform mode (then also ``free_queue``).
        self._pq: PriorityFreeQueue | None = None
        #: Pinned keys and their leases.
        self.pins = PinTable(
            budget_keys=int(retention.pin_budget_fraction * (num_blocks - 1))
        )
        #: ``pins.by_group`` (one lookup less when a block is registered).
        self._pinned_by_group = self.pins.by_group
        self._tenant_ids: dict[str | None, int] = {}
        self._quotas_on = retention.has_quotas

    def bind(self, pool: BlockPool) -> None:
        self.pool = pool
        if self._quotas_on:
            self.specialise().plain = False

    # ------------------------------------------------------------------ mode

    @property
    def uniform(self) -> bool:
        """Whether the pool is still in uniform mode (module docstring)."""
        return self._pq is None

    def specialise(self) -> PriorityFreeQueue:
        """The retention queue, converting the free queue out of uniform mode first if
        needed (keeping the eviction order; blocks that lost their hash in place move to
        the unhashed list). O(num_blocks) the first time, O(1) afterwards."""
        pq = self._pq
        if pq is None:
            r = self.retention
            pool = self.pool
            pq = PriorityFreeQueue.adopt(
                pool.free_queue.to_list(), [h is not None for h in pool.block_hash],
                self.num_blocks, clock=r.clock, default_priority=r.default_priority,
                preempt_pins=r.preempt_pins)
            pq.on_deadline = self._on_deadline
            pool.set_free_queue(pq)  # the pure free/touch kernels take it
            self._pq = pq
        return pq

    @property
    def num_parked(self) -> int:
        """Free blocks held out of eviction by pins."""
        return 0 if self._pq is None else self._pq.num_parked

    # ------------------------------------------------------------------ tenants

    def tenant_id(self, salt: str | None) -> int:
        """The queue's id for tenant ``salt`` (registered with its quota on first use)."""
        t = self._tenant_ids.get(salt)
        if t is None:
            t = self._tenant_ids[salt] = self.specialise().add_tenant(
                self.retention.quota_of(salt)
            )
        return t

    # ------------------------------------------------------------------ base hooks

    def touch(self, ids: Sequence[int]) -> bool:
        """As the base pool; a hit on a pinned block also refreshes its refresh-on-hit
        leases. O(n); the keys of the pinned hits are read only until every
        refresh-on-hit lease is refreshed (usually the first one). In uniform mode the
        pool counts the references itself (False)."""
        queue = self._pq
        if queue is None:
            return False
        hits = ids
        pinned = queue.pinned
        pins = self.pins
        first = 0  # the first pinned hit, if a lease refreshes on hits
        if pins.num_refreshing:
            for b in hits:
                if pinned[b]:
                    first = b
                    break
        now = 0.0
        if first:
            now = queue.tick()  # a lease that ended is not refreshed
        elif queue.deadline != _INF and queue.expiries_move_blocks():
            queue.tick()  # expiries first, so they happen in time order
        pool = self.pool
        ref = pool.ref_cnt
        remove = queue.remove
        for b in hits:
            if b:
                if ref[b] == 0:
                    remove(b)
                ref[b] += 1
        if first and not (pinned[first] and pins.refresh_holders(
                cast("list[PinLease]", pinned[first]), now)):
            # More than the first pinned hit's leases to refresh: every pinned hit's
            # keys, read lazily (the refresh ends once every lease is refreshed). A
            # pinned mark implies a hash (check_invariants), so the keys are real.
            bg, bh = pool.block_group, pool.block_hash
            keys = cast("Iterator[PinKey]", ((bg[b], bh[b]) for b in hits if pinned[b]))
            pins.refresh_keys(keys, now)
        return True

    def registered(
        self,
        request: RequestLike,
        blocks: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        group: int,
        mask: Sequence[bool] | None,
    ) -> None:
        """Newly registered blocks learn their tenant and whether their key is pinned.
        O(num_full_blocks - num_cached_blocks)."""
        pins = self.pins.keys
        bh = self.pool.block_hash
        if not self._quotas_on:
            # Fresh blocks already have no tenant (popleft_n reset it): only pin marks,
            # and none unless one of the blocks' hashes is pinned in this group (a block
            # not registered here only costs the exact loop below).
            pinned_hashes = self._pinned_by_group.get(group)
            if not pinned_hashes:
                return
            if num_full_blocks - num_cached_blocks == 1:  # a decode step filled a block
                if bh[blocks[num_cached_blocks]] not in pinned_hashes:
                    return
            elif pinned_hashes.isdisjoint(
                    map(bh.__getitem__, blocks[num_cached_blocks:num_full_blocks])):
                return
            marks = self.specialise().pinned  # pins: out of uniform mode already
            for i in range(num_cached_blocks, num_full_blocks):
                b = blocks[i]
                if b and (mask is None or mask[i - num_cached_blocks]):
                    h = bh[b]
                    holders = pins.get((group, h)) if h is not None else None
                    if holders:
                        marks[b] = holders
            return
        queue = self.specialise()  # quotas: out of uniform mode already
        extras = request.hash_extras
        t = self.tenant_id(extras.cache_salt if extras is not None else None)
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            h = bh[b]
            if b and h is not None and (mask is None or mask[i - num_cached_blocks]):
                queue.tenant[b] = t
                holders = pins.get((group, h)) if pins else None
                if holders:
                    queue.pinned[b] = holders

    def registered_partial(
        self, request: RequestLike, block: int, h: bytes, group: int
    ) -> None:
        """A block that got its primary key ``h`` here learns its tenant and pin as in
        :meth:`registered`."""
        if self._pq is not None:
            queue = self._pq
            if self._quotas_on:
                extras = request.hash_extras
                queue.tenant[block] = self.tenant_id(
                    extras.cache_salt if extras is not None else None)
            holders = self.pins.keys.get((group, h))
            if holders:
                queue.pinned[block] = holders

    def before_evict_blocks(self) -> None:
        """Expiries due first; a free block losing its hash then moves to the back of the
        unhashed blocks (:meth:`unhashed`; it can never be hit again); in uniform mode it
        stays in place, as in vLLM."""
        queue = self._pq
        if queue is not None and queue.deadline != _INF:
            queue.tick()

    def unhashed(self, block: int) -> None:
        if self._pq is not None:
            self._pq.make_unhashed(block)

    def moving(self, src: int, dst: int) -> Callable[[], None] | None:
        """Out of uniform mode ``dst`` takes ``src``'s pin mark and tenant, and ``src``
        forgets its retention (it has no hash any more). O(1)."""
        pq = self._pq
        if pq is None:
            return None
        pinned, tenant = pq.pinned[src], pq.tenant[src]

        def after() -> None:
            pq.make_unhashed(src)
            pq.pinned[dst], pq.tenant[dst] = pinned, tenant

        return after

    def reset(self) -> bool:
        """Only when no block is in use (parked pinned blocks are free); pins stay (they
        name content), their blocks lose them with their hashes."""
        queue = self._pq
        if queue is None:
            return self.pool.free_queue.num_free == self.num_blocks - 1
        if queue.deadline != _INF:
            queue.tick()  # the unhashed blocks keep the order of the moment
        if queue.num_free + queue.num_parked != self.num_blocks - 1:
            return False
        queue.rebuild_unhashed()
        return True

    # ------------------------------------------------------------------ pins

    def _blocks_of(self, key: PinKey) -> list[int]:
        """Blocks whose primary key is ``key`` (primary and duplicates). O(duplicates)."""
        g, h = key
        pool = self.pool
        out = []
        primary = pool.index[g].get(h)
        if primary is not None:
            out.append(primary)
            out.extend(pool.duplicates_of(g, h))
        bh, bg = pool.block_hash, pool.block_group
        return [b for b in out if bh[b] == h and bg[b] == g]

    def pin(self, keys: Sequence[PinKey], *, ttl_s: float, refresh_on_hit: bool) -> PinLease:
        """Pin ``keys`` for ``ttl_s`` seconds; their cached blocks are held from now on.

        Raises:
            PinBudgetError: over the pin budget; nothing changed.
            InvalidArgumentError: a bad ``ttl_s`` or no keys; nothing changed.
        """
        was_uniform = self._pq is None
        now = read_clock(self.retention.clock, -math.inf) if self._pq is None else self._pq.tick()
        lease, new = self.pins.pin(keys, ttl_s=ttl_s, now=now, refresh_on_hit=refresh_on_hit)
        queue = self.specialise()
        if was_uniform:
            queue.now_s = now
        queue.plain = False
        for key in new:
            holders = self.pins.keys[key]
            for b in self._blocks_of(key):
                queue.set_pinned(b, holders)
        queue.deadline = min(queue.deadline, lease.expires_at)
        return lease

    def unpin(self, lease: PinLease) -> None:
        """End ``lease`` now (no-op if it ended); keys no other lease holds are released."""
        if self._pq is not None:
            self._pq.tick()
        self._release(lease)

    def renew(self, lease: PinLease, *, ttl_s: float) -> None:
        """Make ``lease`` expire ``ttl_s`` seconds from now (see :meth:`PinTable.renew`)."""
        queue = self._pq
        now = read_clock(self.retention.clock, -math.inf) if queue is None else queue.tick()
        self.pins.renew(lease, ttl_s=ttl_s, now=now)
        if queue is not None:
            queue.deadline = min(queue.deadline, lease.expires_at)

    def _release(self, lease: PinLease) -> None:
        keys = self.pins.release(lease)
        if not keys:
            return
        queue = self.specialise()  # keys were pinned: out of uniform mode already
        for key in keys:
            for b in self._blocks_of(key):
                queue.set_pinned(b, False)

    def _on_deadline(self, now: float) -> None:
        """Let every lease expiry and duration revert due by ``now`` happen, earliest
        first, then arm the queue for the next one."""
        queue = self.specialise()  # deadlines exist only out of uniform mode
        pins = self.pins
        while True:
            t_pin = pins.next_expiry()
            t_dur, head = queue.next_duration_expiry()
            if t_pin > now and t_dur > now:
                queue.deadline = min(t_pin, t_dur)
                return
            queue.now_s = min(t_pin, t_dur)  # timers restarted here start at the expiry
            if t_pin <= t_dur:
                self._release(pins.pop_due())
            else:
                queue.expire_front(head)
            queue.now_s = now

    # ------------------------------------------------------------------ checks

    def settle(self) -> None:
        """Due expiries take effect (before the pool's state is read)."""
        queue = self._pq
        if queue is not None and queue.deadline != _INF:
            queue.tick()

    def debug_state(self, state: dict[str, Any]) -> None:
        """The retention state, as of the pool's :meth:`settle`."""
        queue = self._pq
        if queue is None:
            n = self.num_blocks
            pool = self.pool
            hashed_free = sum(1 for b in pool.free_queue if pool.block_hash[b] is not None)
            state["retention"] = {
                "uniform": True, "parked": [], "priority": [self.retention.default_priority] * n,
                "duration_s": [None] * n, "pinned": [], "pinned_keys": sorted(self.pins.keys),
                "levels": {self.retention.default_priority: hashed_free} if hashed_free else {},
            }
            return
        state["retention"] = {
            "uniform": False,
            "parked": queue.parked(),
            "priority": list(queue.priority),
            "duration_s": list(queue.duration_s),
            "pinned": [b for b in range(self.num_blocks) if queue.pinned[b]],
            "pinned_keys": sorted(self.pins.keys),
            "levels": queue.level_counts(),
        }

    def check_invariants(self) -> None:
        """The queue's and the pin table's checks, and: a hashed block is marked pinned
        iff its primary key is pinned. O(num_blocks)."""
        self.pins.check_invariants()
        queue = self._pq
        if queue is None:
            assert not self.pins.keys, "uniform mode with pinned keys"
            assert not self._quotas_on, "uniform mode with tenant quotas"
            return
        pool = self.pool
        assert pool.free_queue is queue, "the pool's free queue is not its retention queue"
        for b in range(1, self.num_blocks):
            h = pool.block_hash[b]
            holders = self.pins.keys.get((pool.block_group[b], h)) if h is not None else None
            assert bool(queue.pinned[b]) == bool(holders), (
                f"block {b}: pinned mark {bool(queue.pinned[b])}, key pinned {bool(holders)}"
            )
            assert not holders or queue.pinned[b] is holders, (
                f"block {b}: its pin mark is not its key's leases")
