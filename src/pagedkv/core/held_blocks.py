"""References the engine holds outside block tables: blocks of requests popped for a
deferred free (vLLM 0.33's ``pop_blocks_for_free``) and the source and copy blocks of
sub-block hits (``take_kv_cache_block_copies``), until the engine releases them.

>>> from pagedkv.core.pool import BlockPool
>>> pool = BlockPool(6, hash_block_size=4)
>>> held = HeldBlocks(pool)
>>> blocks = pool.get_new_blocks(2)          # [1, 2], ref count 1 each
>>> held.hold(blocks); held.counts
{1: 1, 2: 1}
>>> held.release([2, 1]); held.counts, pool.free_queue.num_free
({}, 5)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pagedkv.core.pool import BlockPool
from pagedkv.errors import InvalidArgumentError

__all__ = ["BlockCopies", "BlockCopy", "HeldBlocks"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCopy:
    """Copy block ``src_block_id`` into ``dst_block_id`` (whole block) before the step runs."""

    src_block_id: int
    dst_block_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCopies:
    """The copies of one step and the blocks they keep referenced: release ``retained``
    with ``KVCacheManager.release_blocks`` once the copies ran."""

    copies: tuple[BlockCopy, ...] = ()
    retained: tuple[int, ...] = ()


NO_COPIES = BlockCopies()


class HeldBlocks:
    """Block id -> references held outside block tables (module docstring). O(blocks)
    per call."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        #: Block id -> references held (read-only for callers).
        self.counts: dict[int, int] = {}

    def hold(self, blocks: Sequence[int]) -> None:
        """One more reference held for each non-null block of ``blocks``."""
        counts = self.counts
        for b in blocks:
            if b:
                counts[b] = counts.get(b, 0) + 1

    def hold_copies(self, pairs: Sequence[tuple[int, int]]) -> BlockCopies:
        """Hold source and copy of each ``(src, dst)`` pair; the step's copies."""
        retained = [b for pair in pairs for b in pair]
        self.hold(retained)
        return BlockCopies(
            copies=tuple(BlockCopy(src_block_id=a, dst_block_id=b) for a, b in pairs),
            retained=tuple(retained),
        )

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one held reference to each of ``block_ids`` and free it in the pool, in the
        order given (the first is evicted first once free); null blocks skipped.

        Raises:
            InvalidArgumentError: not a list of ints, or an id not held (that many times);
                nothing is released.
        """
        kind = type(block_ids)
        if kind is not list and kind is not tuple and (  # tuple: take_block_copies' retained
                isinstance(block_ids, (str, bytes)) or not isinstance(block_ids, Sequence)):
            raise InvalidArgumentError(
                f"release_blocks takes a list of block ids, got {type(block_ids).__name__}"
            )
        counts = self.counts
        # Common case in one pass: every id an int held; undone and explained if not.
        taken: list[int] = []
        for b in block_ids:
            if type(b) is not int or b not in counts:
                if type(b) is int and b == 0:
                    continue
                break
            n = counts[b]
            if n == 1:
                del counts[b]
            else:
                counts[b] = n - 1
            taken.append(b)
        else:
            self.pool.free_blocks(block_ids)
            return
        self.hold(taken)
        self._release_checked(block_ids)

    def _release_checked(self, block_ids: Sequence[int]) -> None:
        counts = self.counts
        want = Counter(b for b in block_ids if not (type(b) is int and b == 0))
        for b, n in want.items():
            if type(b) is not int or counts.get(b, 0) < n:
                raise InvalidArgumentError(
                    f"release_blocks: block {b!r} is released {n} time(s) but held "
                    f"{counts.get(b, 0) if type(b) is int else 0} time(s) outside block "
                    "tables; release only blocks pop_blocks_for_free returned, once each"
                )
        for b, n in want.items():
            left = counts[b] - n
            if left:
                counts[b] = left
            else:
                del counts[b]
        self.pool.free_blocks(block_ids)
