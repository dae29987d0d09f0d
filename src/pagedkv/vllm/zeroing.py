"""vLLM's ``skip_zeroing_group_ids``: blocks an async KV load writes are not zeroed.

vLLM's engine zeroes new KV blocks (``KVCacheConfig.needs_kv_cache_zeroing``: a Mamba
group, or groups of different precisions, e.g. DeepSeek-V4's fp32 full attention beside a
bf16 sliding-window MLA group). When a request is admitted with an asynchronous KV load,
the scheduler names the groups the load restores; in those groups the blocks allocated for
the *external* tokens are not recorded for zeroing, since zeroing would race the load.
Blocks for new tokens are zeroed as usual.

pagedkv's coordinator gives every group its external tokens' blocks before any group's
new ones, as vLLM does (:mod:`pagedkv.core.external_blocks`), and leaves out of the zeroing
record those of the groups in its ``skip_zeroing_group_ids``; :func:`skipping_zeroing`
sets them for one allocation.

Worked case (block 16, full attention + SWA-MLA window 32, a new request with an 80-token
local hit and a 16-token async load, ``skip_zeroing_group_ids=(0,)``): full attention
adopts 5 hit blocks and gets block 6 for tokens 80..95 (external: not zeroed); the
window group gets nulls for positions 0..3 and fresh blocks at 4 and 5 (zeroed: group 1
is not restored by the load); the new tokens' blocks at position 6 are zeroed in both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pagedkv.core.manager import KVCacheManager

__all__ = ["skipping_zeroing"]


@contextmanager
def skipping_zeroing(mgr: KVCacheManager, group_ids: tuple[int, ...]) -> Iterator[None]:
    """While the block runs, ``mgr``'s allocations leave out of the zeroing record the
    external tokens' blocks of the groups in ``group_ids`` (vLLM's
    ``skip_zeroing_group_ids``); the setting is cleared afterwards, whatever happens."""
    coordinator = mgr.coordinator
    coordinator.skip_zeroing_group_ids = tuple(group_ids)
    try:
        yield
    finally:
        coordinator.skip_zeroing_group_ids = ()
