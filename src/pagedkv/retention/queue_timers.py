"""Durations and tenant quotas of the retention free queue: the side lists that say when a
free block's priority ends and which tenant's blocks are over its quota.

* Timed lists: one per ``(level, duration)`` in use, FIFO, which is expiry order (every
  block of a list got the same duration); the earliest expiry is the earliest front, found
  in O(distinct pairs). ``deadline`` is the next time anything expires.
* Tenant lists: one per ``(tenant, level)`` for tenants with a quota, LRU; bit ``p`` of
  ``_tmask[t]`` is set iff tenant ``t`` has free blocks at level ``p``. A tenant over its
  quota loses its lowest-priority, least recently freed block to the over-quota list
  (evicted right after unhashed blocks).

:class:`TimedQuotaLists` sits between :class:`~pagedkv.retention.queue_lists.LevelLists`
and :class:`~pagedkv.retention.priority_queue.PriorityFreeQueue`, which decides when a
block enters these lists (:meth:`PriorityFreeQueue._place`).
"""

from __future__ import annotations

from collections.abc import Callable

from pagedkv.retention.linked import LinkedLists
from pagedkv.retention.policy import read_clock
from pagedkv.retention.queue_lists import _LEVEL0, _OVER, _PINNED, LevelLists

__all__ = ["TimedQuotaLists"]


