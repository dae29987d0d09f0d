"""Full attention with attention sinks: learned sink tokens every query also attends to.

Lookup, caching and the token block table are exactly full attention's (the sink KV is the
same for every request, so it does not enter the block hashes). The sink KV itself needs
``ceil(sink_len / block_size)`` blocks of storage. vLLM keeps one shared copy in fixed
block ids that its attention backend prepends to every block table; a standalone manager
cannot rely on fixed ids of a shared pool, so here each request holds its own sink blocks
beside its table (:meth:`SinkFullAttentionManager.sink_block_ids`), taken on its first
allocation and freed with it. That is exactly what ``SinkFullAttentionSpec``'s admission
cap reserves per request: ``ceil(sink_len / block_size) + ceil(max_model_len / block_size)``.
The engine writes the sink KV into them once per request and puts them in front of the
table it passes to the kernel.

Worked case (block size 16, sink_len 20, 40-token prompt): 2 sink blocks + 3 token blocks
= 5 blocks of capacity on the first allocation.
"""

from __future__ import annotations

from collections.abc import Iterator

from pagedkv.core.managers.base import register_manager
from pagedkv.core.managers.full import FullAttentionManager
from pagedkv.core.pool import BlockPool
from pagedkv.core.specs import SinkFullAttentionSpec, cdiv

__all__ = ["SinkFullAttentionManager"]


@register_manager(SinkFullAttentionSpec)
class SinkFullAttentionManager(FullAttentionManager):
    """Full attention plus per-request sink blocks."""

    def __init__(
        self,
        spec: SinkFullAttentionSpec,
        pool: BlockPool,
        group: int,
        *,
        drop_last_hit: bool = False,
    ) -> None:
        super().__init__(spec, pool, group, drop_last_hit=drop_last_hit)
        self.num_sink_blocks = cdiv(spec.sink_len, spec.block_size)
        self.req_to_sink_blocks: dict[str, list[int]] = {}

    grows_plainly = False  # the sink blocks on a request's first allocation
    partial_hit_class = None  # its sink blocks take no sub-block hits (vLLM 0.33)

    def sink_block_ids(self, request_id: str) -> list[int]:
        """The request's sink blocks (a copy), empty before its first allocation."""
        return list(self.req_to_sink_blocks.get(request_id, ()))

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed: list[int],
        total_computed_tokens: int = 0,
    ) -> int:
        """Full attention's count, plus the sink blocks on a request's first allocation."""
        n = super().get_num_blocks_to_allocate(request_id, num_tokens, new_computed)
        if request_id not in self.req_to_sink_blocks:
            n += self.num_sink_blocks
        return n

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """Full attention's new table blocks; the sink blocks are taken (once) first and
        are not part of the returned list."""
        if request_id not in self.req_to_sink_blocks:
            self.req_to_sink_blocks[request_id] = self.pool.get_new_blocks(self.num_sink_blocks)
        return super().allocate_new_blocks(request_id, num_tokens)

    def free(self, request_id: str) -> None:
        """Free the table tail first, then the sink blocks."""
        super().free(request_id)
        sinks = self.req_to_sink_blocks.pop(request_id, None)
        if sinks:
            self.pool.free_blocks(sinks)

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """The sink blocks, then the table without its leading nulls (released last
        first, so the table tail goes first)."""
        out = self.req_to_sink_blocks.pop(request_id, [])
        out.extend(super().pop_blocks_for_free(request_id))
        return out

    def iter_held_blocks(self) -> Iterator[int]:
        yield from super().iter_held_blocks()
        for blocks in self.req_to_sink_blocks.values():
            yield from blocks

    def check_invariants(self) -> None:
        super().check_invariants()
        assert set(self.req_to_sink_blocks) <= set(self.req_to_blocks), (
            f"group {self.group}: sink blocks held for a request without a table"
        )
        for rid, blocks in self.req_to_sink_blocks.items():
            assert len(blocks) == self.num_sink_blocks, f"{rid}: {len(blocks)} sink blocks"
            for b in blocks:
                assert b and self.pool.ref_cnt[b] > 0, f"{rid}: sink block {b} not held"
