"""Kinds whose requests stop needing their oldest blocks as they advance (sliding window,
chunked local attention, Mamba states): the shared rule that nulls out and frees them.
"""

from __future__ import annotations

from typing import ClassVar

from pagedkv.core.managers.base import SingleTypeManager

__all__ = ["SkippingManager"]


class SkippingManager(SingleTypeManager):
    """Kinds whose requests stop needing their oldest blocks as they advance: sliding
    window, chunked local attention, Mamba state checkpoints.

    A subclass says how many leading tokens a request with ``c`` computed tokens will never
    read again (:meth:`num_skipped_tokens`); every block lying wholly inside that prefix is
    replaced in the table by the null block (0) and freed. A block table therefore always
    reads ``[0, ..., 0, real, ..., real]``: the nulls form a prefix, so the scans below stop
    at the first null from the right.

    Worked case (sliding window 8, block size 4, 13 computed tokens): the next token (13)
    reads tokens 6..13, so tokens 0..5 are skipped: 6 // 4 = 1 block -> table
    ``[0, b1, b2, b3]``; block 1 (tokens 4..7) stays because tokens 6 and 7 are still read.
    """

    drops_blocks: ClassVar[bool] = True

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens no future token reads once ``num_computed_tokens`` are computed."""
        raise NotImplementedError

    def max_hit_nulls(self, num_hit_tokens: int) -> int:
        """The blocks wholly inside the skipped prefix of ``num_hit_tokens`` tokens."""
        return self.num_skipped_tokens(num_hit_tokens) // self.block_size

    def _num_skipped_blocks(self, num_computed_tokens: int) -> int:
        return self.num_skipped_tokens(num_computed_tokens) // self.block_size

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Null out and free (deepest first) the blocks wholly inside the skipped prefix.
        O(blocks newly skipped)."""
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        end = self.num_skipped_tokens(num_computed_tokens) // self.block_size
        if end > len(blocks):
            end = len(blocks)
        if end <= 0 or not blocks[end - 1]:
            return  # nothing newly skipped (the nulls form a prefix)
        self._release_leading(blocks, end)

    def _release_leading(self, blocks: list[int], end: int) -> None:
        """Null out and free (deepest first) the real blocks before position ``end``."""
        freed: list[int] = []
        for i in range(end - 1, -1, -1):
            b = blocks[i]
            if not b:
                break
            freed.append(b)
            blocks[i] = 0
        if freed:
            self.pool.free_blocks(freed)

    def claimed_hit_blocks(self, new_computed: list[int], total_computed_tokens: int) -> list[int]:
        """The hit blocks still inside the window once ``total_computed_tokens`` (hit plus
        external tokens) are computed; those before it are never claimed."""
        skipped = self._num_skipped_blocks(total_computed_tokens)
        return new_computed[skipped:] if skipped else new_computed

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed: list[int],
        total_computed_tokens: int = 0,
    ) -> int:
        """As the base rule, except that for a new request the skipped leading positions
        (``num_skipped_tokens(total_computed_tokens) // block_size``) become null blocks,
        not new ones, and skipped hit blocks are not claimed.

        Worked case (window 8, block 4): a new request with a 2-block hit ``[0, b1]`` and
        8 external tokens (16 computed) needing 20 slots: 9 tokens skipped -> 2 null
        positions; ceil(20 / 4) - max(2, 2) = 3 new blocks, plus 1 if b1 is free (ref 0).
        """
        held = self.req_to_blocks.get(request_id)
        num_required = -(-num_tokens // self.block_size)
        if held is not None:
            return max(0, num_required - len(held) - len(new_computed))
        skipped = self._num_skipped_blocks(total_computed_tokens)
        n = max(0, num_required - max(len(new_computed), skipped))
        ref = self.pool.ref_cnt
        for b in new_computed[skipped:]:
            if b and ref[b] == 0:
                n += 1
        return n

    def save_new_computed_blocks(
        self, request_id: str, new_computed: list[int], total_computed_tokens: int
    ) -> None:
        """Start a new request's table: null blocks for the skipped positions, then the
        claimed hit blocks (see :meth:`claimed_hit_blocks`)."""
        if request_id in self.req_to_blocks:
            return
        skipped = self._num_skipped_blocks(total_computed_tokens)
        if skipped:
            table = [0] * skipped
            table.extend(new_computed[skipped:])
        else:
            table = list(new_computed)
        self.req_to_blocks[request_id] = table
        self.num_cached_blocks[request_id] = len(table)

    def check_invariants(self) -> None:
        """The base checks, plus: the null blocks of every table form a prefix."""
        super().check_invariants()
        for rid, blocks in self.req_to_blocks.items():
            seen_real = False
            for b in blocks:
                if b:
                    seen_real = True
                else:
                    assert not seen_real, (
                        f"group {self.group}: {rid} has a null block after a real one"
                    )
