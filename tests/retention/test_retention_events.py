"""Retention publishes nothing: configured but unused (uniform mode), a manager emits the
same events, byte for byte on the wire, and allocates the same block ids as one without
retention — explicit evictions of free cached blocks included (they stay in place, as in
vLLM)."""

from __future__ import annotations

from typing import Any

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
from pagedkv.events.wire import encode_batch
from pagedkv.retention import RetentionConfig

BS = 4


def drive(retention: RetentionConfig | None) -> tuple[list[Any], list[bytes], Any]:
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2)
    mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=16, max_model_len=256,
                                     enable_events=True, retention=retention))
    ids: list[Any] = []
    wire: list[bytes] = []
    for i in range(12):
        # whole blocks only: no unhashed partial blocks in front of the evicted one
        prompt = [100 * (i % 4) + t for t in range(8)] + [i] * (BS * (1 + i % 2))
        req = mgr.new_request(f"r{i}", prompt)
        hit = mgr.get_computed_blocks(req)
        new = mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                                 new_computed_blocks=hit)
        ids.append(new)
        mgr.free(req)
        if i % 3 == 2:  # drop the hash of a free cached block mid-queue
            cached = [b for b in range(1, 16) if mgr.pool.block_hash[b] is not None]
            mgr.evict_blocks(cached[len(cached) // 2: len(cached) // 2 + 1])
        mgr.check_invariants()
        wire.append(encode_batch(mgr.take_events(), timestamp_s=float(i)))
    return ids, wire, mgr


def test_uniform_mode_emits_vllms_events_and_block_ids() -> None:
    ids_off, wire_off, _ = drive(None)
    ids_on, wire_on, mgr = drive(RetentionConfig())
    assert mgr.pool.policy.uniform
    assert ids_on == ids_off
    assert wire_on == wire_off
    assert any(len(w) > 20 for w in wire_off)  # the stream is not empty
