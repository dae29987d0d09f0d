"""When a model gets sub-block ("partial") prefix hits, as vLLM 0.33 decides it.

vLLM 0.33 hashes at a finer unit than a group's block when asked to
(``CacheConfig.hash_block_size``, its ``prefix_match_unit``), and then serves hits that end
inside a block when an align-mode Mamba group's block is larger than the hash block and
every other caching group can look up inside its blocks (full attention) or has the hash
block as its block. Hits then land on hash-block boundaries; the block a hit ends inside
is copied on write (see :class:`pagedkv.core.coordinator.PartialHitCoordinator`).

>>> from pagedkv.core.managers import manager_class_for
>>> from pagedkv.core.specs import FullAttentionSpec, MambaSpec, SlidingWindowSpec
>>> heads = dict(num_kv_heads=1, head_size=8, dtype_bytes=2)
>>> specs = [FullAttentionSpec(block_size=16, **heads), MambaSpec(block_size=16, state_bytes=64)]
>>> partial_hits_enabled(specs, [manager_class_for(s) for s in specs], 4)
True
>>> partial_hits_enabled(specs, [manager_class_for(s) for s in specs], 16)   # no finer unit
False
>>> swa = [specs[1], SlidingWindowSpec(block_size=16, sliding_window=32, **heads)]
>>> partial_hits_enabled(swa, [manager_class_for(s) for s in swa], 4)   # SWA cannot
False
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.specs import KVCacheSpec

__all__ = ["partial_hits_enabled"]


def partial_hits_enabled(
    specs: Sequence[KVCacheSpec],
    classes: Sequence[type[SingleTypeManager]],
    hash_block_size: int,
    *,
    drop_last_hit: bool = False,
) -> bool:
    """Whether a hybrid model of ``specs`` (served by ``classes``, caching on) gets
    sub-block hits at ``hash_block_size`` (module docstring). Speculative decoding
    (``drop_last_hit``) keeps block-aligned hits here (a departure from vLLM, which drops
    one hash block instead). Reads the classes' capabilities only
    (``drives_partial_hits``, ``partial_hit_class``, ``cacheable``)."""
    if len(specs) < 2 or drop_last_hit:
        return False
    if not any(cls.drives_partial_hits and s.block_size > hash_block_size
               for s, cls in zip(specs, classes, strict=True)):
        return False
    return all(
        not cls.cacheable or cls.partial_hit_class is not None
        or s.block_size == hash_block_size
        for s, cls in zip(specs, classes, strict=True)
    )
