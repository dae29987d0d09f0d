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
>>> from pagedkv.core.pool import BlockPool
>>> heads = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
>>> req = Request("a", list(range(17)), hasher=BlockHasher(4))   # 4 full blocks of 4
>>> pool = BlockPool(16, hash_block_size=4)
>>> ids = pool.get_new_blocks(4); pool.cache_full_blocks(req, ids, 0, 4, 0); ids
[1, 2, 3, 4]
>>> from pagedkv.core.specs import FullAttentionSpec
>>> m = FullAttentionManager(FullAttentionSpec(block_size=4, **heads), pool, 0)
>>> pool.evict_blocks([3])                       # cached: b1 b2 _ b4
>>> m.find_longest_cache_hit(req.block_hashes, 16)
[1, 2]
>>> m.find_longest_cache_hit(req.block_hashes, 7)    # at most 7 tokens: one block
[1]
"""

from __future__ import annotations

from pagedkv.core import kernels_pure
from pagedkv.core.managers.base import SingleTypeManager, register_manager
from pagedkv.core.managers.partial import PartialHitManager
from pagedkv.core.pool import BlockPool
from pagedkv.core.request import RequestLike
from pagedkv.core.specs import FullAttentionSpec, KVCacheSpec

__all__ = ["FullAttentionManager", "PartialHitFullManager"]


@register_manager(FullAttentionSpec)
class FullAttentionManager(SingleTypeManager):
    """Full attention: scan hashes left to right, stop at the first miss. Cost: one dict
    lookup per hit block plus one for the miss."""

    may_hold_null_blocks = False
    prefix_closed_hits = True
    hit_shape = "prefix"

    def __init__(self, spec: KVCacheSpec, pool: BlockPool, group: int, *,
                 drop_last_hit: bool = False) -> None:
        super().__init__(spec, pool, group, drop_last_hit=drop_last_hit)
        if (pool.longest_hit is not kernels_pure.longest_hit
                and type(self).find_longest_cache_hit is _inline_hit):
            # The pool's compiled probe, picked once here: the class method below is the
            # pure kernel's loop inline (the pure core pays no call for it).
            self.find_longest_cache_hit = self._hit_by_kernel  # type: ignore[method-assign]

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """:func:`pagedkv.core.kernels_pure.longest_hit` over this group's hashes and
        index, written inline; an instance over a compiled pool calls its probe instead
        (:meth:`_hit_by_kernel`, the same result). No state change."""
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

    def _hit_by_kernel(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """:meth:`find_longest_cache_hit` through the pool's ``longest_hit`` kernel."""
        hashes = self.group_hashes(block_hashes)
        n = min(max_length // self.block_size, len(hashes))
        out = self.pool.longest_hit(self.pool.index[self.group], hashes, n)
        if self.drop_last_hit and out:
            out.pop()
        return out

    def cache_blocks(self, request: RequestLike, request_id: str, num_tokens: int) -> None:
        """Full blocks as usual, then the prompt's tail boundary as a partial entry when
        this group's block spans several hash blocks (module docstring)."""
        if num_tokens // self.block_size > self.num_cached_blocks[request_id]:
            super().cache_blocks(request, request_id, num_tokens)
        if self.hash_stride == 1:
            return
        pool = self.pool
        hbs = pool.hash_block_size
        limit = request.num_prompt_tokens - (0 if self.drop_last_hit else 1)
        hashes = request.block_hashes
        boundary = min(limit // hbs, len(hashes)) * hbs
        if not boundary or boundary > num_tokens or not boundary % self.block_size:
            return
        blocks = self.req_to_blocks[request_id]
        i = boundary // self.block_size
        if i < len(blocks):
            block = blocks[i]
            if pool.index[self.group].get(hashes[boundary // hbs - 1]) == block:
                return  # registered already (on every later call of a running request)
            pool.cache_partial_block(request, block, boundary, self.group)

    def registers_whole_blocks_only(self) -> bool:
        """Only when this group's block is one hash block (else the prompt's tail
        boundary is registered as a partial entry, module docstring)."""
        return self.hash_stride == 1

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        ref = self.pool.ref_cnt
        n = 0
        for b in self.req_to_blocks.get(request_id, ()):
            if ref[b] != num_running_requests:
                break
            n += 1
        return n


#: The class's own lookup (the pure loop): instances of subclasses that replace it keep
#: theirs.
_inline_hit = FullAttentionManager.find_longest_cache_hit


class PartialHitFullManager(FullAttentionManager, PartialHitManager):
    """Sub-block ("partial") prefix hits for a full-attention group (vLLM 0.33's
    fine-grained lookup, enabled in a hybrid model whose align-mode Mamba block is larger
    than the hash block). The façade uses this class for full-attention groups of such
    models only, so no other model pays for it.

    * Lookup (:meth:`find_partial_hit`): cached full blocks left to right, then the hash
      blocks inside the next block, longest first: a hit may end inside a block.
    * A request adopting a hit that ends inside block ``i`` (:meth:`adopt_partial_hit`)
      needs one block more: at allocation its table gets a fresh block ``c`` at position
      ``i`` (copy on write) and the pair ``(source, c)`` is queued for the engine, which
      copies the block and then releases both (:meth:`pagedkv.KVCacheManager.take_block_copies`).

    Worked case (block 16, hash block 4): blocks ``b0`` (tokens 0..15) cached and a partial
    key of tokens 0..23 on ``b1``: a request sharing 26 tokens hits ``[b0, b1]``, 24 tokens;
    allocating it returns ``[c, ...]`` with its table ``[b0, c, ...]`` and the copy
    ``b1 -> c``.
    """

    # grows_plainly stays True: a copy is queued only by the allocation that adopts a hit,
    # never for a request that already holds its table.
    records_copy_block = True

    def __init__(self, spec: KVCacheSpec, pool: BlockPool, group: int, *,
                 drop_last_hit: bool = False) -> None:
        super().__init__(spec, pool, group, drop_last_hit=drop_last_hit)
        self._partial: dict[str, tuple[int, int]] = {}
        #: (source, copy) pairs queued since the last take, in allocation order.
        self.pending_copies: list[tuple[int, int]] = []

    def find_partial_hit(self, block_hashes: list[bytes], max_length: int) -> tuple[list[int], int]:
        """The hit blocks and the hit length in tokens (a multiple of the hash block size).
        No state change. O(hit blocks + hash blocks per block) lookups."""
        k = self.hash_stride
        hbs = self.pool.hash_block_size
        get = self.pool.index[self.group].get
        out: list[int] = []
        for i in range(min(max_length // self.block_size, len(block_hashes) // k)):
            b = get(block_hashes[(i + 1) * k - 1])
            if b is None:
                break
            out.append(b)
        hit = len(out) * self.block_size
        first = len(out) * k
        for j in range(min(first + k - 1, max_length // hbs, len(block_hashes)) - 1,
                       first - 1, -1):
            b = get(block_hashes[j])
            if b is not None:
                out.append(b)
                hit = (j + 1) * hbs
                break
        return out, hit

    def count_partial(self, new_computed: list[int], num_local_computed_tokens: int) -> int:
        """The copy block a partial hit needs (1), else 0. No state change."""
        return 1 if new_computed and num_local_computed_tokens % self.block_size else 0

    def adopt_partial_hit(
        self, request_id: str, new_computed: list[int], num_local_computed_tokens: int
    ) -> None:
        """After the hit blocks joined the table: remember a hit ending inside its last
        block for the copy at allocation; that position is registered again once full."""
        if new_computed and num_local_computed_tokens % self.block_size:
            i = num_local_computed_tokens // self.block_size
            self._partial[request_id] = (i, new_computed[-1])
            self.num_cached_blocks[request_id] = i

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """The copy block first (a partial hit's), then the table's new blocks."""
        p = self._partial.pop(request_id, None) if self._partial else None
        if p is None:
            return super().allocate_new_blocks(request_id, num_tokens)
        i, src = p
        pool = self.pool
        cow = pool.get_new_blocks(1)[0]
        self.req_to_blocks[request_id][i] = cow
        pool.ref_cnt[cow] += 1  # the copy's own reference, released after the copy
        self.pending_copies.append((src, cow))
        out = [cow]
        out.extend(super().allocate_new_blocks(request_id, num_tokens))
        return out

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        self._partial.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)

    def free(self, request_id: str) -> None:
        self._partial.pop(request_id, None)
        super().free(request_id)


FullAttentionManager.partial_hit_class = PartialHitFullManager
