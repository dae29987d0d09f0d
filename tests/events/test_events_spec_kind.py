"""The spec kind KV-cache events carry is vLLM 0.33's ``KVCacheSpecKind`` value."""

from __future__ import annotations

import pytest

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.core.records import BlockStored
from pagedkv.core.specs import KVCacheSpec

HEADS = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}


@pytest.mark.parametrize(
    ("spec", "wire_kind"),
    [
        (FullAttentionSpec(block_size=4, **HEADS), "full_attention"),
        (MLAAttentionSpec(block_size=4, **HEADS), "mla_attention"),
        (SinkFullAttentionSpec(block_size=4, sink_len=4, **HEADS), "sink_full_attention"),
        (SlidingWindowSpec(block_size=4, sliding_window=8, **HEADS), "sliding_window"),
        (ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **HEADS),
         "chunked_local_attention"),
    ],
)
def test_stored_event_kind_is_vllms(spec: KVCacheSpec, wire_kind: str) -> None:
    mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=16, max_model_len=64,
                                     enable_events=True))
    req = mgr.new_request("r", list(range(9)))
    assert mgr.allocate_slots(req, 9) is not None
    stored = [e for e in mgr.take_events() if isinstance(e, BlockStored)]
    assert stored and {e.kv_cache_spec_kind for e in stored} == {wire_kind}
    mgr.check_invariants()
