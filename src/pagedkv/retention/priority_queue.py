"""The retention free queue: one LRU list per priority level, unhashed blocks first.

Eviction order, front first (what :meth:`PriorityFreeQueue.popleft_n` takes)::

    unhashed | over quota | level 0 | level 1 | ... | level 100 | pinned (preempt_pins only)

Every list is LRU (least recently freed first); unhashed blocks keep vLLM's rule (a freed
unhashed block goes to the front). Free pinned blocks are *parked* outside the order and
not counted in ``num_free`` unless ``preempt_pins`` (then they form the last list).

Per block the queue keeps what decides where it goes when it is freed: its priority and
duration (set by the request that released it, see
:class:`~pagedkv.retention.policy.RequestRetention`), its tenant (for quotas) and whether
its content is pinned. A block taken from the queue (a new allocation) forgets them.

Costs: ``remove``, ``append_n``/``prepend_n`` per block and ``popleft_n`` per block are
O(1) plus O(log levels) to find the lowest non-empty level (a bit mask); processing
expiries costs O(1) per expired block plus O(distinct (priority, duration) pairs in use)
to find the next one. Nothing scans the pool.

With no retention asked for (every block at the default level, no pins, no quotas), the
order is exactly the base queue's (vLLM's), except that a free block whose hash is
dropped by ``evict_blocks`` moves to the back of the unhashed blocks.
"""

from __future__ import annotations

from collections.abc import Callable

from pagedkv.retention.policy import DEFAULT_PRIORITY
from pagedkv.retention.queue_lists import _LEVEL0, _OVER, _PARKED, _PINNED, _UNHASHED, LevelLists
from pagedkv.retention.queue_timers import TimedQuotaLists

__all__ = ["LevelLists", "PriorityFreeQueue", "TimedQuotaLists"]

_INF = float("inf")


