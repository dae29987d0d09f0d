"""A Mamba align group's running step and a request's free as kernels: the pure-Python
twins and specifications of ``mamba_release``, ``mamba_grow`` and ``free_groups``
(``pagedkv/_csrc/ccore_hybrid_step.h``).

:class:`~pagedkv.core.managers.mamba.MambaAlignManager` calls them (picked once, at its
construction) for its ``remove_skipped_blocks`` and, without a sub-block state to copy,
its ``allocate_new_blocks``; the compiled ``GroupsAllocate`` (``ccore_groups.h``) runs the
same C functions for a Mamba group inside a running request's step, without a Python
call. Both take the manager's per-request state as plain containers: ``table`` (the
request's block table), ``released`` (request -> table positions released so far),
``last_state`` (request -> position of its previous live state), ``allocated`` (requests
that had a successful allocation); and the pool's method as a callable.

Worked case (block size 4): a request at 9 tokens holds ``[0, 0, 7]``; its step to 13
tokens pads nothing and takes block 8 at position 3, remembering position 2 as its last
state; once 13 tokens are computed, position 2 (below ``ceil(13 / 4) - 1 = 3``) is freed.

>>> table, last, allocated = [0, 0, 7], {}, set()
>>> mamba_grow(table, last, allocated, "r", 13, 4, lambda n: [8] * n), table, last
([8], [0, 0, 7, 8], {'r': 2})
>>> freed = []
>>> mamba_release(table, {}, last, "r", 13, 4, freed.extend), table, freed
(None, [0, 0, 0, 8], [7])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FreeEntry", "free_groups", "mamba_grow", "mamba_release"]

#: One group's entry of :func:`free_groups`: its tables, its registered counts, the
#: per-request dicts and sets it forgets the request in.
FreeEntry = tuple[dict[str, list[int]], dict[str, int], tuple[dict[str, Any], ...],
                  tuple[set[str], ...]]


def mamba_release(table: list[int] | None, released: dict[str, int],
                  last_state: dict[str, int], request_id: str, num_computed_tokens: int,
                  block_size: int, free_blocks: Callable[[list[int]], Any]) -> None:
    """With ``c = num_computed_tokens`` computed: free (one ``free_blocks`` call, deepest
    first) the real blocks at positions ``released.get(request_id, 0) .. (c - 1) //
    block_size - 1`` (capped at the table's length), null them and record the new mark in
    ``released``; then free and null the last state ``last_state[request_id]`` when it is
    real and below the live position ``ceil(c / block_size) - 1``. ``table`` None: a
    no-op. Mutates ``table`` and ``released``; O(positions released).

    Raises:
        IndexError: the last state lies past the table (a broken manager).
    """
    if table is None:
        return
    c = num_computed_tokens
    last = (c - 1) // block_size if c > 1 else 0
    if last > len(table):
        last = len(table)
    first = released.get(request_id, 0) if last else 0
    if first < last:
        freed = []
        for i in range(last - 1, first - 1, -1):
            if table[i]:
                freed.append(table[i])
                table[i] = 0
        if freed:
            free_blocks(freed)
        released[request_id] = last
    k = last_state.get(request_id)
    if k is not None and k < -(-c // block_size) - 1 and table[k]:
        free_blocks([table[k]])
        table[k] = 0


def mamba_grow(table: list[int], last_state: dict[str, int], allocated: set[str],
               request_id: str, num_tokens: int, block_size: int,
               get_new_blocks: Callable[[int], list[int]]) -> list[int]:
    """Grow ``table`` to the live position ``ceil(num_tokens / block_size) - 1``: when it
    lies past the table, remember the previous live position in ``last_state``, pad with
    nulls and take the live block (one ``get_new_blocks`` call); returns the padding and
    the new block (``[]`` when the table reaches the position already). Adds
    ``request_id`` to ``allocated`` either way. Mutates ``table``, ``last_state`` and
    ``allocated``; O(padding)."""
    required = -(-num_tokens // block_size)
    prev = len(table)
    if required <= prev:
        allocated.add(request_id)
        return []
    if prev:
        last_state[request_id] = prev - 1
    if prev < required - 1:
        table.extend([0] * (required - 1 - prev))
    new = get_new_blocks(max(required - len(table), 0))
    out = table[prev:]
    table.extend(new)
    out.extend(new)
    allocated.add(request_id)
    return out


def free_groups(plan: list[FreeEntry], request_id: str,
                free_blocks: Callable[[list[int]], Any]) -> None:
    """:meth:`~pagedkv.core.coordinator_base.Coordinator.free` over groups that free by
    the base rule (:meth:`SingleTypeManager.free
    <pagedkv.core.managers.base.SingleTypeManager.free>`, Mamba align's after forgetting
    its per-request marks): per entry, in group order, drop the request from its dicts
    and sets, pop its table and count, and free the table's blocks last first (one
    ``free_blocks`` call per group holding blocks). An unknown id: a no-op. Mutates the
    entries' containers; O(blocks held).

    >>> freed = []
    >>> plan = [({"r": [1, 2]}, {"r": 2}, (), ()), ({"r": [0, 3]}, {}, ({"r": 1},), ({"r"},))]
    >>> free_groups(plan, "r", freed.append), freed, plan[1]
    (None, [[2, 1], [3, 0]], ({}, {}, ({},), (set(),)))
    """
    for tables, counts, forget, drop in plan:
        for d in forget:
            d.pop(request_id, None)
        for ids in drop:
            ids.discard(request_id)
        blocks = tables.pop(request_id, None)
        counts.pop(request_id, None)
        if blocks:
            blocks.reverse()
            free_blocks(blocks)
