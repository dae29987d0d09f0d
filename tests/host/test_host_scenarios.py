"""Host-tier scenarios with exact block ids. Device pool: block size 4, 10 blocks (free
queue [1..9]); host pool: 16 blocks (ids 0..15, lowest first). Every call is followed by
``check_invariants()`` over both tiers (host_support.Checked)."""

from __future__ import annotations

import pytest
from host_support import BS, finish_step, make, run, spec

from pagedkv import CacheConfig
from pagedkv.core.manager import KVCacheManager
from pagedkv.core.records import BlockRemoved, BlockStored
from pagedkv.core.specs import CrossAttentionSpec, MLAAttentionSpec, SlidingWindowSpec
from pagedkv.errors import ConfigError, InvalidArgumentError, InvalidHitError
from pagedkv.host import (
    AFTER_FORWARD,
    BEFORE_FORWARD,
    AdmitAfterHits,
    GroupLoad,
    HostTierComponent,
    HostTierConfig,
    HostTieredKVCacheManager,
    LookupState,
    WriteThrough,
    make_manager,
)

A = list(range(21))            # 5 full blocks + 1 token
B = list(range(100, 137))      # 9 full blocks + 1 token: evicts everything of A


def _evict_a_into_host(m):
    a, _, new_a = run(m, "a", A)
    assert new_a == ([1, 2, 3, 4, 5, 6],)
    m.free(a)                   # free queue: [6, 7, 8, 9, 5, 4, 3, 2, 1]
    b = m.new_request("b", B[:33])   # 9 blocks: takes 6..9 then evicts 5, 4, 3, 2, 1
    assert m.allocate_slots(b, 33, new_computed_blocks=m.host.lookup(b)) == (
        [6, 7, 8, 9, 5, 4, 3, 2, 1],)
    stores = m.host.take_store_plans()
    assert len(stores) == 1 and stores[0].timing == BEFORE_FORWARD
    g = stores[0].groups[0]
    assert g.device_block_ids == (5, 4, 3, 2, 1)
    assert g.host_block_ids == (0, 1, 2, 3, 4)
    return a, b, stores[0]


def test_prefix_evicted_from_device_and_hit_in_host_returns_exact_load_plan():
    m = make()
    a, b, store = _evict_a_into_host(m)
    m.host.complete_store(store, True)
    m.free(b)                   # b's blocks cached; free queue front: unhashed, then LRU
    a2 = m.new_request("a2", A)
    hit = m.host.lookup(a2)
    assert hit.num_device_tokens == 0
    assert hit.num_host_tokens == 20             # 5 blocks, the 21st token is computed
    assert hit.host.host_block_ids == ((4, 3, 2, 1, 0),)   # chain order: block 0 first
    new = m.allocate_slots(a2, 1, new_computed_blocks=hit)
    assert new is not None
    (plan,) = m.host.take_load_plans()
    table = m.get_block_ids("a2")[0]
    assert plan.groups == (GroupLoad(group=0, host_block_ids=(4, 3, 2, 1, 0),
                                     device_block_ids=tuple(table[:5]), first_block=0,
                                     num_tokens=20),)
    assert plan.num_device_tokens == 0 and plan.num_host_tokens == 20
    assert m.host.load_plan("a2") is plan


def test_device_hit_then_host_continuation():
    m = make(num_blocks=8)
    a, _, new_a = run(m, "a", A)               # blocks 1..6
    m.free(a)                                  # queue [6, 7, 5, 4, 3, 2, 1]
    c = m.new_request("c", list(range(500, 513)))   # 4 blocks: 6, 7, then evicts 5, 4
    assert m.allocate_slots(c, 13, new_computed_blocks=m.host.lookup(c)) == ([6, 7, 5, 4],)
    (store,) = m.host.take_store_plans()
    assert store.groups[0].device_block_ids == (5, 4)
    m.host.complete_store(store, True)
    m.free(c)                                  # queue [4, 3, 2, 1, 5, 7, 6]
    a2 = m.new_request("a2", A)
    hit = m.host.lookup(a2)
    assert hit.device.block_ids == ([1, 2, 3],)
    assert hit.num_device_tokens == 12 and hit.num_host_tokens == 8
    assert hit.host.first_block == 3 and hit.host.host_block_ids == ((1, 0),)
    # 6 blocks: hits 1, 2, 3; loaded 4 (front of the queue), 5 (c's, evicted); new 7
    # (c's): the loaded blocks join the table but are not returned, as vLLM's
    assert m.allocate_slots(a2, 1, new_computed_blocks=hit) == ([7],)
    # c's blocks are evicted by two takes (the loaded block's, then the new one's)
    stores = m.host.take_store_plans()
    assert [p.groups[0].device_block_ids for p in stores] == [(5,), (7,)]
    (plan,) = m.host.take_load_plans()
    table = m.get_block_ids("a2")[0]
    assert table[:3] == [1, 2, 3]
    assert plan.groups[0].device_block_ids == tuple(table[3:5])
    assert plan.groups[0].first_block == 3 and plan.num_computed_tokens == 20


