"""What an engine may read about one block of the pool (:class:`BlockInfo`), for
schedulers that keep block objects of their own (vLLM's ``KVCacheBlock``)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BlockInfo"]


class BlockInfo(NamedTuple):
    """One block as :meth:`pagedkv.KVCacheManager.block_info` reports it.

    ``ref_cnt``: block tables and outside holders using it (0: free, maybe cached);
    ``block_hash``: the hash it is registered under in the prefix index, or ``None``;
    ``group``: the group it is registered for (meaningful only with a hash);
    ``is_null``: block 0, the placeholder of skipped positions.

    >>> BlockInfo(ref_cnt=1, block_hash=None, group=0, is_null=False).ref_cnt
    1
    """

    ref_cnt: int
    block_hash: bytes | None
    group: int
    is_null: bool
