"""Pins with leases: which prefix-index keys are pinned, until when, and the pin budget.

A pin is a statement about *content*: the keys ``(group, block hash)`` of a prefix. While a
key is pinned, a block registered under it is not evicted (see
:class:`~pagedkv.retention.eviction.RetentionPolicy`); a key pinned before its block is computed
is honoured once it is. Every pin is a :class:`PinLease` with a finite time to live
(SGLang's unbounded TTL pins were reverted for starving the pool); the lease ends at its
expiry, on :meth:`PinTable.release`, or is pushed back on a hit when ``refresh_on_hit``.

The budget caps the number of distinct pinned keys; :meth:`PinTable.pin` refuses a lease
that would pass it, changing nothing.

>>> table = PinTable(budget_keys=2)
>>> lease, new = table.pin([(0, b"a"), (0, b"b")], ttl_s=10.0, now=0.0, refresh_on_hit=False)
>>> sorted(new), table.next_expiry()
([(0, b'a'), (0, b'b')], 10.0)
>>> table.pin([(0, b"c")], ttl_s=5.0, now=1.0, refresh_on_hit=False)
Traceback (most recent call last):
...
pagedkv.errors.PinBudgetError: pinning 1 more prefix blocks would make 3 pinned, ...
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pagedkv.arg_types import MAX_SECONDS
from pagedkv.errors import InvalidArgumentError, PinBudgetError

__all__ = ["PinKey", "PinLease", "PinTable"]

#: ``(group, block hash)``: a prefix-index key.
PinKey = tuple[int, bytes]


@dataclass(slots=True, eq=False)
class PinLease:
    """One pin: its keys, time to live and current expiry (seconds on the retention clock).

    ``active`` turns False when the lease ends (expiry or unpin).
    """

    lease_id: int
    keys: tuple[PinKey, ...]
    ttl_s: float
    expires_at: float
    refresh_on_hit: bool
    active: bool = True


class PinTable:
    """Pinned keys and their leases; a heap of leases by expiry (lazy on refresh).

    Costs: :meth:`pin` / :meth:`release` O(keys of the lease); :meth:`refresh` O(leases
    holding the key); :meth:`pop_due` O(log leases) amortized.
    """

    __slots__ = ("_heap", "_next_id", "budget_keys", "by_group", "keys", "num_refreshing")

    def __init__(self, *, budget_keys: int) -> None:
        self.budget_keys = budget_keys
        #: Pinned key -> the active leases holding it.
        self.keys: dict[PinKey, list[PinLease]] = {}
        #: Group -> the pinned hashes of that group (``keys`` by group).
        self.by_group: dict[int, set[bytes]] = {}
        self._heap: list[tuple[float, int, PinLease]] = []
        self._next_id = 0
        #: Active leases with ``refresh_on_hit``.
        self.num_refreshing = 0

    def pin(
        self, keys: Sequence[PinKey], *, ttl_s: float, now: float, refresh_on_hit: bool
    ) -> tuple[PinLease, list[PinKey]]:
        """A new lease on ``keys`` expiring at ``now + ttl_s``; also returns the keys that
        were not pinned before (their blocks must now be held).

        Raises:
            InvalidArgumentError: ``ttl_s`` not positive and finite, or no keys.
            PinBudgetError: the distinct pinned keys would exceed the budget; nothing
                changed.
        """
        if (not isinstance(ttl_s, (int, float)) or isinstance(ttl_s, bool)
                or not 0 < ttl_s <= MAX_SECONDS):
            raise InvalidArgumentError(
                f"ttl_s must be a positive number of seconds up to 1e9, got {ttl_s!r}; pins are "
                "leases (an unbounded pin could hold the pool forever)"
            )
        unique = list(dict.fromkeys(keys))
        if not unique:
            raise InvalidArgumentError(
                "nothing to pin: no block hashes given (a prefix shorter than one block?)"
            )
        new = [k for k in unique if k not in self.keys]
        if len(self.keys) + len(new) > self.budget_keys:
            raise PinBudgetError(
                f"pinning {len(new)} more prefix blocks would make "
                f"{len(self.keys) + len(new)} pinned, over the pin budget of "
                f"{self.budget_keys} blocks (pin_budget_fraction of the pool); unpin "
                "something, shorten the prefix or raise RetentionConfig.pin_budget_fraction"
            )
        self._next_id += 1
        lease = PinLease(lease_id=self._next_id, keys=tuple(unique), ttl_s=float(ttl_s),
                         expires_at=now + ttl_s, refresh_on_hit=refresh_on_hit)
        for k in unique:
            self.keys.setdefault(k, []).append(lease)
        for g, h in new:
            self.by_group.setdefault(g, set()).add(h)
        heapq.heappush(self._heap, (lease.expires_at, lease.lease_id, lease))
        if refresh_on_hit:
            self.num_refreshing += 1
        return lease, new

    def release(self, lease: PinLease) -> list[PinKey]:
        """End ``lease`` (no-op if it already ended); returns the keys no lease holds any
        more. The heap entry goes lazily."""
        if not lease.active:
            return []
        lease.active = False
        if lease.refresh_on_hit:
            self.num_refreshing -= 1
        freed = []
        for k in lease.keys:
            holders = self.keys[k]
            holders.remove(lease)
            if not holders:
                del self.keys[k]
                freed.append(k)
                group = self.by_group[k[0]]
                group.discard(k[1])
                if not group:
                    del self.by_group[k[0]]
        return freed

    def renew(self, lease: PinLease, *, ttl_s: float, now: float) -> None:
        """Push ``lease``'s expiry to ``now + ttl_s`` (it becomes its new TTL).

        Raises:
            InvalidArgumentError: the lease has ended, or a bad ``ttl_s``.
        """
        if not lease.active:
            raise InvalidArgumentError(
                f"lease {lease.lease_id} has ended (expired or unpinned); pin again instead"
            )
        if (not isinstance(ttl_s, (int, float)) or isinstance(ttl_s, bool)
                or not 0 < ttl_s < math.inf):
            raise InvalidArgumentError(f"ttl_s must be positive and finite, got {ttl_s!r}")
        lease.ttl_s = float(ttl_s)
        expires = now + ttl_s
        if expires < lease.expires_at:
            heapq.heappush(self._heap, (expires, lease.lease_id, lease))
        lease.expires_at = expires

    def refresh(self, key: PinKey, now: float) -> None:
        """A hit on ``key``: its refresh-on-hit leases now expire ``ttl_s`` from ``now``."""
        for lease in self.keys.get(key, ()):
            if lease.refresh_on_hit:
                lease.expires_at = now + lease.ttl_s  # re-filed lazily (next_expiry)

    def refresh_holders(self, holders: list[PinLease], now: float) -> bool:
        """:meth:`refresh` of the key whose active leases are ``holders`` (``keys[key]``,
        which a pinned block's mark holds) when that refreshes every refresh-on-hit
        lease (the usual hit on one pinned prefix); returns whether it did, else changes
        nothing. O(leases holding the key)."""
        n = 0
        for lease in holders:
            if lease.refresh_on_hit:
                n += 1
        if n != self.num_refreshing:
            return False
        for lease in holders:
            if lease.refresh_on_hit:
                lease.expires_at = now + lease.ttl_s
        return True

    def refresh_keys(self, keys: Iterable[PinKey], now: float) -> None:
        """:meth:`refresh` for each of ``keys`` (a touch's pinned hits), in one call.
        Refreshing is idempotent, so it stops once every refresh-on-hit lease has been
        refreshed (usually after the first key). O(keys + leases holding them).

        >>> table = PinTable(budget_keys=4)
        >>> lease, _ = table.pin([(0, b"a"), (0, b"b")], ttl_s=10.0, now=0.0,
        ...                      refresh_on_hit=True)
        >>> table.refresh_keys([(0, b"a"), (0, b"b"), (0, b"x")], now=3.0)
        >>> lease.expires_at
        13.0
        """
        get = self.keys.get
        left = self.num_refreshing
        if left == 1:  # the common case: refreshed at its first key, no set needed
            for key in keys:
                for lease in get(key, ()):
                    if lease.refresh_on_hit:
                        lease.expires_at = now + lease.ttl_s
                        return
            return
        done: set[int] = set()
        for key in keys:
            for lease in get(key, ()):
                if lease.refresh_on_hit:
                    lease.expires_at = now + lease.ttl_s
                    if lease.lease_id not in done:
                        done.add(lease.lease_id)
                        left -= 1
                        if not left:
                            return

    def next_expiry(self) -> float:
        """The earliest expiry among active leases (``inf`` if none)."""
        heap = self._heap
        while heap:
            t, _, lease = heap[0]
            if not lease.active:
                heapq.heappop(heap)
            elif lease.expires_at != t:  # refreshed later (or renewed): re-file it
                heapq.heapreplace(heap, (lease.expires_at, lease.lease_id, lease))
            else:
                return t
        return math.inf

    def pop_due(self) -> PinLease:
        """Remove and return the lease at :meth:`next_expiry` (call that first)."""
        return heapq.heappop(self._heap)[2]

    def check_invariants(self) -> None:
        """Every key's leases are active and hold it; heap covers every active lease."""
        active = set()
        for k, holders in self.keys.items():
            assert holders, f"pinned key {k!r} without a lease"
            for lease in holders:
                assert lease.active and k in lease.keys, "pin table holds an ended lease"
                active.add(lease.lease_id)
        in_heap = {lease.lease_id for _, _, lease in self._heap if lease.active}
        assert active <= in_heap, "an active lease is missing from the expiry heap"
        assert len(self.keys) <= self.budget_keys, "pinned keys over the budget"
        by_group = {(g, h) for g, hashes in self.by_group.items() for h in hashes}
        assert by_group == set(self.keys), "pinned hashes by group disagree with the keys"
        assert all(self.by_group.values()), "an empty group of pinned hashes"
