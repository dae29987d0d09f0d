"""Full attention (and MLA, sinks): every block is kept; a hit is the longest run of cached
blocks from the start, stopping at the first miss.

When the group's block is k > 1 hash blocks long (a hybrid model hashing at a finer unit),
the prompt's last hash boundary inside a block is also registered, as a partial entry on
the block holding it (vLLM 0.33's ``_cache_partial_tail_block``): boundary
``min((num_prompt_tokens - 1) // hbs, len(block_hashes)) * hbs`` (``num_prompt_tokens``
with ``drop_last_hit``), once it is within the registered tokens and not block aligned.
Worked case (block 32, hash block 8, 100-token prompt, 96 tokens registered): boundary 96
is aligned, nothing; a 90-token prompt: boundary 88 -> block 2 gets the hash of tokens
0..87.

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
from pagedkv.request import RequestLike
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

    def cache_blocks(self, request: RequestLike, request_id: str, num_tokens: int) -> None:
        """Full blocks as usual, then the prompt's tail boundary as a partial entry when
        this group's block spans several hash blocks (module docstring)."""
        super().cache_blocks(request, request_id, num_tokens)
        if self.hash_stride == 1:
            return
        hbs = self.pool.hash_block_size
        limit = request.num_prompt_tokens - (0 if self.drop_last_hit else 1)
        boundary = min(limit // hbs, len(request.block_hashes)) * hbs
        if not boundary or boundary > num_tokens or not boundary % self.block_size:
            return
        blocks = self.req_to_blocks[request_id]
        i = boundary // self.block_size
        if i < len(blocks):
            self.pool.cache_partial_block(request, blocks[i], boundary, self.group)

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        ref = self.pool.ref_cnt
        n = 0
        for b in self.req_to_blocks.get(request_id, ()):
            if ref[b] != num_running_requests:
                break
            n += 1
        return n