class TimedQuotaLists(LevelLists):
    """The timed and tenant lists and the clock (module docstring). The per-block marks
    it reads (``priority``, ``duration_s``, ``tenant``) are the concrete queue's."""

    __slots__ = (
        "_clock", "_quota", "_tcount", "_tenant_lists", "_tkey", "_tmask", "_xkey",
        "_xlists", "deadline", "expires_at", "now_s", "on_deadline",
    )
    priority: list[int]
    duration_s: list[float | None]
    tenant: list[int]
    default_priority: int
    num_parked: int

    def __init__(
        self, num_blocks: int, clock: Callable[[], float],
        tenant_quotas: list[int | None] | None,
    ) -> None:
        super().__init__(num_blocks)
        n = num_blocks
        self._clock = clock
        #: The time timers start from: the clock at the last tick (or the time of the
        #: expiry being processed).
        self.now_s = 0.0
        self.deadline = float("inf")
        self.on_deadline: Callable[[float], None] = self._expire_durations
        # Timed lists: one per (level, duration), FIFO = expiry order.
        self.expires_at = [0.0] * n
        self._xlists = LinkedLists(n)
        self._xkey: dict[tuple[int, float], int] = {}
        # Tenant lists: one per (tenant, level) for tenants with a quota.
        self._quota: list[int | None] = list(tenant_quotas or [])
        self._tenant_lists = LinkedLists(n)
        self._tkey: dict[tuple[int, int], int] = {}
        self._tmask: list[int] = [0] * len(self._quota)
        self._tcount: list[int] = [0] * len(self._quota)

    def _place(self, b: int) -> None:
        """Queue a hashed block that just became free (the concrete queue's rule)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ durations

    def expiries_move_blocks(self) -> bool:
        """Whether a due expiry could change the order of the free blocks: only while a
        free block has a duration (it would move to the default level) or a free block is
        pinned (a lease ending moves it into its level). Otherwise an expiry only clears
        the pin marks of blocks in use, and the operations that read those (placing a
        freed pinned block, a hit refreshing a lease) tick first themselves: operations
        that depend on the order tick first only when this holds. O(1).
        """
        return bool(self._xlists.size or self.num_parked or self._count[_PINNED])

    def tick(self) -> float:
        """Read the clock (:func:`~pagedkv.retention.policy.read_clock`: a reading before
        the last one counts as the last one); run ``on_deadline`` if it has passed the
        deadline. Returns now."""
        now = read_clock(self._clock, self.now_s)
        self.now_s = now
        if now >= self.deadline:
            self.on_deadline(now)
        return now

    def _start_timer(self, b: int, p: int, duration_s: float) -> None:
        """Free ``b`` (at level ``p``) keeps its level for ``duration_s`` from now."""
        key = (p, duration_s)
        head = self._xkey.get(key)
        if head is None:
            head = self._xkey[key] = self._xlists.new_list()
        expires = self.now_s + duration_s
        self.expires_at[b] = expires
        self._xlists.append(head, b)
        if expires < self.deadline:
            self.deadline = expires

    def next_duration_expiry(self) -> tuple[float, int]:
        """``(time, list)`` of the earliest pending duration expiry, ``(inf, -1)`` if
        none. O(distinct (priority, duration) pairs)."""
        best, best_head = float("inf"), -1
        xl = self._xlists
        for head in self._xkey.values():
            b = xl.front(head)
            if b is not None and self.expires_at[b] < best:
                best, best_head = self.expires_at[b], head
        return best, best_head

    def expire_front(self, head: int) -> None:
        """The front block of timed list ``head`` reverts to the default priority: it moves
        to the back of the default level (as TensorRT-LLM does). O(1)."""
        b = self._xlists.front(head)
        assert b is not None
        self.remove(b)
        self.priority[b] = self.default_priority
        self.duration_s[b] = None
        self._place(b)

    def _expire_durations(self, now: float) -> None:
        """Default deadline handler (no pins): revert every duration due by ``now``."""
        while True:
            t, head = self.next_duration_expiry()
            if t > now:
                self.deadline = t
                return
            self.expire_front(head)

    # ------------------------------------------------------------------ tenants

    def add_tenant(self, quota: int | None) -> int:
        """Register a tenant with ``quota`` blocks (None: unlimited); returns its id."""
        self._quota.append(quota)
        self._tmask.append(0)
        self._tcount.append(0)
        return len(self._quota) - 1

    def _untenant(self, b: int) -> None:
        tl = self._tenant_lists
        head = tl.where[b]
        tl.remove(b)
        t = self.tenant[b]
        self._tcount[t] -= 1
        if not tl.length(head):
            self._tmask[t] &= ~(1 << self.priority[b])

    def _add_to_tenant(self, t: int, p: int, b: int, quota: int) -> None:
        key = (t, p)
        head = self._tkey.get(key)
        if head is None:
            head = self._tkey[key] = self._tenant_lists.new_list()
        self._tenant_lists.append(head, b)
        self._tmask[t] |= 1 << p
        self._tcount[t] += 1
        while self._tcount[t] > quota:
            # Over quota: the tenant's lowest-priority, least recently freed block goes
            # to the over-quota list (evicted right after unhashed blocks).
            m = self._tmask[t]
            low = (m & -m).bit_length() - 1
            victim = self._tenant_lists.front(self._tkey[(t, low)])
            assert victim is not None
            self._detach(victim)
            self._link_back(_OVER, victim)

    # ------------------------------------------------------------------ lists

    def _detach(self, b: int) -> int:
        """Take queued ``b`` out of every list; returns the list it was in."""
        nxt, prv = self._next, self._prev
        p, q = prv[b], nxt[b]
        nxt[p] = q
        prv[q] = p
        lst = self._where[b]
        self._where[b] = -1
        c = self._count[lst] - 1
        self._count[lst] = c
        if lst >= _LEVEL0 and not c:
            self._mask &= ~(1 << (lst - _LEVEL0))
        if self._xlists.where[b] != -1:
            self._xlists.remove(b)
        if self._tenant_lists.where[b] != -1:
            self._untenant(b)
        return lst

    # ------------------------------------------------------------------ checks

    def _check_timers_and_quotas(self) -> None:
        """Assert the side lists are sound, hold free level blocks only, and no tenant
        is over its quota in the levels."""
        self._xlists.check_invariants()
        self._tenant_lists.check_invariants()
        for b in range(1, self._n):
            if self._xlists.where[b] != -1 or self._tenant_lists.where[b] != -1:
                assert self._where[b] >= _LEVEL0, f"block {b} timed/tenant-listed off-level"
        for t, q in enumerate(self._quota):
            assert q is None or self._tcount[t] <= q, f"tenant {t} over quota in levels"
