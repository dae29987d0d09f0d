"""Host-tier configuration, sizing and misuse: documented exceptions, state unchanged."""

from __future__ import annotations

import pytest
from host_support import finish_step, make, run

from pagedkv import CacheConfig, FullAttentionSpec
from pagedkv.core.records import BlockStored
from pagedkv.errors import InvalidArgumentError
from pagedkv.host import (
    AdmitAfterHits,
    HostTierConfig,
    HostTieredKVCacheManager,
    device_block_bytes,
    host_blocks_for_bytes,
)
from pagedkv.planner import plan_kv_cache


def test_sizing_in_bytes_from_a_plan():
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
    layers = {f"layer.{i}": spec for i in range(32)}
    plan = plan_kv_cache(layers, available_bytes=8 << 30, max_model_len=4096)
    per_block = device_block_bytes(plan)
    assert per_block == spec.page_size_bytes * 32 == 2 << 20
    assert per_block * plan.num_blocks <= plan.total_bytes
    cfg = HostTierConfig.from_bytes(256 << 30, per_block)
    assert cfg.num_blocks == 131072
    with pytest.raises(InvalidArgumentError, match="hold no block"):
        host_blocks_for_bytes(1 << 20, per_block)
    with pytest.raises(InvalidArgumentError):
        host_blocks_for_bytes(1 << 30, 0)


@pytest.mark.parametrize("bad", [{"num_blocks": 0}, {"num_blocks": 1.5},
                                 {"num_blocks": 4, "write_policy": "eviction"},
                                 {"num_blocks": 4, "admission": 2}])
def test_bad_host_config(bad):
    with pytest.raises(InvalidArgumentError):
        HostTierConfig(**bad)


def test_bad_admission_rule():
    with pytest.raises(InvalidArgumentError, match="min_hits"):
        AdmitAfterHits(min_hits=0)


def test_host_hit_with_external_tokens_or_foreign_hit_is_refused_unchanged():
    m = make(num_blocks=7, host_blocks=8)
    a, _, _ = run(m, "a", list(range(21)))
    m.free(a)
    run(m, "b", list(range(100, 121)))
    m.free("b")
    a2 = m.new_request("a2", list(range(21)))
    hit = m.host.lookup(a2)
    assert hit.num_host_tokens == 20
    before = m.debug_state()
    with pytest.raises(InvalidArgumentError, match="external"):
        m.allocate_slots(a2, 1, new_computed_blocks=hit, num_external_computed_tokens=4)
    other = m.new_request("other", list(range(21)))
    with pytest.raises(InvalidArgumentError, match="this request"):
        m.allocate_slots(other, 1, new_computed_blocks=hit)
    with pytest.raises(InvalidArgumentError):
        m.allocate_slots(a2, 10**6, new_computed_blocks=hit)
    assert m.debug_state() == before
    with pytest.raises(InvalidArgumentError, match="not a store plan"):
        m.host.complete_store("plan", True)
    with pytest.raises(InvalidArgumentError, match="not a load plan"):
        m.host.complete_load(None, True)


def test_completion_with_a_non_bool_is_refused():
    m = make()
    a, _, _ = run(m, "a", list(range(21)))
    m.free(a)
    b = m.new_request("b", list(range(100, 137)))
    m.allocate_slots(b, 33, new_computed_blocks=m.host.lookup(b))
    (store,) = m.host.take_store_plans()
    with pytest.raises(InvalidArgumentError, match="bool"):
        m.host.complete_store(store, 1)
    m.host.complete_store(store, True)


def test_host_events_without_device_events():
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    m = HostTieredKVCacheManager(CacheConfig(groups=(spec,), num_blocks=7, max_model_len=64),
                                 HostTierConfig(num_blocks=8, enable_events=True))
    a = m.new_request("a", list(range(9)))
    m.allocate_slots(a, 9, new_computed_blocks=m.host.lookup(a))
    m.free(a)
    b = m.new_request("b", list(range(100, 121)))
    m.allocate_slots(b, 21, new_computed_blocks=m.host.lookup(b))
    finish_step(m)
    events = m.take_events()
    assert events and all(isinstance(e, BlockStored) and e.medium == "CPU" for e in events)
    assert sorted(e.token_ids for e in events) == [list(range(4)), list(range(4, 8))]
    m.check_invariants()


def test_cpu_events_on_the_wire_with_lora():
    from pagedkv import HashExtras, LoRA
    from pagedkv.core.records import BlockRemoved
    from pagedkv.events.wire import decode_batch, encode_batch, wire_hash

    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    m = HostTieredKVCacheManager(
        CacheConfig(groups=(spec,), num_blocks=4, max_model_len=64, enable_events=True),
        HostTierConfig(num_blocks=1))
    lora = HashExtras(lora=LoRA("sql", 7))
    a = m.new_request("a", list(range(9)), hash_extras=lora)
    m.allocate_slots(a, 9, new_computed_blocks=m.host.lookup(a))
    m.free(a)
    b = m.new_request("b", list(range(50, 59)))
    m.allocate_slots(b, 9, new_computed_blocks=m.host.lookup(b))     # evicts a's 2 blocks
    (store,) = m.host.take_store_plans()                             # room for one only
    assert store.num_blocks == 1 and m.host.make_host_stats().no_room_blocks == 1
    m.host.complete_store(store, True)
    m.free(b)
    c = m.new_request("c", list(range(80, 89)))
    m.allocate_slots(c, 9, new_computed_blocks=m.host.lookup(c))     # the host block is reused
    for s in m.host.take_store_plans():
        m.host.complete_store(s, True)
    cpu = [e for e in m.take_events() if e.medium == "CPU"]
    stored, removed = cpu[0], cpu[1]
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert stored.lora_id == 7 and stored.lora_name == "sql"
    assert stored.block_hashes[0] == removed.block_hashes[0]
    batch = decode_batch(encode_batch(cpu, timestamp_s=1.0))
    assert [e.medium for e in batch.events] == ["CPU"] * len(cpu)
    first = batch.events[0]
    assert isinstance(first, BlockStored)
    assert first.token_ids == stored.token_ids and first.extra_keys == stored.extra_keys
    assert wire_hash(first.block_hashes[0]) == wire_hash(stored.block_hashes[0])
    m.check_invariants()
