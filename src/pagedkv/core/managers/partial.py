"""What a kind serving sub-block ("partial") prefix hits gives the partial-hit coordinator
(:class:`pagedkv.core.coordinator.PartialHitCoordinator`).

A model gets sub-block hits when :func:`pagedkv.core.partial_hits.partial_hits_enabled`
says so; each of its groups is then served by its kind's ``partial_hit_class`` (when it has
one). Such a class derives from :class:`PartialHitManager` as well as its kind's base: the
coordinator finds the groups that look up inside their blocks, count and adopt a copy
block, and queue ``(source, copy)`` pairs through this interface alone, so it never names a
kind.
"""

from __future__ import annotations

from typing import ClassVar

from pagedkv.core.managers.base import SingleTypeManager

__all__ = ["PartialHitManager"]


class PartialHitManager(SingleTypeManager):
    """The sub-block hit interface (module docstring). A concrete class sets
    ``pending_copies`` to an empty list in its ``__init__``."""

    #: Whether the copy block an allocation takes for a sub-block hit is recorded as a new
    #: block (:meth:`pagedkv.KVCacheManager.take_new_block_ids`) even when the group is not
    #: zeroing (vLLM 0.33 records a full-attention copy block always).
    records_copy_block: ClassVar[bool] = False
    #: (source, copy) pairs queued since the last take, in allocation order.
    pending_copies: list[tuple[int, int]]

    def enable_partial_hits(self) -> None:
        """The coordinator serves sub-block hits for this group's model (called once, at
        construction). Default: nothing to switch."""

    def find_partial_hit(self, block_hashes: list[bytes], max_length: int) -> tuple[list[int], int]:
        """The hit blocks within ``max_length`` tokens and the hit length in tokens (a
        multiple of the hash block size; it may end inside the last block). No state
        change."""
        raise NotImplementedError

    def count_partial(self, new_computed: list[int], num_local_computed_tokens: int) -> int:
        """The copy blocks adopting ``new_computed`` needs beyond the base count (1 for a
        hit ending inside a block, else 0). No state change."""
        raise NotImplementedError

    def adopt_partial_hit(
        self, request_id: str, new_computed: list[int], num_local_computed_tokens: int
    ) -> None:
        """After the hit blocks joined the request's table: remember a hit ending inside
        its last block for the copy at the next allocation."""
        raise NotImplementedError

    def partial_head_problem(self, block_hashes: list[bytes], head: list[int]) -> str | None:
        """Why ``head``, the blocks of a sub-block hit before the block it ends in, cannot
        be adopted (None: it can); the base check of a block-aligned hit by default. No
        state change."""
        return self.hit_problem(block_hashes, head, len(head) * self.block_size)
