#!/usr/bin/env python3
"""A/B of the inlined eviction in ``BlockPool.get_new_blocks`` against the general path
(one ``evict_block`` call per cached block), interleaved call by call on the same pool so
machine noise hits both sides alike. Prints the best 64-block allocate (each evicting 64
cached blocks) for pools of 10,000 and 1,000,000 cached blocks.

    python benchmarks/ab_eviction.py
"""

from __future__ import annotations

import time

from scaling import fill_with_cached_blocks  # benchmarks/ is the script's directory

from pagedkv import FullAttentionSpec, KVCacheManager
from pagedkv.core.pool import BlockPool

SPEC = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)


def general_get_new_blocks(self: BlockPool, n: int) -> list[int]:
    """The general path: one ``evict_block`` call per cached block."""
    ids = self.free_queue.popleft_n(n)
    for b in ids:
        if self.block_hash[b] is not None:
            self.prefix.evict_block(b)
        self.ref_cnt[b] = 1
    return ids


def main() -> None:
    inlined = BlockPool.get_new_blocks
    for num_blocks in (10_000, 1_000_000):
        mgr = KVCacheManager.from_spec(SPEC, num_blocks=num_blocks, max_model_len=1 << 20)
        fill_with_cached_blocks(mgr, spare_blocks=64)
        best = {"general": float("inf"), "inlined": float("inf")}
        for i in range(400):
            req = mgr.new_request(f"m{i}", [(1 << 30) + i * 2048 + j for j in range(1024)])
            side = "general" if i % 2 else "inlined"
            BlockPool.get_new_blocks = general_get_new_blocks if i % 2 else inlined  # type: ignore[method-assign]
            t = time.perf_counter()
            mgr.allocate_slots(req, req.num_tokens)
            best[side] = min(best[side], time.perf_counter() - t)
            mgr.free(req)
        BlockPool.get_new_blocks = inlined  # type: ignore[method-assign]
        print(f"{num_blocks:>9,} cached blocks: 64-block allocate, best of 200 each: "
              f"general {best['general'] * 1e6:.1f} us, inlined {best['inlined'] * 1e6:.1f} us")


if __name__ == "__main__":
    main()
