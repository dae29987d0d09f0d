"""Sliding-window MLA groups (:class:`~pagedkv.core.specs_window_mla.SlidingWindowMLASpec`):
a plain sliding window, or, with ``bounded_replay``, per-request scratch that a hit is
replayed into (vLLM 0.32/0.33's DeepSeek-V4 "SWA bounded replay").

**Bounded replay** (:class:`ReplayedWindowManager`). The group's blocks are never
registered and the group takes no part in lookups (``cacheable`` and ``joins_lookup``
False): the hit is what the other groups agree on, and this group's part of it is empty.
Allocating a new request that adopts a hit of ``H`` tokens (local plus external) follows
the sliding-window rule: the positions wholly below the window of token ``H``
(``(H - w + 1) // block_size`` of them) are null blocks, every later position gets a fresh
block. The caller then recomputes the hit's last ``w`` tokens (vLLM's scheduler rewinds
the request's computed count to ``replay_start = H - w``) to rebuild the window; those
fresh blocks receive it, while the other groups keep their hit blocks untouched.

Token line of a replayed admission (``|`` = block boundary of 16, window ``w`` = 32,
100-token prompt, 96-token hit)::

    | 0 .. 63 (null x 4) | 64 .. 95 replayed | 96 .. 99 new |
                         ^ replay_start = 96 - 32 = 64

Worked cases (block 16, window 32):

* hit 96, 100 slots: nulls = (96 - 31) // 16 = 4, table ``[0, 0, 0, 0, n, n, n]``
  (3 fresh blocks); full attention adopts its 6 hit blocks and adds 1.
* hit 48, 100 slots: nulls = (48 - 31) // 16 = 1, so the replay start 16 lies in the
  first fresh block (a hit one token short of a block, 47, would give
  ``(47 - 31) // 16 = 1`` too, but replay start 15 would lie in the null block: vLLM's
  scheduler cuts such external hits to whole blocks).
* a chunk that ends inside the replayed range adopts the hit and needs no slot past it
  (``allocate_slots`` with 0 new tokens and the hit): full attention holds its 6 hit
  blocks, this group its 4 nulls and the window blocks up to the hit.

>>> from pagedkv.core.pool import BlockPool
>>> from pagedkv.core.specs_window_mla import SlidingWindowMLASpec
>>> spec = SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=64, dtype_bytes=2,
...                             sliding_window=32, bounded_replay=True)
>>> m = ReplayedWindowManager(spec, BlockPool(32, hash_block_size=16), 1)
>>> m.get_num_blocks_to_allocate("r", 100, [], total_computed_tokens=96)
3
>>> m.save_new_computed_blocks("r", [], 96); m.allocate_new_blocks("r", 100)
[1, 2, 3]
>>> m.req_to_blocks["r"]
[0, 0, 0, 0, 1, 2, 3]
"""

from __future__ import annotations

from pagedkv.core.managers.base import SingleTypeManager, register_manager
from pagedkv.core.managers.sliding_window import SlidingWindowManager
from pagedkv.core.request import RequestLike
from pagedkv.core.specs import KVCacheSpec
from pagedkv.core.specs_window_mla import SlidingWindowMLASpec

__all__ = ["ReplayedWindowManager", "WindowMLAManager"]


@register_manager(SlidingWindowMLASpec)
class WindowMLAManager(SlidingWindowManager):
    """Sliding-window MLA without bounded replay: a sliding window (the latent layout
    changes only the page size); with it, :class:`ReplayedWindowManager`."""

    @classmethod
    def variant_for(
        cls, spec: KVCacheSpec, *, enable_caching: bool = True
    ) -> type[SingleTypeManager]:
        if isinstance(spec, SlidingWindowMLASpec) and spec.bounded_replay:
            return ReplayedWindowManager
        return cls


class ReplayedWindowManager(WindowMLAManager):
    """Bounded replay: scratch blocks under the sliding-window rule, never registered,
    never looked up (module docstring)."""

    cacheable = False
    joins_lookup = False
    hit_shape = "never"

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """Always empty: nothing of this group is ever cached. No state change. O(1)."""
        return []

    def max_hit_nulls(self, num_hit_tokens: int) -> int:
        """None: a hit never carries blocks of this group."""
        return 0

    def reachable_mask(self, start: int, end: int) -> list[bool] | None:
        """Nothing is registered (see :meth:`cache_blocks`)."""
        return [False] * (end - start)

    def cache_blocks(self, request: RequestLike, request_id: str, num_tokens: int) -> None:
        """Registers nothing: the window's KV is rebuilt by replay, never shared."""
