"""Hits group by group: each group's own longest hit, checked and cut per group.

A hybrid model's usual hit (:meth:`Coordinator.find_longest_cache_hit
<pagedkv.core.coordinator_base.Coordinator.find_longest_cache_hit>`) is one length every
group agrees on. Under block pressure the groups' own hits diverge: full attention's tail
blocks are evicted while a deeper Mamba state survives, or the other way round. vLLM
0.33 lets a KV connector that can restore the lagging groups' state
(``supports_divergent_local_hybrid_hits``) take the full-attention hit as the local one
(``KVCacheManager.get_computed_blocks_for_connector``); :func:`find_hit_per_group` is its
``find_longest_cache_hit_per_group``, and such a hit carries its per-group lengths
(``ComputedBlocks.group_tokens``) so that adoption checks each group at its own length
(:func:`group_hit_problem`).

Worked case (full attention 16 + Mamba 16, a 4-block prefix cached, full attention's
blocks 2, 3 and Mamba's 1, 2 evicted, an 80-token request): within 79 tokens full
attention hits ``[f0, f1]`` (32 tokens) and Mamba ``[0, 0, 0, m3]`` (64): ``(32, 64)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pagedkv.errors import InvalidArgumentError

__all__ = ["find_hit_per_group", "group_hit_problem", "truncate_hit"]


class _Group(Protocol):
    @property
    def block_size(self) -> int: ...
    @property
    def cacheable(self) -> bool: ...
    @property
    def drop_last_hit(self) -> bool: ...
    @property
    def hit_shape(self) -> str: ...
    @property
    def group(self) -> int: ...


class _Coordinator(Protocol):
    @property
    def managers(self) -> Sequence[Any]: ...
    @property
    def pool(self) -> Any: ...
    def find_group_hit(self, g: int, block_hashes: list[bytes], length: int
                       ) -> tuple[list[int], int]: ...
    def group_problem(self, g: int, block_hashes: list[bytes], blocks: list[int],
                      num_hit_tokens: int) -> str | None: ...


def find_hit_per_group(coordinator: _Coordinator, block_hashes: list[bytes], max_length: int
                       ) -> tuple[tuple[list[int], ...], tuple[int, ...]]:
    """Each caching group's own longest hit within ``max_length`` tokens, looked up
    independently of the others: block ids and length per group (``[]`` and 0 for a group
    that never hits). A group with the EAGLE drop that is not a state group looks one of
    its blocks further, up to the request's hashed tokens, and drops it (vLLM's margin).
    No state change. O(one scan per group)."""
    hits: list[list[int]] = []
    lengths: list[int] = []
    hashed = len(block_hashes) * coordinator.pool.hash_block_size
    for g, m in enumerate(coordinator.managers):
        if not m.cacheable:
            hits.append([])
            lengths.append(0)
            continue
        bound = max_length
        if m.drop_last_hit and m.hit_shape != "state":
            bound = min(max_length + m.block_size, hashed)
        blocks, n = coordinator.find_group_hit(g, block_hashes, bound)
        hits.append(blocks)
        lengths.append(n)
    return tuple(hits), tuple(lengths)


def group_hit_problem(coordinator: _Coordinator, block_hashes: list[bytes],
                      hit: tuple[list[int], ...], group_tokens: tuple[int, ...]) -> str | None:
    """Why ``hit`` cannot be adopted by a request with ``block_hashes``, group ``g``
    checked at ``group_tokens[g]`` tokens (``coordinator.group_problem``), or None. No
    state change. O(hit blocks)."""
    n = len(coordinator.managers)
    if type(hit) is not tuple or len(hit) != n or len(group_tokens) != n:
        return f"a hit has one block list per group ({n}), got {hit!r}"
    for g, blocks in enumerate(hit):
        if type(blocks) is not list:
            return f"group {g}: block ids come as a list, got {blocks!r}"
        why = coordinator.group_problem(g, block_hashes, blocks, group_tokens[g])
        if why is not None:
            return why
    return None


def truncate_hit(managers: Sequence[_Group], hit: tuple[list[int], ...], num_tokens: int
                 ) -> tuple[list[int], ...]:
    """``hit`` cut at ``num_tokens``: each caching group keeps its first
    ``num_tokens // block_size`` blocks (non-caching groups none). Block 4, hit
    ``[5, 6, 7]`` cut at 8 -> ``[5, 6]``. Pure slicing.

    Raises:
        InvalidArgumentError: ``num_tokens`` is not a multiple of a caching group's
            block size.
    """
    out: list[list[int]] = []
    for m, blocks in zip(managers, hit, strict=True):
        if not m.cacheable:
            out.append([])
            continue
        if num_tokens % m.block_size:
            raise InvalidArgumentError(
                f"cannot truncate a hit to {num_tokens} tokens: not a multiple of group "
                f"{m.group}'s block size {m.block_size}")
        out.append(list(blocks[: num_tokens // m.block_size]))
    return tuple(out)