def test_load_in_flight_protects_host_blocks():
    m = make(host_blocks=5)
    a, b, store = _evict_a_into_host(m)
    m.host.complete_store(store, True)              # host full: 5 ready blocks
    m.free(b)
    a2 = m.new_request("a2", A)
    m.allocate_slots(a2, 1, new_computed_blocks=m.host.lookup(a2))
    (plan,) = m.host.take_load_plans()
    # a2's allocation evicted b's cached blocks: every host block is pinned, none stored.
    assert m.host.take_store_plans() == []
    pinned = m.host.tier.pool.debug_state()["entries"]
    assert all(pins == 1 for _, _, pins in pinned.values()) and len(pinned) == 5
    e = m.new_request("e", list(range(700, 709)))      # 3 blocks: evicts more of b's
    assert m.allocate_slots(e, 9, new_computed_blocks=m.host.lookup(e)) is not None
    assert m.host.take_store_plans() == []
    assert m.host.make_host_stats().no_room_blocks >= 4
    assert m.host.tier.pool.debug_state()["entries"] == pinned
    m.host.complete_load(plan, True)
    m.free(e)
    f = m.new_request("f", list(range(800, 809)))      # evicts e's blocks: now they fit
    assert m.allocate_slots(f, 9, new_computed_blocks=m.host.lookup(f)) is not None
    (store,) = m.host.take_store_plans()
    # The LRU entries go: the chain tail first (host 0 held block 4 of a, host 1 block 3).
    assert store.groups[0].host_block_ids == (0, 1)


def test_completion_registers_device_blocks():
    m = make(events=True)
    a, b, store = _evict_a_into_host(m)
    m.host.complete_store(store, True)
    m.free(b)
    m.take_events()
    a2 = m.new_request("a2", A)
    m.allocate_slots(a2, 1, new_computed_blocks=m.host.lookup(a2))
    (plan,) = m.host.take_load_plans()
    dev = plan.groups[0].device_block_ids
    assert all(m.pool.block_hash[x] is None for x in dev)        # delayed caching
    assert not [e for e in m.take_events() if isinstance(e, BlockStored)]
    # Another request cannot hit the loading blocks on the device yet, only in the host.
    x = m.new_request("x", A)
    assert m.host.lookup(x).num_device_tokens == 0
    m.host.complete_load(plan, True)
    assert [m.pool.block_hash[d] for d in dev] == a2.block_hashes[:5]
    stored = [e for e in m.take_events() if isinstance(e, BlockStored)]
    assert [e.medium for e in stored] == ["GPU"]
    assert stored[0].block_hashes == a2.block_hashes[:5]
    assert m.host.lookup(x).num_device_tokens == 20


def test_failed_load_leaves_both_tiers_consistent_and_request_recomputes():
    m = make()
    a, b, store = _evict_a_into_host(m)
    m.host.complete_store(store, True)
    m.free(b)
    a2 = m.new_request("a2", A)
    m.allocate_slots(a2, 1, new_computed_blocks=m.host.lookup(a2))
    (plan,) = m.host.take_load_plans()
    with pytest.raises(InvalidArgumentError, match="load in flight"):
        m.free(a2)
    with pytest.raises(InvalidArgumentError, match="load in flight"):
        m.allocate_slots(a2, 1)
    m.host.complete_load(plan, False)
    assert all(m.pool.block_hash[x] is None for x in plan.groups[0].device_block_ids)
    assert m.host.tier.pool.state((a2.block_hashes[0], 0)) is LookupState.HIT   # host copy kept
    with pytest.raises(InvalidArgumentError, match="not a load plan in flight"):
        m.host.complete_load(plan, True)
    # Recompute: the request keeps its blocks; the next allocation registers them.
    a2.num_computed_tokens = 0
    m.allocate_slots(a2, 21)
    a2.num_computed_tokens = 21
    assert [m.pool.block_hash[x] for x in plan.groups[0].device_block_ids] == \
        a2.block_hashes[:5]
    m.free(a2)


