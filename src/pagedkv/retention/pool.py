"""The block pool with retention control: a :class:`~pagedkv.pool.BlockPool` whose free
queue is a :class:`~pagedkv.retention.priority_queue.PriorityFreeQueue`, plus pins and
tenant quotas.

What the pool adds to the base pool's rules:

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

Complexity: every operation stays O(blocks it touches), plus O(log levels) per level
visited and O(1) per expiry; no operation scans the pool except ``reset_prefix_cache``
and the checks (as in the base pool).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pagedkv.events.recorder import EventRecorder, GroupInfo
from pagedkv.pool import BlockPool
from pagedkv.request import RequestLike
from pagedkv.retention.pins import PinKey, PinLease, PinTable
from pagedkv.retention.policy import RetentionConfig
from pagedkv.retention.priority_queue import PriorityFreeQueue

__all__ = ["RetentionPool"]

_INF = float("inf")


class RetentionPool(BlockPool):
    """A block pool evicting by retention (module docstring)."""

    free_queue: PriorityFreeQueue

    def __init__(
        self,
        num_blocks: int,
        *,
        retention: RetentionConfig,
        enable_caching: bool = True,
        hash_block_size: int,
        groups: Sequence[GroupInfo] = (),
        recorder: EventRecorder | None = None,
    ) -> None:
        super().__init__(num_blocks, enable_caching=enable_caching,
                         hash_block_size=hash_block_size, groups=groups, recorder=recorder)
        self.retention = retention
        self.free_queue = PriorityFreeQueue(
            num_blocks, clock=retention.clock, default_priority=retention.default_priority,
            preempt_pins=retention.preempt_pins,
        )
        self.free_queue.on_deadline = self._on_deadline
        #: Pinned keys and their leases.
        self.pins = PinTable(
            budget_keys=int(retention.pin_budget_fraction * (num_blocks - 1))
        )
        self._tenant_ids: dict[str | None, int] = {}
        self._quotas_on = retention.has_quotas
        if self._quotas_on:
            self.free_queue.plain = False

    # ------------------------------------------------------------------ tenants

    def tenant_id(self, salt: str | None) -> int:
        """The queue's id for tenant ``salt`` (registered with its quota on first use)."""
        t = self._tenant_ids.get(salt)
        if t is None:
            t = self._tenant_ids[salt] = self.free_queue.add_tenant(
                self.retention.quota_of(salt)
            )
        return t

    # ------------------------------------------------------------------ base hooks

    def touch(self, ids: Iterable[int]) -> None:
        """As the base pool; a hit on a pinned block also refreshes its refresh-on-hit
        leases. O(n)."""
        ref = self.ref_cnt
        queue = self.free_queue
        if queue.deadline != _INF:
            queue.tick()  # expiries first, so they happen in time order
        remove = queue.remove
        if not self.pins.num_refreshing:
            for b in ids:
                if b:
                    if ref[b] == 0:
                        remove(b)
                    ref[b] += 1
            return
        pinned = queue.pinned
        hit_keys = []
        for b in ids:
            if b:
                if ref[b] == 0:
                    remove(b)
                ref[b] += 1
                if pinned[b]:
                    hit_keys.append(b)
        if hit_keys:
            now = queue.tick()
            bh, bg = self.block_hash, self.block_group
            refresh = self.pins.refresh
            for b in hit_keys:
                h = bh[b]
                assert h is not None
                refresh((bg[b], h), now)

    def cache_full_blocks(
        self,
        request: RequestLike,
        blocks: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        group: int,
        mask: Sequence[bool] | None = None,
    ) -> None:
        """As the base pool; newly registered blocks also learn their tenant and whether
        their key is pinned. O(num_full_blocks - num_cached_blocks)."""
        super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, group,
                                  mask)
        pins = self.pins.keys
        if not pins and not self._quotas_on:
            return
        queue = self.free_queue
        t = -1
        if self._quotas_on:
            extras = request.hash_extras
            t = self.tenant_id(extras.cache_salt if extras is not None else None)
        bh = self.block_hash
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            if b and bh[b] is not None and (mask is None or mask[i - num_cached_blocks]):
                queue.tenant[b] = t
                if pins and (group, bh[b]) in pins:
                    queue.pinned[b] = True

    def cache_partial_block(
        self, request: RequestLike, block: int, num_tokens: int, group: int
    ) -> bytes | None:
        """As the base pool; a block that got its primary key here learns its tenant and
        pin as in :meth:`cache_full_blocks`."""
        h = super().cache_partial_block(request, block, num_tokens, group)
        if h is not None and self.block_hash[block] == h and self.block_group[block] == group:
            queue = self.free_queue
            if self._quotas_on:
                extras = request.hash_extras
                queue.tenant[block] = self.tenant_id(
                    extras.cache_salt if extras is not None else None)
            if (group, h) in self.pins.keys:
                queue.pinned[block] = True
        return h

    def evict_blocks(self, ids: Iterable[int]) -> None:
        """As the base pool; a free block losing its hash moves to the back of the
        unhashed blocks (it can never be hit again)."""
        queue = self.free_queue
        if queue.deadline != _INF:
            queue.tick()
        super().evict_blocks(ids)

    def _evict(self, b: int, *, count: bool = True) -> None:
        super()._evict(b, count=count)
        self.free_queue.make_unhashed(b)

    def reset_prefix_cache(self) -> bool:
        """As the base pool (only when no block is in use; parked pinned blocks are free);
        pins stay (they name content), their blocks lose them with their hashes."""
        queue = self.free_queue
        if queue.num_free + queue.num_parked != self.num_blocks - 1:
            return False
        queue.rebuild_unhashed()
        return super().reset_prefix_cache()

    # ------------------------------------------------------------------ pins

    def _blocks_of(self, key: PinKey) -> list[int]:
        """Blocks whose primary key is ``key`` (primary and duplicates). O(duplicates)."""
        g, h = key
        out = []
        primary = self.index[g].get(h)
        if primary is not None:
            out.append(primary)
            out.extend(self._dups[g].get(h, ()))
        bh, bg = self.block_hash, self.block_group
        return [b for b in out if bh[b] == h and bg[b] == g]

    def pin(self, keys: Sequence[PinKey], *, ttl_s: float, refresh_on_hit: bool) -> PinLease:
        """Pin ``keys`` for ``ttl_s`` seconds; their cached blocks are held from now on.

        Raises:
            PinBudgetError: over the pin budget; nothing changed.
            InvalidArgumentError: a bad ``ttl_s`` or no keys; nothing changed.
        """
        queue = self.free_queue
        now = queue.tick()
        lease, new = self.pins.pin(keys, ttl_s=ttl_s, now=now, refresh_on_hit=refresh_on_hit)
        queue.plain = False
        for key in new:
            for b in self._blocks_of(key):
                queue.set_pinned(b, True)
        queue.deadline = min(queue.deadline, lease.expires_at)
        return lease

    def unpin(self, lease: PinLease) -> None:
        """End ``lease`` now (no-op if it ended); keys no other lease holds are released."""
        self.free_queue.tick()
        self._release(lease)

    def renew(self, lease: PinLease, *, ttl_s: float) -> None:
        """Make ``lease`` expire ``ttl_s`` seconds from now (see :meth:`PinTable.renew`)."""
        queue = self.free_queue
        self.pins.renew(lease, ttl_s=ttl_s, now=queue.tick())
        queue.deadline = min(queue.deadline, lease.expires_at)

    def _release(self, lease: PinLease) -> None:
        queue = self.free_queue
        for key in self.pins.release(lease):
            for b in self._blocks_of(key):
                queue.set_pinned(b, False)

    def _on_deadline(self, now: float) -> None:
        """Let every lease expiry and duration revert due by ``now`` happen, earliest
        first, then arm the queue for the next one."""
        queue = self.free_queue
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

    def debug_state(self) -> dict[str, Any]:
        """The base pool's state plus the retention state."""
        state = super().debug_state()
        queue = self.free_queue
        state["retention"] = {
            "parked": queue.parked(),
            "priority": list(queue.priority),
            "duration_s": list(queue.duration_s),
            "pinned": [b for b in range(self.num_blocks) if queue.pinned[b]],
            "pinned_keys": sorted(self.pins.keys),
            "levels": queue.level_counts(),
        }
        return state

    def check_invariants(self) -> None:
        """The base checks, the queue's, the pin table's, and: a hashed block is marked
        pinned iff its primary key is pinned. O(num_blocks)."""
        super().check_invariants()
        self.pins.check_invariants()
        queue = self.free_queue
        for b in range(1, self.num_blocks):
            h = self.block_hash[b]
            want = h is not None and (self.block_group[b], h) in self.pins.keys
            assert queue.pinned[b] == want, (
                f"block {b}: pinned mark {queue.pinned[b]}, key pinned {want}"
            )
