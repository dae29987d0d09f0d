"""vLLM 0.33's ``skip_zeroing_group_ids``: blocks an async KV load writes are not zeroed.

vLLM's engine zeroes new KV blocks (``KVCacheConfig.needs_kv_cache_zeroing``: a Mamba
group, or groups of different precisions, e.g. DeepSeek-V4's fp32 full attention beside a
bf16 sliding-window MLA group). When a request is admitted with an asynchronous KV load,
the scheduler names the groups the load restores; in those groups the blocks allocated for
the *external* tokens (table positions below ``ceil(total_computed / block_size)``) are not
recorded for zeroing, since zeroing would race the load. Blocks for new tokens are zeroed
as usual.

pagedkv's façade records every new block of a zeroed group; :func:`skip_loaded_blocks`
takes the loaded ones of one allocation back out, so that the next
``take_new_block_ids`` returns exactly vLLM's list.

Worked case (block 16, full attention + SWA-MLA window 32, a new request with an 80-token
local hit and a 16-token async load, ``skip_zeroing_group_ids=(0,)``): full attention
adopts 5 hit blocks and gets block 6 for tokens 80..95 (external: not zeroed); the
window group gets nulls for positions 0..3 and fresh blocks at 4 and 5 (zeroed: group 1
is not restored by the load).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagedkv.core.manager import KVCacheManager
from pagedkv.core.specs import cdiv

__all__ = ["skip_loaded_blocks"]


def skip_loaded_blocks(
    mgr: KVCacheManager,
    request_id: str,
    new_blocks: Sequence[list[int]],
    num_total_computed_tokens: int,
    group_ids: Iterable[int],
) -> None:
    """Drop from ``mgr``'s zeroing record, in each group of ``group_ids``, the blocks of
    ``new_blocks`` (one allocation's result) that sit below token
    ``num_total_computed_tokens`` of the request's table (the externally loaded ones).

    Mutates the façade's per-group zeroing record only; blocks recorded by other
    allocations stay. O(table length of the groups named).
    """
    recorded = mgr.coordinator.new_block_ids
    tables = mgr.get_block_ids(request_id)
    specs = mgr.config.groups
    for g in set(group_ids):
        if not 0 <= g < len(tables) or not new_blocks[g] or not recorded[g]:
            continue
        end = cdiv(num_total_computed_tokens, specs[g].block_size)
        loaded = set(tables[g][:end]) & set(new_blocks[g])
        if loaded:
            recorded[g][:] = [b for b in recorded[g] if b not in loaded]
