"""Mamba / linear-attention state: a fixed-size recurrent state per request.

Two classes, chosen by ``MambaSpec.cache_checkpoints`` (see ``variant_for``):

* :class:`MambaManager` (default): one state block per request, whatever its length; never
  registered in the prefix index, so every lookup misses. In a hybrid model this makes the
  *whole model* miss: the attention groups may hold the prefix, but the recurrent state
  after it exists nowhere.
* :class:`MambaCheckpointManager`: the state is kept at every ``block_size`` boundary
  ("checkpoint interval"). Table position ``j`` holds the state after
  ``min((j + 1) * block_size, computed)`` tokens; once the request computes past
  ``(j + 1) * block_size`` that block is final, registered under the hash of the prefix it
  summarises, and never written again (the engine writes the state at each boundary it
  crosses into that boundary's block and continues in the next one).

Checkpoint lookup within ``m`` tokens: the rightmost cached checkpoint ``i`` with
``(i + 1) * block_size <= m``; the hit is ``[0] * i + [ckpt_i]``, ``(i + 1) * block_size``
tokens (a state summarises its whole prefix, so nothing before it is needed). A prompt
shorter than one interval plus one token can never hit.

Worked case (interval 64): checkpoints for 64 and 128 tokens cached, a 200-token prompt
(``m`` = 199): block 2 (state at 192) is not cached, block 1 is -> ``[0, ckpt_1]``, 128
tokens.

Run (interval 4; checkpoints after 4 and 8 tokens cached, a 13-token prompt, ``m`` = 12):

>>> from pagedkv import BlockHasher, Request
>>> from pagedkv.pool import BlockPool
>>> heads = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
>>> req = Request("a", list(range(17)), hasher=BlockHasher(4))   # 4 full blocks of 4
>>> pool = BlockPool(16, hash_block_size=4)
>>> ids = pool.get_new_blocks(2); pool.cache_full_blocks(req, ids, 0, 2, 0); ids
[1, 2]
>>> from pagedkv.specs import MambaSpec
>>> spec = MambaSpec(block_size=4, state_bytes=64, cache_checkpoints=True)
>>> m = MambaCheckpointManager(spec, pool, 0)
>>> m.find_longest_cache_hit(req.block_hashes, 12)
[0, 2]
>>> MambaManager(MambaSpec(block_size=4, state_bytes=64), pool, 0).find_longest_cache_hit(
...     req.block_hashes, 12)
[]

Skipped prefix (checkpoint mode): with ``c`` computed tokens the live state is in block
``ceil(c / block_size) - 1``; every earlier block is a finished checkpoint the request no
longer reads, so it is freed. A cached checkpoint stays in the prefix index as an eviction
candidate. A request therefore holds its live state plus the blocks of the current step:
at most ``ceil(step / block_size) + 1`` <= ``MambaSpec.max_admission_blocks``.

Speculative decoding (``drop_last_hit``, checkpoint mode): the checkpoint after the hit
must be cached too (the interval after the hit matched), so the hit is checkpoint ``i``
where ``i`` and ``i + 1`` are both cached and ``(i + 2) * block_size <= m``.
"""

from __future__ import annotations

from pagedkv.managers.base import SingleTypeManager, SkippingManager, register_manager
from pagedkv.specs import KVCacheSpec, MambaSpec

__all__ = ["MambaCheckpointManager", "MambaManager"]


@register_manager(MambaSpec)
class MambaManager(SingleTypeManager):
    """One state block per request; no prefix caching."""

    cacheable = False

    @classmethod
    def variant_for(cls, spec: KVCacheSpec) -> type[SingleTypeManager]:
        if isinstance(spec, MambaSpec) and spec.cache_checkpoints:
            return MambaCheckpointManager
        return cls

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """Always a miss: no state is ever cached. Does not modify any state. O(1)."""
        return []

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed: list[int],
        total_computed_tokens: int = 0,
    ) -> int:
        """1 for a request without its state block yet, else 0. O(1)."""
        return 0 if self.req_to_blocks.get(request_id) else 1

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """The request's single state block, on its first allocation only. O(1)."""
        blocks = self.req_to_blocks[request_id]
        if blocks:
            return []
        new = self.pool.get_new_blocks(1)
        blocks.extend(new)
        return new

    def check_invariants(self) -> None:
        super().check_invariants()
        for rid, blocks in self.req_to_blocks.items():
            assert len(blocks) <= 1, f"group {self.group}: {rid} holds {len(blocks)} states"


class MambaCheckpointManager(SkippingManager):
    """State checkpoints at every ``block_size`` boundary (module docstring)."""

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens of finished checkpoints: interval 64, 130 computed -> live block 2, so
        128 tokens (blocks 0 and 1); 128 computed -> live block 1, so 64; 0 -> 0."""
        bs = self.block_size
        return max(0, -(-num_computed_tokens // bs) - 1) * bs

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """The deepest cached checkpoint within ``max_length`` tokens, nulls before it.
        Does not modify any state. O(blocks scanned from the right) lookups."""
        hashes = self.group_hashes(block_hashes)
        num_blocks = min(max_length // self.block_size, len(hashes))
        get = self.pool.index[self.group].get
        need_next = self.drop_last_hit
        next_cached = False
        for i in range(num_blocks - 1, -1, -1):
            b = get(hashes[i])
            if b is None:
                next_cached = False
                continue
            if need_next and not next_cached:
                next_cached = True
                continue
            out = [0] * i
            out.append(b)
            return out
        return []
