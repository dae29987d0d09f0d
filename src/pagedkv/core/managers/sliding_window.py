"""Sliding-window attention: a token reads itself and the ``w - 1`` tokens before it.

Skipped prefix: with ``c`` tokens computed, the next token (index ``c``) reads tokens
``c - w + 1 .. c``, so the first ``max(0, c - w + 1)`` tokens are never read again and every
block wholly inside them becomes the null block.

Lookup: a hit of ``H`` tokens needs the ``w - 1`` tokens before ``H``, i.e. the
``n = ceil((w - 1) / block_size)`` blocks ending at ``H``, and nothing before them. So the
hashes are scanned right to left for the rightmost run of ``n`` consecutive cached blocks;
blocks before the run are null. If no such run exists, a run that starts at block 0 still
counts (there is nothing before it to need).

Worked cases (window 8, block size 4 -> n = ceil(7 / 4) = 2):

* 4 cached blocks ``b5 b6 b7 b8`` for tokens 0..15, ``max_length`` 16: the run ``b7 b8``
  ends at block 3 -> ``[0, 0, b7, b8]``, 16 tokens.
* cached ``b5 _ b7 _``: no run of 2; the run from block 0 is ``b5`` -> ``[b5]``, 4 tokens.
* speculative decoding (``drop_last_hit``): a run of n + 1 = 3 is needed and its last
  block dropped, so the block after the hit is known to match too: ``b6 b7 b8`` ->
  ``[0, b6, b7]``, 12 tokens.

The first two cases, run (block ids 1..4 cached for tokens 0..15):

>>> from pagedkv import BlockHasher, Request
>>> from pagedkv.core.pool import BlockPool
>>> heads = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
>>> req = Request("a", list(range(17)), hasher=BlockHasher(4))   # 4 full blocks of 4
>>> pool = BlockPool(16, hash_block_size=4)
>>> ids = pool.get_new_blocks(4); pool.cache_full_blocks(req, ids, 0, 4, 0); ids
[1, 2, 3, 4]
>>> from pagedkv.core.specs import SlidingWindowSpec
>>> m = SlidingWindowManager(SlidingWindowSpec(block_size=4, sliding_window=8, **heads), pool, 0)
>>> m.find_longest_cache_hit(req.block_hashes, 16)
[0, 0, 3, 4]
>>> pool.evict_blocks([2, 4])                                     # cached: b1 _ b3 _
>>> m.find_longest_cache_hit(req.block_hashes, 16)
[1]

Admission: after skipping, a request holds the window, one scheduling step and one block
of misalignment: ``SlidingWindowSpec.max_admission_blocks``.
"""

from __future__ import annotations

from pagedkv.core.kernels import kernels
from pagedkv.core.managers.base import register_manager
from pagedkv.core.managers.skipping import SkippingManager
from pagedkv.core.pool import BlockPool
from pagedkv.core.specs import SlidingWindowSpec, cdiv

__all__ = ["SlidingWindowManager"]


@register_manager(SlidingWindowSpec)
class SlidingWindowManager(SkippingManager):
    """Sliding-window groups. No cascade attention (leading blocks are null)."""

    hit_shape = "window"

    def __init__(
        self, spec: SlidingWindowSpec, pool: BlockPool, group: int, *, drop_last_hit: bool = False
    ) -> None:
        super().__init__(spec, pool, group, drop_last_hit=drop_last_hit)
        self.sliding_window = spec.sliding_window
        #: Consecutive cached blocks a hit must end with (one more with drop_last_hit).
        self.num_run_blocks = cdiv(spec.sliding_window - 1, spec.block_size) + int(drop_last_hit)
        self._spec = spec
        self._window_hit = kernels().window_hit  # compiled or pure, picked once

    def admission_cap_blocks(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """The window plus the tokens in flight, in blocks (the spec's bound)."""
        return self._spec.max_admission_blocks(max_model_len,
                                               max_num_batched_tokens=max_in_flight_tokens)

    def reachable_mask(self, start: int, end: int) -> list[bool] | None:
        """Only the blocks a hit can end with. Hits land on multiples of
        ``hit_alignment_tokens`` (the lcm of a hybrid model's block sizes), and a hit uses
        just the ``num_run_blocks`` blocks before its end; when a segment of ``a = lcm /
        block_size`` blocks is longer than that run, the first ``a - run`` blocks of every
        segment can never be used and are not registered (as vLLM 0.33).

        Worked case (full attention 32 + window 8 at block 8): a = 4, run = 1, so only
        positions 3, 7, 11, ... are registered. Window 40 at block 16 with lcm 32: a = 2,
        run = 3 >= 2: every block. No state change.
        """
        per_segment = self.hit_alignment_tokens // self.block_size
        need = self.num_run_blocks
        if need >= per_segment:
            return None
        shift = int(self.drop_last_hit)
        first = per_segment - need
        return [i >= shift and (i - shift) % per_segment >= first for i in range(start, end)]

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """``max(0, c - w + 1)``: window 8, 13 computed -> 6 (tokens 0..5)."""
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """As :meth:`SkippingManager.remove_skipped_blocks` (NOTE: the skipped prefix
        inlined: this runs on every allocation of every request)."""
        end = (num_computed_tokens - self.sliding_window + 1) // self.block_size
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
        """Rightmost run of ``num_run_blocks`` cached blocks ending within ``max_length``
        tokens, null blocks before it; else the cached run from block 0 (the kernel
        :func:`~pagedkv.core.kernels_hybrid.window_hit`). With ``drop_last_hit`` the run's
        last block is then dropped. Does not modify any state. O(blocks scanned) dict
        lookups: at worst every block up to ``max_length``."""
        if type(block_hashes) is not list:
            block_hashes = list(block_hashes)
        k = self.hash_stride
        num_blocks = min(max_length // self.block_size, len(block_hashes) // k)
        out: list[int] = self._window_hit(self.pool.index[self.group], block_hashes, k,
                                          num_blocks, self.num_run_blocks)
        if self.drop_last_hit and out and self.num_run_blocks:
            out.pop()
        return out