def test_failed_load_then_free():
    m = make()
    a, b, store = _evict_a_into_host(m)
    m.host.complete_store(store, True)
    m.free(b)
    a2 = m.new_request("a2", A)
    m.allocate_slots(a2, 1, new_computed_blocks=m.host.lookup(a2))
    (plan,) = m.host.take_load_plans()
    m.host.complete_load(plan, False)
    m.free(a2)
    assert m.num_free_blocks == 9


def test_failed_store_rolls_back():
    m = make(events=True)
    a, b, store = _evict_a_into_host(m)
    key = (a.block_hashes[0], 0)
    assert m.host.tier.pool.state(key) is LookupState.HIT_PENDING
    a2 = m.new_request("a2", A)
    hit = m.host.lookup(a2)
    assert hit.num_host_tokens == 0 and hit.host.num_pending_blocks == 5
    m.take_events()
    m.host.complete_store(store, False)
    assert m.host.tier.pool.state(key) is LookupState.MISS
    assert m.host.num_free_host_blocks == 16
    assert [e for e in m.take_events() if e.medium == "CPU"] == []
    with pytest.raises(InvalidArgumentError, match="not a store plan in flight"):
        m.host.complete_store(store, True)


def test_host_events_carry_medium_cpu_and_token_ids():
    m = make(host_blocks=5, events=True)
    a, b, store = _evict_a_into_host(m)
    m.take_events()
    m.host.complete_store(store, True)
    ev = m.take_events()
    assert all(e.medium == "CPU" for e in ev) and len(ev) == 5
    by_hash = {e.block_hashes[0]: e for e in ev}
    for i in range(5):
        e = by_hash[a.block_hashes[i]]
        assert e.token_ids == A[i * BS:(i + 1) * BS]
        assert e.parent_block_hash == (a.block_hashes[i - 1] if i else None)
        assert e.kv_cache_spec_kind == "full_attention"
    # b's eviction pushes the oldest host entries out: CPU removals.
    m.free(b)
    c = m.new_request("c", list(range(300, 333)))
    m.allocate_slots(c, 33, new_computed_blocks=m.host.lookup(c))
    removed = [e for e in m.take_events() if isinstance(e, BlockRemoved) and e.medium == "CPU"]
    assert [e.block_hashes[0] for e in removed] == [a.block_hashes[i] for i in (4, 3, 2, 1, 0)]


def test_stale_host_hit_raises_and_changes_nothing():
    m = make(host_blocks=5)
    a, b, store = _evict_a_into_host(m)
    m.host.complete_store(store, True)
    m.free(b)
    a2 = m.new_request("a2", A)
    hit = m.host.lookup(a2)
    m.host.reset_host_cache()
    before = m.debug_state()
    with pytest.raises(InvalidHitError, match="stale"):
        m.allocate_slots(a2, 1, new_computed_blocks=hit)
    assert m.debug_state() == before


def test_refused_allocation_with_host_hit_changes_nothing():
    m = make(num_blocks=7, host_blocks=8)
    a, _, _ = run(m, "a", A)                      # 6 blocks: the whole pool
    m.free(a)
    b = m.new_request("b", list(range(100, 121)))
    m.allocate_slots(b, 21, new_computed_blocks=m.host.lookup(b))   # evicts a's blocks
    finish_step(m)
    a2 = m.new_request("a2", A)
    hit = m.host.lookup(a2)
    assert hit.num_host_tokens == 20
    before = m.debug_state()
    assert m.allocate_slots(a2, 1, new_computed_blocks=hit) is None   # b holds all
    assert m.debug_state() == before
    assert m.host.take_load_plans() == []


