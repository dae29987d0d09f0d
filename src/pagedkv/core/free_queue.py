"""The free-block queue: free block ids in eviction order.

Blocks are plain ints (their ids). The queue is an intrusive doubly linked list kept in two
int arrays, ``next`` and ``prev``, indexed by block id, with two sentinel slots past the last
block (``head`` and ``tail``). Every operation is O(1) per block it touches and allocates no
objects beyond the list it returns: no node objects exist at all, so building a pool of a
million blocks is two ``list(range(...))`` calls.

Order, front first (the front is evicted/reused first)::

    head <-> [unhashed freed blocks] <-> ... LRU cached ... <-> MRU cached <-> tail

The queue does not know *why* a block is where it is: the pool decides (SPEC 3.2): freed
blocks with a hash go to the back (``append_n``), freed blocks without one to the front
(``prepend_n``), and a prefix hit on a free cached block takes it out of the middle
(``remove``). Membership is tracked by the pool (a block is queued iff its ref count is 0).
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["FreeBlockQueue"]


class FreeBlockQueue:
    """Doubly linked list of block ids in ``[first_id, num_blocks)``.

    Initially holds every id from ``first_id`` up, in increasing order.
    """

    __slots__ = ("_head", "_next", "_prev", "_tail", "num_free")

    def __init__(self, num_blocks: int, *, first_id: int = 1) -> None:
        head, tail = num_blocks, num_blocks + 1
        # next[i] = i + 1 and prev[i] = i - 1 for the interior; fix the two ends.
        nxt = list(range(1, num_blocks + 3))
        prv = list(range(-1, num_blocks + 1))
        if first_id < num_blocks:
            nxt[head] = first_id
            prv[first_id] = head
            nxt[num_blocks - 1] = tail
            prv[tail] = num_blocks - 1
        else:
            nxt[head] = tail
            prv[tail] = head
        self._next = nxt
        self._prev = prv
        self._head = head
        self._tail = tail
        #: Number of ids in the queue.
        self.num_free = max(0, num_blocks - first_id)

    def popleft(self) -> int:
        """Remove and return the front id. Precondition: the queue is not empty. O(1)."""
        nxt = self._next
        head = self._head
        b = nxt[head]
        after = nxt[b]
        nxt[head] = after
        self._prev[after] = head
        self.num_free -= 1
        return b

    def popleft_n(self, n: int) -> list[int]:
        """Remove and return the ``n`` front ids, front first.

        Precondition: ``0 <= n <= num_free`` (the pool checks). O(n).
        """
        nxt = self._next
        out = [0] * n
        b = nxt[self._head]
        for i in range(n):
            out[i] = b
            b = nxt[b]
        nxt[self._head] = b
        self._prev[b] = self._head
        self.num_free -= n
        return out

    def remove(self, b: int) -> None:
        """Unlink ``b`` from anywhere in the queue. Precondition: ``b`` is queued. O(1)."""
        nxt = self._next
        prv = self._prev
        p = prv[b]
        q = nxt[b]
        nxt[p] = q
        prv[q] = p
        self.num_free -= 1

    def append(self, b: int) -> None:
        """Put ``b`` at the back. O(1)."""
        tail = self._tail
        last = self._prev[tail]
        self._next[last] = b
        self._prev[b] = last
        self._next[b] = tail
        self._prev[tail] = b
        self.num_free += 1

    def append_n(self, ids: list[int]) -> None:
        """Put ``ids`` at the back, keeping their order (``ids[0]`` is evicted first). O(n)."""
        if not ids:
            return
        nxt = self._next
        prv = self._prev
        tail = self._tail
        last = prv[tail]
        for b in ids:
            nxt[last] = b
            prv[b] = last
            last = b
        nxt[last] = tail
        prv[tail] = last
        self.num_free += len(ids)

    def prepend_n(self, ids: list[int]) -> None:
        """Put ``ids`` at the front, keeping their order (``ids[0]`` becomes the front). O(n)."""
        if not ids:
            return
        nxt = self._next
        prv = self._prev
        head = self._head
        first = nxt[head]
        prev_b = head
        for b in ids:
            nxt[prev_b] = b
            prv[b] = prev_b
            prev_b = b
        nxt[prev_b] = first
        prv[first] = prev_b
        self.num_free += len(ids)

    def __iter__(self) -> Iterator[int]:
        """Iterate ids front to back (O(n); for tests and snapshots, not the hot path)."""
        nxt = self._next
        b = nxt[self._head]
        tail = self._tail
        while b != tail:
            yield b
            b = nxt[b]

    def to_list(self) -> list[int]:
        """Ids front to back. O(n)."""
        return list(iter(self))

    def check_invariants(self) -> list[int]:
        """Walk the list both ways; assert the links agree and the count is right.

        Returns the ids front to back. O(n).
        """
        nxt, prv = self._next, self._prev
        seen: list[int] = []
        b = nxt[self._head]
        p = self._head
        limit = len(nxt)
        while b != self._tail:
            assert prv[b] == p, f"free queue: prev[{b}] is {prv[b]}, expected {p}"
            assert 0 <= b < self._head, f"free queue holds invalid id {b}"
            seen.append(b)
            assert len(seen) <= limit, "free queue: cycle"
            p, b = b, nxt[b]
        assert prv[self._tail] == p, "free queue: tail link broken"
        assert len(seen) == self.num_free, (
            f"free queue: num_free is {self.num_free}, list holds {len(seen)}"
        )
        assert len(set(seen)) == len(seen), "free queue: an id appears twice"
        return seen
