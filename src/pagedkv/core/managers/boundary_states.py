"""Mamba boundary states handed to a KV connector (vLLM 0.33's boundary-state offloads).

An align-mode Mamba group registers a request's state at block boundaries (and, with
sub-block hits, at the prompt's last hash boundary). A connector that offloads prefixes
must copy those states by their exact block ids: the state a boundary needs is not found
by position in the request's table (the table keeps only the live state and the last
one). :class:`BoundaryStateOffloads` records, per Mamba group, as vLLM's ``MambaManager``
does:

* every state the group registers: ``(request, group, block, (k + 1) * block_size)`` for
  table position ``k``;
* a *producer tail*: the state a request registered itself inside a block (a sub-block
  boundary); its next allocation moves the cache entry to a copy block, which is recorded
  then (``(request, group, copy, boundary)``), since the request overwrites its own block;
* at the request's end (:meth:`finalize`), a producer tail still in its block is valid
  only when nothing was computed past the boundary (no token in flight).

Records are drained by :meth:`take` (once per scheduler step, by
:meth:`pagedkv.KVCacheManager.take_boundary_state_offloads`); a request freed before the
drain loses its records (its blocks go back to the pool). The blocks are not held: a
reader that copies them later must hold them itself.

Worked case (full attention 16 + Mamba 16, group 1): a first chunk of 32 tokens leaves
the Mamba table ``[0, b]``; ``b`` is registered as the state after 32 tokens: record
``(r, 1, b, 32)``. A chunk of 40 tokens instead leaves ``[0, 0, b]`` and records nothing
(the full positions 0 and 1 are null; ``b`` is not full).
"""

from __future__ import annotations

from collections.abc import Container

__all__ = ["BoundaryOffload", "BoundaryStateOffloads"]

#: ``(request_id, group, block_id, boundary_tokens)``.
BoundaryOffload = tuple[str, int, int, int]


class BoundaryStateOffloads:
    """One Mamba group's boundary-state records (module docstring). O(1) per record."""

    __slots__ = ("_tails", "group", "pending")

    def __init__(self, group: int) -> None:
        self.group = group
        #: Records since the last :meth:`take`, in the order the states were registered.
        self.pending: list[BoundaryOffload] = []
        #: Producer tails: request -> (block, boundary tokens).
        self._tails: dict[str, tuple[int, int]] = {}

    def committed(self, request_id: str, block_id: int, boundary_tokens: int) -> None:
        """The group registered ``block_id`` as the state after ``boundary_tokens``."""
        self.pending.append((request_id, self.group, block_id, boundary_tokens))

    def producer_tail(self, request_id: str, block_id: int, boundary_tokens: int) -> None:
        """The request registered its own state inside ``block_id`` (sub-block)."""
        self._tails[request_id] = (block_id, boundary_tokens)

    def tail_copied(self, request_id: str, source_id: int, copy_id: int) -> None:
        """The request's allocation moved its cache entry from ``source_id`` to
        ``copy_id``: a producer tail in ``source_id`` is recorded as ``copy_id``."""
        tail = self._tails.pop(request_id, None)
        if tail is not None:
            assert tail[0] == source_id, "a producer tail moves from its own block"
            self.pending.append((request_id, self.group, copy_id, tail[1]))

    def finalize(self, request_id: str, num_computed_tokens: int,
                 num_in_flight_tokens: int) -> tuple[int, int, int] | None:
        """At the request's end: its producer tail ``(group, block, boundary)`` when the
        block still holds it (exactly the boundary computed, nothing in flight), else
        None; the tail is forgotten either way."""
        tail = self._tails.pop(request_id, None)
        if tail is None or num_in_flight_tokens or num_computed_tokens != tail[1]:
            return None
        return self.group, tail[0], tail[1]

    def forget(self, request_id: str) -> None:
        """The request's blocks go back to the pool: drop its tail and its records."""
        self._tails.pop(request_id, None)
        if any(r[0] == request_id for r in self.pending):
            self.pending = [r for r in self.pending if r[0] != request_id]

    def check_invariants(self, live: Container[str]) -> None:
        """Every record and producer tail belongs to a request in ``live`` (those
        holding blocks): a freed request's are dropped. O(records)."""
        for rid, group, _block, num_tokens in self.pending:
            assert rid in live, f"group {group}: a record of freed request {rid}"
            assert num_tokens > 0, f"group {group}: a record at {num_tokens} tokens"
        for rid in self._tails:
            assert rid in live, f"group {self.group}: a producer tail of freed request {rid}"

    def take(self) -> list[BoundaryOffload]:
        """The records since the last take, oldest first; clears them."""
        out, self.pending = self.pending, []
        return out
