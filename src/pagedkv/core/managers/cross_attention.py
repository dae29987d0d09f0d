"""Cross attention (encoder-decoder): KV of the encoder output, sized by the encoder length.

The blocks are allocated once, on the first ``allocate_slots`` that passes
``num_encoder_tokens`` (``ceil(num_encoder_tokens / block_size)`` blocks), and held until the
request is freed. They are never registered in the prefix index and never hit: encoder
outputs are per request (an audio clip, an image), and the block hashes cover decoder tokens
only. For the same reason a model with a cross-attention group gets no prefix hit at all
(its decoder KV depends on the encoder input, which the hashes do not see); the hybrid
coordinator treats such a group as "never hits".

Worked case (block size 16, Whisper's 1500 encoder tokens): ceil(1500 / 16) = 94 blocks on
the first allocation; later calls with ``num_encoder_tokens=0`` allocate nothing.

>>> from pagedkv.core.pool import BlockPool
>>> from pagedkv.core.specs import CrossAttentionSpec
>>> spec = CrossAttentionSpec(block_size=16, max_encoder_len=1500, num_kv_heads=1,
...                           head_size=8, dtype_bytes=2)
>>> m = CrossAttentionManager(spec, BlockPool(200, hash_block_size=16), 0)
>>> m.get_num_blocks_to_allocate("r", m.slots_needed(1, 1500), [])
94
"""

from __future__ import annotations

from pagedkv.core.managers.base import SingleTypeManager, register_manager
from pagedkv.core.pool import BlockPool
from pagedkv.core.specs import CrossAttentionSpec
from pagedkv.errors import InvalidArgumentError

__all__ = ["CrossAttentionManager"]


@register_manager(CrossAttentionSpec)
class CrossAttentionManager(SingleTypeManager):
    """Encoder-output blocks: allocated once, never cached."""

    positional = False
    cacheable = False
    hit_shape = "never"
    grows_plainly = False  # sized by the encoder tokens

    def __init__(
        self, spec: CrossAttentionSpec, pool: BlockPool, group: int, *, drop_last_hit: bool = False
    ) -> None:
        super().__init__(spec, pool, group, drop_last_hit=drop_last_hit)
        self.max_encoder_len = spec.max_encoder_len

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """Always a miss. Does not modify any state. O(1)."""
        return []

    def slots_needed(self, num_tokens: int, num_encoder_tokens: int) -> int:
        """The encoder length, not the decoder length.

        Raises:
            InvalidArgumentError: ``num_encoder_tokens`` exceeds the spec's
                ``max_encoder_len`` (the planner sized the pool for at most that).
        """
        if num_encoder_tokens > self.max_encoder_len:
            raise InvalidArgumentError(
                f"group {self.group}: num_encoder_tokens={num_encoder_tokens} exceeds "
                f"max_encoder_len={self.max_encoder_len} of the cross-attention spec; "
                "truncate the encoder input or plan with a larger max_encoder_len"
            )
        return num_encoder_tokens

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed: list[int],
        total_computed_tokens: int = 0,
    ) -> int:
        """Blocks still missing for ``num_tokens`` encoder slots (never negative). O(1)."""
        held = self.req_to_blocks.get(request_id)
        return max(0, -(-num_tokens // self.block_size) - (len(held) if held else 0))
