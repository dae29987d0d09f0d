"""Coordinators: the groups of one model as one unit — how they agree on a prefix-cache
hit, and the per-group loops of allocating, registering and freeing a request's blocks.

* :class:`NoPrefixCacheCoordinator` — caching off: no lookup, nothing registered.
* :class:`UnitaryCoordinator` — one group: that group's longest hit; no loops.
* :class:`HybridCoordinator` — several groups: a hit must be valid for *every* group.
  Full-attention groups go first (their hit is a plain prefix); every other group then
  verifies and possibly shortens it; this repeats until the length stops changing (a fixed
  point). Lengths are kept multiples of the least common multiple of the block sizes so
  every group's hit ends on one of its block boundaries.
* :class:`PartialHitCoordinator` — a hybrid model with sub-block ("partial") hits.

The façade (:class:`pagedkv.KVCacheManager`) validates calls, does the token arithmetic
and keeps statistics; the coordinator does everything that touches groups and the pool.
Lookups never change state; a refused :meth:`Coordinator.allocate` changes nothing except
releasing the blocks that fell out of the request's windows (as vLLM 0.33 does).

The classes live in :mod:`pagedkv.core.coordinator_base` (the base),
:mod:`pagedkv.core.coordinator_simple` (no prefix cache, one group) and
:mod:`pagedkv.core.coordinator_hybrid` (several groups); import them from here.
Which one a manager uses:

>>> import pagedkv
>>> heads = dict(num_kv_heads=1, head_size=8, dtype_bytes=2)
>>> full = pagedkv.FullAttentionSpec(block_size=16, **heads)
>>> swa = pagedkv.SlidingWindowSpec(block_size=16, sliding_window=32, **heads)
>>> def coordinator(*specs, caching=True):
...     cfg = pagedkv.CacheConfig(groups=specs, num_blocks=16, max_model_len=64,
...                               enable_caching=caching)
...     return type(pagedkv.KVCacheManager(cfg).coordinator).__name__
>>> coordinator(full), coordinator(full, swa), coordinator(full, caching=False)
('UnitaryCoordinator', 'HybridCoordinator', 'NoPrefixCacheCoordinator')
"""

from collections.abc import Sequence

from pagedkv.core.coordinator_base import BlockTables, ComputedBlocks, Coordinator
from pagedkv.core.coordinator_hybrid import HybridCoordinator, PartialHitCoordinator
from pagedkv.core.coordinator_simple import NoPrefixCacheCoordinator, UnitaryCoordinator
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.pool import BlockPool

__all__ = [
    "BlockTables",
    "ComputedBlocks",
    "Coordinator",
    "HybridCoordinator",
    "NoPrefixCacheCoordinator",
    "PartialHitCoordinator",
    "UnitaryCoordinator",
    "make_coordinator",
]


def make_coordinator(
    managers: Sequence[SingleTypeManager], pool: BlockPool, *, enable_caching: bool,
    partial_hits: bool, zeroing: Sequence[bool], max_model_len: int,
    max_in_flight_tokens: int, num_reprefillable_tokens: int = 0,
) -> Coordinator:
    """The coordinator for these groups: no caching, one group, hybrid with sub-block
    hits, or hybrid; with each group's zeroing flag and admission cap
    (``SingleTypeManager.admission_cap_blocks``) set, and the re-prefillable tokens it
    never registers (:mod:`pagedkv.core.reprefill`)."""
    cls: type[Coordinator]
    if not enable_caching:
        cls = NoPrefixCacheCoordinator
    elif len(managers) == 1:
        cls = UnitaryCoordinator
    elif partial_hits:
        cls = PartialHitCoordinator
    else:
        cls = HybridCoordinator
    coordinator = cls(managers, pool)
    coordinator.zeroing[:] = zeroing
    coordinator.num_reprefillable_tokens = num_reprefillable_tokens
    coordinator.admission_cap_blocks[:] = [
        m.admission_cap_blocks(max_model_len, max_in_flight_tokens) for m in managers]
    return coordinator