def test_write_through_stores_after_forward_and_eviction_stores_nothing_more():
    m = make(write_policy=WriteThrough())
    a = m.new_request("a", A)
    m.allocate_slots(a, 21, new_computed_blocks=m.host.lookup(a))
    (store,) = m.host.take_store_plans()
    assert store.timing == AFTER_FORWARD
    assert store.groups[0].device_block_ids == (1, 2, 3, 4, 5)
    m.host.complete_store(store, True)
    m.free(a)
    b = m.new_request("b", B[:33])
    m.allocate_slots(b, 33, new_computed_blocks=m.host.lookup(b))
    plans = m.host.take_store_plans()
    assert len(plans) == 1 and plans[0].timing == AFTER_FORWARD    # b's own blocks only
    assert set(plans[0].groups[0].block_hashes) == set(b.block_hashes[:8])


def test_admission_after_hits():
    m = make(admission=AdmitAfterHits(min_hits=1))
    a, _, _ = run(m, "a", A)
    m.free(a)
    hot = m.new_request("hot", A[:9])           # hits a's first 2 blocks once
    m.allocate_slots(hot, 1, new_computed_blocks=m.host.lookup(hot))
    m.free(hot)
    b = m.new_request("b", B[:33])
    m.allocate_slots(b, 33, new_computed_blocks=m.host.lookup(b))
    (store,) = m.host.take_store_plans()
    assert set(store.groups[0].block_hashes) == set(a.block_hashes[:2])
    assert m.host.make_host_stats().not_admitted_blocks == 3


def test_unsupported_layouts_are_refused_clearly():
    cross = CrossAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype_bytes=2,
                               max_encoder_len=16)
    with pytest.raises(ConfigError, match="group 1 is CrossAttentionSpec, whose blocks are "
                                          "never cached"):
        HostTieredKVCacheManager(
            CacheConfig(groups=(spec(), cross), num_blocks=10, max_model_len=64),
            HostTierConfig(num_blocks=4))
    sw = SlidingWindowSpec(block_size=2 * BS, num_kv_heads=2, head_size=8, dtype_bytes=2,
                           sliding_window=8)
    with pytest.raises(ConfigError, match="group 1 has block size 8, hashes are at 4"):
        HostTieredKVCacheManager(
            CacheConfig(groups=(spec(), sw), num_blocks=10, max_model_len=64),
            HostTierConfig(num_blocks=4))
    with pytest.raises(ConfigError, match="drop_last_hit"):
        HostTieredKVCacheManager(
            CacheConfig(groups=(spec(),), num_blocks=10, max_model_len=64,
                        drop_last_hit=True), HostTierConfig(num_blocks=4))
    with pytest.raises(ConfigError, match="prefix caching"):
        HostTieredKVCacheManager(
            CacheConfig(groups=(spec(),), num_blocks=10, max_model_len=64,
                        enable_caching=False), HostTierConfig(num_blocks=4))


def test_mla_layout_is_supported():
    mla = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=16, dtype_bytes=2)
    m = HostTieredKVCacheManager(CacheConfig(groups=(mla,), num_blocks=8, max_model_len=64),
                                 HostTierConfig(num_blocks=8))
    r = m.new_request("r", list(range(9)))
    assert m.allocate_slots(r, 9, new_computed_blocks=m.host.lookup(r)) == ([1, 2, 3],)
    m.check_invariants()


def test_make_manager_attaches_the_host_component():
    cfg = CacheConfig(groups=(spec(),), num_blocks=10, max_model_len=64)
    plain = make_manager(cfg)
    assert type(plain) is KVCacheManager and plain.host is None and not plain.components
    tiered = make_manager(cfg, HostTierConfig(num_blocks=2))
    assert type(tiered) is KVCacheManager
    assert tiered.host is tiered.component(HostTierComponent)