class PriorityFreeQueue(TimedQuotaLists):
    """Free block ids of ``[1, num_blocks)`` in retention order (module docstring).

    ``num_free`` counts evictable blocks (parked pinned blocks excluded). Reading it, and
    every operation that depends on the order, first lets expired durations and pin leases
    take effect (``on_deadline``, called with the clock's time once it passes
    ``deadline``) whenever they could change its result (see :meth:`expiries_move_blocks`;
    an expiry that could not is applied at the next tick, with the same effect, since
    expiries are processed at their own times).

    Layers: :class:`~pagedkv.retention.queue_lists.LevelLists` (the lists),
    :class:`~pagedkv.retention.queue_timers.TimedQuotaLists` (the clock, durations, tenant
    quotas), this class (the per-block marks; what goes where, taking and freeing).
    """

    __slots__ = (
        "default_priority", "duration_s", "num_parked", "pinned", "plain", "preempt_pins",
        "priority", "tenant",
    )

    def __init__(
        self,
        num_blocks: int,
        *,
        clock: Callable[[], float],
        default_priority: int = DEFAULT_PRIORITY,
        preempt_pins: bool = False,
        tenant_quotas: list[int | None] | None = None,
    ) -> None:
        super().__init__(num_blocks, clock, tenant_quotas)
        n = num_blocks
        self.num_parked = 0
        self.default_priority = default_priority
        self.preempt_pins = preempt_pins
        self.priority = [default_priority] * n
        self.duration_s: list[float | None] = [None] * n
        self.tenant = [-1] * n
        #: Per block: False, or while its content is pinned a truthy mark its owner
        #: chooses (the pool stores the list of leases holding the block's key, so a
        #: hit finds them without a lookup).
        self.pinned: list[object] = [False] * n
        #: True while no block has been pinned, given a duration or a tenant quota (set
        #: False by the pool, for good): freeing then only sorts blocks by priority.
        self.plain = not tenant_quotas

    @classmethod
    def adopt(
        cls,
        order: list[int],
        hashed: list[bool],
        num_blocks: int,
        *,
        clock: Callable[[], float],
        default_priority: int = DEFAULT_PRIORITY,
        preempt_pins: bool = False,
    ) -> PriorityFreeQueue:
        """A queue holding the free ids ``order`` (vLLM's single list, front first):
        unhashed ones (``hashed[b]`` false) form the unhashed list, the others the
        default level, each keeping its relative order. The eviction order is unchanged
        except that blocks that lost their hash in place (``evict_blocks``) now go
        before every hashed block. O(num_blocks), once: how a retention pool leaves its
        uniform mode (see :class:`~pagedkv.retention.eviction.RetentionPolicy`).

        >>> q = PriorityFreeQueue.adopt([3, 1, 2], [False, True, False, False], 4,
        ...                             clock=lambda: 0.0)
        >>> list(q), q.num_free, q.level_counts()
        ([3, 2, 1], 3, {35: 1})
        """
        q = cls(num_blocks, clock=clock, default_priority=default_priority,
                preempt_pins=preempt_pins)
        q._adopt_order(order, hashed, default_priority)
        return q

    # ------------------------------------------------------------------ counts

    # ``num_free``: the ``_num_free`` slot itself (bound below the class) while no block
    # is parked; :class:`ParkingFreeQueue` reads the clock first.

    # ------------------------------------------------------------------ placing

    def _place(self, b: int) -> None:
        """Queue a hashed block that just became free (or unpinned)."""
        if self.pinned[b]:
            if self.preempt_pins:
                self._link_back(_PINNED, b)
                self._num_free += 1
            else:
                self._link_back(_PARKED, b)
                self.num_parked += 1
                if self.num_parked == 1:
                    self.__class__ = ParkingFreeQueue
            return
        p = self.priority[b]
        self._link_back(_LEVEL0 + p, b)
        self._mask |= 1 << p
        self._num_free += 1
        d = self.duration_s[b]
        if d is not None and p != self.default_priority:
            self._start_timer(b, p, d)
        t = self.tenant[b]
        if t >= 0:
            q = self._quota[t]
            if q is not None:
                self._add_to_tenant(t, p, b, q)

    # ------------------------------------------------------------------ queue API

    def remove(self, b: int) -> None:
        """Take free ``b`` out of the queue (a prefix hit claims it). O(1)."""
        if self._xkey or self._tkey:
            lst = self._detach(b)
        else:  # no timed or tenant lists: the common case, inlined
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
        if lst == _PARKED:
            self.num_parked -= 1
            if not self.num_parked:
                self.__class__ = PriorityFreeQueue
        else:
            self._num_free -= 1

    def append_n(self, ids: list[int]) -> None:
        """Queue freed hashed blocks by their priority (pinned ones parked). O(len)."""
        if not ids:
            return
        if self.plain:  # no timers, pins or quotas: the time does not matter
            if self.deadline != _INF:
                self.tick()
            self._append_by_level(ids, self.priority)
            return
        # Due expiries first if they could move a free block; otherwise they can wait
        # until the first pinned, timed or tenant-tracked block (its timer starts now, and
        # a lease that ended must not park it): an expiry never makes a block special.
        ticked = self.deadline != _INF and self.expiries_move_blocks()
        if ticked:
            self.tick()
        prio, dur, tenant, pinned = self.priority, self.duration_s, self.tenant, self.pinned
        # Tenant marks exist only once a tenant is registered: until then the check
        # does not read them (one array less per block).
        quotas = bool(self._quota)
        nxt, prv, where, count = self._next, self._prev, self._where, self._count
        base = self._n
        mask = self._mask
        placed = 0
        i, m = 0, len(ids)
        while i < m:
            b = ids[i]
            if pinned[b] or dur[b] is not None or (quotas and tenant[b] >= 0):
                self._mask = mask
                self._num_free += placed
                placed = 0
                if not ticked:
                    self.tick()
                    ticked = True
                self._place(b)
                mask = self._mask
                i += 1
                continue
            # Common case, inlined: the run of plain blocks of level p from here is
            # spliced to the back of the level as one chain.
            p = prio[b]
            lst = _LEVEL0 + p
            tail = base + 2 * lst + 1
            last = prv[tail]
            j = i
            while j < m:
                b = ids[j]
                if (prio[b] != p or pinned[b] or dur[b] is not None
                        or (quotas and tenant[b] >= 0)):
                    break
                nxt[last] = b
                prv[b] = last
                where[b] = lst
                last = b
                j += 1
            nxt[last] = tail
            prv[tail] = last
            count[lst] += j - i
            mask |= 1 << p
            placed += j - i
            i = j
        self._mask = mask
        self._num_free += placed

    def append(self, b: int) -> None:
        """Queue one freed hashed block. O(1)."""
        self.append_n([b])

    def popleft(self) -> int:
        """Take the first block in eviction order. Precondition: ``num_free >= 1``."""
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[int]:
        """Take the ``n`` first blocks in eviction order; they forget their retention.

        Precondition: ``n <= num_free``. O(n + log levels per level visited).
        """
        count, nxt, prv, where = self._count, self._next, self._prev, self._where
        if count[_UNHASHED] >= n:
            # Unhashed blocks only (the common decode step): no expiry moves one (they
            # go to levels), none is pinned, timed or tenant-tracked.
            head = self._n
            out = [0] * n
            b = nxt[head]
            prio, dur = self.priority, self.duration_s
            default = self.default_priority
            for i in range(n):
                out[i] = b
                where[b] = -1
                prio[b] = default
                dur[b] = None
                b = nxt[b]
            nxt[head] = b
            prv[b] = head
            count[_UNHASHED] -= n
            self._num_free -= n
            return out
        # Due expiries first if they could move a free block (expiries_move_blocks,
        # inlined).
        if self.deadline != _INF and (self._xlists.size or self.num_parked
                                      or count[_PINNED]):
            self.tick()
        out = []
        base = self._n
        prio, dur, pinned = self.priority, self.duration_s, self.pinned
        default = self.default_priority
        # Without timed or tenant lists holding blocks, a taken block forgets its
        # priority and duration as it is taken (one pass); otherwise those lists are
        # left first (they read the priority and tenant), in a second pass.
        listed = self._xlists.size or self._tenant_lists.size
        left = n
        while left:
            # The first non-empty list in eviction order (module docstring).
            if count[_UNHASHED]:
                lst = _UNHASHED
            elif count[_OVER]:
                lst = _OVER
            elif self._mask:
                m = self._mask
                lst = _LEVEL0 + (m & -m).bit_length() - 1
            elif count[_PINNED]:
                lst = _PINNED
            else:
                raise AssertionError(f"popleft_n({n}) with {self._num_free} free")
            c = count[lst]
            head = base + 2 * lst
            b = nxt[head]
            k = c if c < left else left
            if listed:
                for _ in range(k):
                    out.append(b)
                    where[b] = -1
                    b = nxt[b]
            else:
                for _ in range(k):
                    out.append(b)
                    where[b] = -1
                    prio[b] = default
                    dur[b] = None
                    b = nxt[b]
            nxt[head] = b
            prv[b] = head
            count[lst] = c - k
            left -= k
            if lst >= _LEVEL0 and c == k:
                self._mask &= ~(1 << (lst - _LEVEL0))
            elif lst == _PINNED:  # only blocks of this list carry a pin mark
                for b in out[-k:]:
                    pinned[b] = False
        self._num_free -= n
        if listed or self._quota:
            self._forget_taken(out, listed)
        # else no tenant registered: every tenant mark is already -1
        return out

    def _forget_taken(self, out: list[int], listed: int) -> None:
        """Blocks ``popleft_n`` took forget their tenant and, when timed or tenant lists
        hold blocks (``listed``), leave those lists and forget priority and duration."""
        tenant = self.tenant
        if listed:  # some taken block may be timed or tenant-listed
            prio, dur = self.priority, self.duration_s
            default = self.default_priority
            xw, tw = self._xlists.where, self._tenant_lists.where
            for b in out:
                if xw[b] != -1:
                    self._xlists.remove(b)
                if tw[b] != -1:
                    self._untenant(b)  # before the resets: it reads priority and tenant
                prio[b] = default
                dur[b] = None
                tenant[b] = -1
        else:
            for b in out:
                tenant[b] = -1

    # ------------------------------------------------------------------ retention moves

    def set_pinned(self, b: int, pinned: object) -> None:
        """Mark ``b``'s content pinned (``pinned`` not False: the mark, see ``pinned``)
        or not (False); a free block moves accordingly. A mark is tested by identity
        with False here: the pool's mark, the key's list of leases, is already empty
        when the pool unpins the key's blocks. O(1)."""
        if (self.pinned[b] is not False) == (pinned is not False):
            self.pinned[b] = pinned
            return
        self.plain = False
        lst = self._where[b]
        if lst == -1:
            self.pinned[b] = pinned
            return
        self.remove(b)
        self.pinned[b] = pinned
        self._place(b)

    def make_unhashed(self, b: int) -> None:
        """``b`` lost its hash (explicit eviction): forget its retention; if free, move it
        to the back of the unhashed blocks. O(1)."""
        lst = self._where[b]
        if lst != -1 and lst != _UNHASHED:
            self.remove(b)
            self._link_back(_UNHASHED, b)
            self._num_free += 1
        self.priority[b] = self.default_priority
        self.duration_s[b] = None
        self.tenant[b] = -1
        self.pinned[b] = False

    def rebuild_unhashed(self) -> None:
        """Every free block (parked ones too) becomes unhashed, keeping eviction order.
        For ``reset_prefix_cache``. O(free blocks)."""
        order = self.check_invariants()
        for b in order:
            self._detach(b)
        self.num_parked = 0
        self.__class__ = PriorityFreeQueue
        self._num_free = 0
        for b in order:
            self.make_unhashed(b)
            self._link_back(_UNHASHED, b)
            self._num_free += 1

    # ------------------------------------------------------------------ checks

    def check_invariants(self) -> list[int]:
        """Walk every list; returns all free ids (evictable in order, then parked). O(n)."""
        order = list(self)
        parked = self.parked()
        every = order + parked
        assert len(order) == self._num_free, (
            f"retention queue: num_free {self._num_free}, order holds {len(order)}"
        )
        assert len(parked) == self.num_parked, "retention queue: parked count wrong"
        assert (type(self) is ParkingFreeQueue) == bool(self.num_parked), (
            f"retention queue: class {type(self).__name__} with {self.num_parked} parked")
        assert len(set(every)) == len(every), "retention queue: an id appears twice"
        self._check_lists()
        for lst in range(len(self._count)):
            for b in self._list_items(lst):
                if lst >= _LEVEL0:
                    assert self.priority[b] == lst - _LEVEL0, f"block {b} in wrong level"
                    assert not self.pinned[b], f"pinned block {b} in a level list"
                if lst in (_PARKED, _PINNED):
                    assert self.pinned[b], f"unpinned block {b} parked"
                elif lst in (_UNHASHED, _OVER):
                    assert not self.pinned[b], f"pinned block {b} in list {lst}"
                if lst == _UNHASHED:
                    assert self.tenant[b] == -1, f"unhashed block {b} has a tenant"
        assert not self.preempt_pins or not parked, "parked blocks with preempt_pins"
        self._check_timers_and_quotas()
        if self.plain:
            assert not any(self.pinned) and not any(t >= 0 for t in self.tenant), (
                "plain queue with pinned or tenant-tracked blocks")
            assert all(d is None for d in self.duration_s), "plain queue with durations"
        return every


# While no block is parked no expiry can change the count of evictable blocks (a duration
# expiry moves a block between levels, a lease ending only clears marks of blocks in
# use), so ``num_free`` is the ``_num_free`` slot itself: the capacity check of every
# allocation reads it as cheaply as the base queue's attribute.
# (setattr: the base declares ``num_free`` an int attribute, this is its descriptor.)
setattr(PriorityFreeQueue, "num_free", LevelLists.__dict__["_num_free"])  # noqa: B010


class ParkingFreeQueue(PriorityFreeQueue):
    """The class of a :class:`PriorityFreeQueue` while free pinned blocks are parked: a
    lease ending makes them evictable, so reading ``num_free`` first lets due expiries
    take effect. A queue switches class when its first block is parked and back when
    the last one leaves (the state is the same; only ``num_free`` differs)."""

    __slots__ = ()

    @property
    def num_free(self) -> int:
        """Evictable free blocks, after letting due expiries take effect."""
        if self._clock() >= self.deadline:
            self.tick()
        return self._num_free

    @num_free.setter
    def num_free(self, value: int) -> None:
        self._num_free = value
