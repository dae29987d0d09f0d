"""Many intrusive doubly linked lists over block ids, sharing two int arrays.

Lists are created on demand (:meth:`LinkedLists.new_list`), each with a head and a tail
sentinel appended to the arrays, so a block can sit in at most one list of one
:class:`LinkedLists` at a time (``where[b]`` is the head of its list, or -1). Every
operation is O(1); no node objects exist.

>>> ll = LinkedLists(5)
>>> a, b = ll.new_list(), ll.new_list()
>>> for x in (3, 1, 4):
...     ll.append(a, x)
>>> ll.remove(1); ll.append(b, 1)
>>> ll.items(a), ll.items(b), ll.front(a), ll.length(a), ll.size
([3, 4], [1], 3, 2, 3)
"""

from __future__ import annotations

__all__ = ["LinkedLists"]


class LinkedLists:
    """Lists over ids ``[0, num_ids)``; sentinels live at indexes ``>= num_ids``."""

    __slots__ = ("_lengths", "next", "num_ids", "prev", "size", "where")

    def __init__(self, num_ids: int) -> None:
        self.num_ids = num_ids
        self.next: list[int] = [-1] * num_ids
        self.prev: list[int] = [-1] * num_ids
        #: Head sentinel of the list holding each id, -1 when in none.
        self.where: list[int] = [-1] * num_ids
        self._lengths: dict[int, int] = {}
        #: Ids in some list (all lists together).
        self.size = 0

    def new_list(self) -> int:
        """A new empty list; returns its head sentinel (its id). O(1) amortized."""
        head = len(self.next)
        self.next += [head + 1, -1]
        self.prev += [-1, head]
        self._lengths[head] = 0
        return head

    def append(self, head: int, b: int) -> None:
        """Put ``b`` (in no list) at the back of list ``head``. O(1)."""
        tail = head + 1
        last = self.prev[tail]
        self.next[last] = b
        self.prev[b] = last
        self.next[b] = tail
        self.prev[tail] = b
        self.where[b] = head
        self._lengths[head] += 1
        self.size += 1

    def remove(self, b: int) -> None:
        """Unlink ``b`` from its list. Precondition: it is in one. O(1)."""
        p = self.prev[b]
        q = self.next[b]
        self.next[p] = q
        self.prev[q] = p
        self._lengths[self.where[b]] -= 1
        self.where[b] = -1
        self.size -= 1

    def front(self, head: int) -> int | None:
        """The first id of list ``head``, or None when it is empty. O(1)."""
        b = self.next[head]
        return None if b == head + 1 else b

    def length(self, head: int) -> int:
        """Number of ids in list ``head``. O(1)."""
        return self._lengths[head]

    def items(self, head: int) -> list[int]:
        """Ids of list ``head``, front first. O(length)."""
        out = []
        b = self.next[head]
        while b != head + 1:
            out.append(b)
            b = self.next[b]
        return out

    def check_invariants(self) -> None:
        """Walk every list; links, membership and lengths agree. O(ids + lists)."""
        seen = 0
        for head, n in self._lengths.items():
            p, b, count = head, self.next[head], 0
            while b != head + 1:
                assert 0 <= b < self.num_ids, f"list {head} holds invalid id {b}"
                assert self.prev[b] == p, f"list {head}: prev[{b}] is {self.prev[b]}, not {p}"
                assert self.where[b] == head, f"id {b} in list {head}, where says {self.where[b]}"
                count += 1
                assert count <= self.num_ids, f"list {head}: cycle"
                p, b = b, self.next[b]
            assert self.prev[head + 1] == p, f"list {head}: tail link broken"
            assert count == n, f"list {head}: length {n}, holds {count}"
            seen += count
        members = sum(1 for w in self.where if w != -1)
        assert members == seen, f"{members} ids claim a list, lists hold {seen}"
        assert self.size == seen, f"size is {self.size}, lists hold {seen}"