def test_two_full_attention_groups_load_every_group():
    mla = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=16, dtype_bytes=2)
    m = HostTieredKVCacheManager(
        CacheConfig(groups=(spec(), mla), num_blocks=13, max_model_len=64),
        HostTierConfig(num_blocks=16))
    a = m.new_request("a", list(range(13)))                # 3 full blocks + 1 per group
    assert m.allocate_slots(a, 13, new_computed_blocks=m.host.lookup(a)) == (
        [1, 2, 3, 4], [5, 6, 7, 8])
    a.num_computed_tokens = 13
    m.free(a)
    b = m.new_request("b", list(range(100, 121)))          # 6 blocks per group: evicts a's
    assert m.allocate_slots(b, 21, new_computed_blocks=m.host.lookup(b)) is not None
    (store,) = m.host.take_store_plans()
    assert [gs.group for gs in store.groups] == [0, 1]
    assert sorted(store.groups[0].device_block_ids + store.groups[1].device_block_ids) == \
        [1, 2, 3, 5, 6, 7]
    m.host.complete_store(store, True)
    m.check_invariants()
    b.num_computed_tokens = 21
    m.free(b)
    a2 = m.new_request("a2", list(range(13)))
    hit = m.host.lookup(a2)
    assert hit.num_host_tokens == 12 and len(hit.host.host_block_ids) == 2
    m.allocate_slots(a2, 1, new_computed_blocks=hit)
    (plan,) = m.host.take_load_plans()
    tables = m.get_block_ids("a2")
    assert [gl.group for gl in plan.groups] == [0, 1]
    for gl in plan.groups:
        assert gl.device_block_ids == tuple(tables[gl.group][:3]) and gl.num_tokens == 12
    m.check_invariants()
    for s in m.host.take_store_plans():
        m.host.complete_store(s, True)
    m.host.complete_load(plan, True)
    m.check_invariants()
    assert m.host.lookup(m.new_request("x", list(range(13)))).num_device_tokens == 12


def test_the_worked_example_of_docs_host_tier():
    m = HostTieredKVCacheManager(
        CacheConfig(groups=(spec(),), num_blocks=8, max_model_len=64, enable_events=True),
        HostTierConfig(num_blocks=16))
    a = m.new_request("a", list(range(21)))
    assert m.allocate_slots(a, 21, new_computed_blocks=m.host.lookup(a)) == ([1, 2, 3, 4, 5, 6],)
    a.num_computed_tokens = 21
    m.free(a)
    b = m.new_request("b", list(range(100, 125)))
    assert m.allocate_slots(b, 25, new_computed_blocks=m.host.lookup(b)) == (
        [6, 7, 5, 4, 3, 2, 1],)
    (store,) = m.host.take_store_plans()
    assert (store.plan_id, store.timing) == (1, BEFORE_FORWARD)
    assert store.groups[0].device_block_ids == (5, 4, 3, 2, 1)
    assert store.groups[0].host_block_ids == (0, 1, 2, 3, 4)
    m.take_events()
    m.host.complete_store(store, True)
    events = m.take_events()
    assert len(events) == 5 and (events[0].medium, events[0].token_ids) == (
        "CPU", [16, 17, 18, 19])
    b.num_computed_tokens = 25
    m.free(b)
    a2 = m.new_request("a2", list(range(21)))
    hit = m.host.lookup(a2)
    assert (hit.num_device_tokens, hit.num_host_tokens, hit.host.host_block_ids) == (
        0, 20, ((4, 3, 2, 1, 0),))
    # the loaded blocks 1..5 join the table first and are not returned (as vLLM's)
    assert m.allocate_slots(a2, 1, new_computed_blocks=hit) == ([7],)
    assert m.get_block_ids("a2") == ([1, 2, 3, 4, 5, 7],)
    (load,) = m.host.take_load_plans()
    assert load.plan_id == 4 and load.groups == (GroupLoad(
        group=0, host_block_ids=(4, 3, 2, 1, 0), device_block_ids=(1, 2, 3, 4, 5),
        first_block=0, num_tokens=20),)
    stores = m.host.take_store_plans()  # b's evictions, one plan per take
    assert [(p.plan_id, p.groups[0].device_block_ids, p.groups[0].host_block_ids)
            for p in stores] == [(2, (2, 3, 4, 5), (5, 6, 7, 8)), (3, (7,), (9,))]
    for store2 in stores:
        m.host.complete_store(store2, True)
    a2.num_computed_tokens = 21
    m.host.complete_load(load, True)
    assert m.host.lookup(m.new_request("x", list(range(21)))).num_device_tokens == 20
    m.check_invariants()
