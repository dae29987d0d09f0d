"""Chunked local attention (Llama 4): a token reads only the tokens of its own chunk of
``c`` tokens (chunk ``k`` is tokens ``k*c .. k*c + c - 1``).

Skipped prefix: with ``t`` tokens computed the next token (index ``t``) is in the chunk
starting at ``t // c * c``; every earlier token is never read again.

Lookup within ``max_length`` = ``m`` tokens: the next token is token ``m``, its chunk
starts at ``s = m // c * c``. Blocks before ``s`` count as hit without any lookup (null
blocks); blocks from ``s`` on are looked up left to right, stopping at the first miss.

Worked cases (chunk 8, block size 4):

* ``m`` = 15: s = 8, so blocks 0 and 1 (tokens 0..7) are null; block 2 (tokens 8..11) is
  looked up: hit ``b`` -> ``[0, 0, b]`` (12 tokens), miss -> ``[0, 0]`` (8 tokens). Block 3
  (tokens 12..15) is not full within 15 tokens, so it is never looked up.
* ``m`` = 16: s = 16, every one of the 4 blocks is before the chunk -> ``[0, 0, 0, 0]``.

Run (chunk 8, block 4; block ids 1..4 cached for tokens 0..15):

>>> from pagedkv import BlockHasher, Request
>>> from pagedkv.core.pool import BlockPool
>>> heads = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
>>> req = Request("a", list(range(17)), hasher=BlockHasher(4))   # 4 full blocks of 4
>>> pool = BlockPool(16, hash_block_size=4)
>>> ids = pool.get_new_blocks(4); pool.cache_full_blocks(req, ids, 0, 4, 0); ids
[1, 2, 3, 4]
>>> from pagedkv.core.specs import ChunkedLocalAttentionSpec
>>> spec = ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **heads)
>>> m = ChunkedLocalManager(spec, pool, 0)
>>> m.find_longest_cache_hit(req.block_hashes, 15), m.find_longest_cache_hit(req.block_hashes, 16)
([0, 0, 3], [0, 0, 0, 0])

Speculative decoding (``drop_last_hit``): the hit must end before a block that was looked
up and matched, so the rule becomes: the longest run of cached blocks starting at a chunk
start, minus its last block; chunks are tried from the one holding token ``m`` backwards.
Same example, chunk 8, block 4, ``m`` = 16 with blocks 2 and 3 cached: chunk start 16 has
no block within 16 tokens, chunk start 8 has the run ``b2 b3`` -> ``[0, 0, b2]`` (12).

The chunk size must be a multiple of the block size (so chunk starts are block starts).

Admission: the current chunk plus one scheduling step plus one block of misalignment
(``ChunkedLocalAttentionSpec.max_admission_blocks``).
"""

from __future__ import annotations

from pagedkv.core.kernels import kernels
from pagedkv.core.managers.base import register_manager
from pagedkv.core.managers.skipping import SkippingManager
from pagedkv.core.pool import BlockPool
from pagedkv.core.specs import ChunkedLocalAttentionSpec, cdiv
from pagedkv.errors import InvalidArgumentError

__all__ = ["ChunkedLocalManager"]


@register_manager(ChunkedLocalAttentionSpec)
class ChunkedLocalManager(SkippingManager):
    """Chunked-local groups. No cascade attention (leading blocks are null)."""

    hit_shape = "chunk"

    def __init__(
        self,
        spec: ChunkedLocalAttentionSpec,
        pool: BlockPool,
        group: int,
        *,
        drop_last_hit: bool = False,
    ) -> None:
        super().__init__(spec, pool, group, drop_last_hit=drop_last_hit)
        chunk = spec.attention_chunk_size
        if chunk % spec.block_size:
            raise InvalidArgumentError(
                f"group {group}: attention_chunk_size {chunk} is not a multiple of the block "
                f"size {spec.block_size}; choose a block size that divides the chunk size"
            )
        self.attention_chunk_size = chunk
        self.chunk_blocks = chunk // spec.block_size
        self._chunk_hit = kernels().chunk_hit  # compiled or pure, picked once

    def admission_cap_blocks(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """vLLM 0.33's runtime cap: the chunk plus the tokens in flight (the planner's
        bound keeps one block more). Chunk 64, block 16, 32 in flight: 6 blocks."""
        return cdiv(min(self.attention_chunk_size + max_in_flight_tokens, max_model_len),
                    self.block_size)

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """``t // c * c``: chunk 8, 13 computed -> 8; 8 computed -> 8; 7 computed -> 0."""
        c = self.attention_chunk_size
        return num_computed_tokens // c * c

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """As :meth:`SkippingManager.remove_skipped_blocks` (NOTE: the skipped prefix
        inlined: this runs on every allocation of every request)."""
        end = num_computed_tokens // self.attention_chunk_size * self.chunk_blocks
        if end <= 0:
            return
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        if end > len(blocks):
            end = len(blocks)
        if blocks[end - 1]:
            self._release_leading(blocks, end)

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """Nulls up to the chunk of token ``max_length``, then cached blocks left to right
        (module docstring). Does not modify any state. O(blocks of one chunk) lookups;
        with ``drop_last_hit`` at worst one lookup per earlier chunk as well."""
        chunk_start_block = max_length // self.attention_chunk_size * self.chunk_blocks
        if not self.drop_last_hit:  # the kernel (kernels_hybrid.chunk_hit)
            if type(block_hashes) is not list:
                block_hashes = list(block_hashes)
            k = self.hash_stride
            return self._chunk_hit(
                self.pool.index[self.group], block_hashes, k, chunk_start_block,
                min(max_length // self.block_size, len(block_hashes) // k))
        hashes = self.group_hashes(block_hashes)
        num_blocks = min(max_length // self.block_size, len(hashes))
        get = self.pool.index[self.group].get
        while True:
            end = min(num_blocks, chunk_start_block + self.chunk_blocks)
            run: list[int] = []
            for i in range(chunk_start_block, end):
                b = get(hashes[i])
                if b is None:
                    break
                run.append(b)
            if run:
                run.pop()
                out = [0] * chunk_start_block
                out.extend(run)
                return out
            if chunk_start_block == 0:
                return []
            chunk_start_block -= self.chunk_blocks
