"""The list layout under the retention free queue: one intrusive doubly linked list per
place a free block can be, over the base queue's two int arrays.

Lists, front of the eviction order first (``_LEVEL0 + p`` is priority level ``p``)::

    _UNHASHED | _OVER | _LEVEL0 .. _LEVEL0 + MAX_PRIORITY | _PINNED      (_PARKED: outside)

List ``L`` has its head sentinel at index ``n + 2 L`` and its tail at ``n + 2 L + 1``
(``n`` = number of block ids), so list 0 is the base queue's own list (its unhashed
blocks). Per block, ``_where[b]`` is the list holding it (-1: not free); per list,
``_count`` its length; bit ``p`` of ``_mask`` is set iff level ``p`` is non-empty, so
the lowest non-empty level is found in O(1).

:class:`LevelLists` is the base of
:class:`~pagedkv.retention.priority_queue.PriorityFreeQueue`: it links and walks lists;
what goes where (priorities, pins, durations, quotas) is decided above it.
"""

from __future__ import annotations

from collections.abc import Iterator

from pagedkv.core.free_queue import FreeBlockQueue
from pagedkv.retention.policy import MAX_PRIORITY

__all__ = ["LevelLists"]

_UNHASHED, _OVER, _PARKED, _PINNED, _LEVEL0 = 0, 1, 2, 3, 4
#: Every list in eviction order (the parked list is not in it).
_EVICTION_ORDER = (_UNHASHED, _OVER, *range(_LEVEL0, _LEVEL0 + MAX_PRIORITY + 1), _PINNED)


class LevelLists(FreeBlockQueue):
    """The lists of the module docstring over ids ``[1, num_blocks)``, all free blocks
    first in the unhashed list (as the base queue holds them)."""

    __slots__ = ("_count", "_mask", "_n", "_num_free", "_where")

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks, first_id=1)
        n = num_blocks
        self._n = n
        # Sentinel pairs after the base's unhashed (head n, tail n + 1): list L has head
        # n + 2 L. Lists: unhashed, over quota, parked, pinned, then one per level.
        num_lists = _LEVEL0 + MAX_PRIORITY + 1
        for lst in range(1, num_lists):
            h = n + 2 * lst
            self._next += [h + 1, -1]
            self._prev += [-1, h]
        self._count = [0] * num_lists
        self._count[_UNHASHED] = max(0, n - 1)
        self._where = [_UNHASHED] * n
        self._where[0] = -1
        self._mask = 0  # bit p set iff level p is non-empty

    def _adopt_order(self, order: list[int], hashed: list[bool], priority: int) -> None:
        """Hold exactly the free ids ``order`` (front first): the hashed ones at the back
        of level ``priority``, the others in the unhashed list, keeping their order."""
        n = self._n
        self._next[n], self._prev[n + 1] = n + 1, n  # empty the unhashed list
        self._count[_UNHASHED] = 0
        self._where = [-1] * n
        self._num_free = 0
        level = _LEVEL0 + priority
        for b in order:
            if hashed[b]:
                self._link_back(level, b)
                self._mask |= 1 << priority
            else:
                self._link_back(_UNHASHED, b)
        self._num_free = len(order)

    def level_counts(self) -> dict[int, int]:
        """Evictable blocks per priority level (non-empty levels only). O(levels)."""
        return {p: self._count[_LEVEL0 + p] for p in range(MAX_PRIORITY + 1)
                if self._count[_LEVEL0 + p]}

    def _link_back(self, lst: int, b: int) -> None:
        tail = self._n + 2 * lst + 1
        prv = self._prev
        last = prv[tail]
        self._next[last] = b
        prv[b] = last
        self._next[b] = tail
        prv[tail] = b
        self._where[b] = lst
        self._count[lst] += 1

    def prepend_n(self, ids: list[int]) -> None:
        """Put freed unhashed blocks at the very front, keeping their order. O(len)."""
        if not ids:
            return
        nxt, prv, where = self._next, self._prev, self._where
        head = self._head
        first = nxt[head]
        prev_b = head
        for b in ids:
            nxt[prev_b] = b
            prv[b] = prev_b
            where[b] = _UNHASHED
            prev_b = b
        nxt[prev_b] = first
        prv[first] = prev_b
        self._count[_UNHASHED] += len(ids)
        self._num_free += len(ids)

    def _append_by_level(self, ids: list[int], prio: list[int]) -> None:
        """Queue freed ``ids`` at the back of their levels (``prio[b]``): runs of equal
        priority are spliced as one chain (``append_n`` while no block is special)."""
        nxt, prv, where, count = self._next, self._prev, self._where, self._count
        base = self._n
        mask = self._mask
        i, m = 0, len(ids)
        while i < m:
            p = prio[ids[i]]
            lst = _LEVEL0 + p
            tail = base + 2 * lst + 1
            last = prv[tail]
            j = i
            while j < m:
                b = ids[j]
                if prio[b] != p:
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
            i = j
        self._mask = mask
        self._num_free += m

    # ------------------------------------------------------------------ inspection

    def _list_items(self, lst: int) -> list[int]:
        out = []
        head = self._n + 2 * lst
        b = self._next[head]
        while b != head + 1:
            out.append(b)
            b = self._next[b]
        return out

    def __iter__(self) -> Iterator[int]:
        """Evictable ids in eviction order (parked ones excluded). O(n)."""
        for lst in _EVICTION_ORDER:
            yield from self._list_items(lst)

    def parked(self) -> list[int]:
        """Free pinned blocks held out of the eviction order. O(parked)."""
        return self._list_items(_PARKED)

    def _check_lists(self) -> None:
        """Assert every list's count, its blocks' ``_where`` and the level mask agree."""
        for lst in range(len(self._count)):
            items = self._list_items(lst)
            assert len(items) == self._count[lst], f"list {lst}: count wrong"
            for b in items:
                assert self._where[b] == lst, f"block {b}: where is {self._where[b]}, in {lst}"
            if lst >= _LEVEL0:
                bit = bool(self._mask >> (lst - _LEVEL0) & 1)
                assert bit == bool(items), f"level {lst - _LEVEL0}: mask bit {bit}"
