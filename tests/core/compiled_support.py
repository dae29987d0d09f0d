"""What the tests of the compiled core's entries share: the skip mark when the compiled
core is not in use, the layout they run on and a manager builder (compiled, or the pure
core's for the same fields)."""

from __future__ import annotations

from typing import Any

import pytest

from pagedkv import FullAttentionSpec, KVCacheManager
from pagedkv.core import native

needs_compiled = pytest.mark.skipif(
    native.active() is None,
    reason=f"the compiled core is not in use ({native.IMPORT_ERROR})")

SPEC = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)


def manager(pure: bool = False, **fields: Any) -> KVCacheManager:
    """A small full-attention manager on ``SPEC`` (24 blocks and 64 tokens unless
    ``fields`` say otherwise): the compiled core's, or the pure core's when ``pure``."""
    fields.setdefault("num_blocks", 24)
    fields.setdefault("max_model_len", 64)
    if pure:
        with native.forced_pure():
            return KVCacheManager.from_spec(SPEC, **fields)
    return KVCacheManager.from_spec(SPEC, **fields)
