"""Full attention (and MLA, sinks): every block is kept; a hit is the longest run of cached
blocks from the start, stopping at the first miss.

>>> from pagedkv import BlockHasher, Request
>>> from pagedkv.pool import BlockPool
>>> heads = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
>>> req = Request("a", list(range(17)), hasher=BlockHasher(4))   # 4 full blocks of 4
>>> pool = BlockPool(16, hash_block_size=4)
>>> ids = pool.get_new_blocks(4); pool.cache_full_blocks(req, ids, 0, 4, 0); ids
[1, 2, 3, 4]
>>> from pagedkv.specs import FullAttentionSpec
>>> m = FullAttentionManager(FullAttentionSpec(block_size=4, **heads), pool, 0)
>>> pool.evict_blocks([3])                       # cached: b1 b2 _ b4
>>> m.find_longest_cache_hit(req.block_hashes, 16)
[1, 2]
>>> m.find_longest_cache_hit(req.block_hashes, 7)    # at most 7 tokens: one block
[1]
"""

from __future__ import annotations

from pagedkv.managers.base import SingleTypeManager, register_manager
from pagedkv.specs import FullAttentionSpec

__all__ = ["FullAttentionManager"]


@register_manager(FullAttentionSpec)
class FullAttentionManager(SingleTypeManager):
    """Full attention: scan hashes left to right, stop at the first miss. Cost: one dict
    lookup per hit block plus one for the miss."""

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        hashes = self.group_hashes(block_hashes)
        get = self.pool.index[self.group].get
        out: list[int] = []
        for i in range(min(max_length // self.block_size, len(hashes))):
            b = get(hashes[i])
            if b is None:
                break
            out.append(b)
        if self.drop_last_hit and out:
            out.pop()
        return out

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        ref = self.pool.ref_cnt
        n = 0
        for b in self.req_to_blocks.get(request_id, ()):
            if ref[b] != num_running_requests:
                break
            n += 1
        return n
