"""Scenario tests of retention control: each states a rule of docs/retention.md and fails
if the manager breaks it."""

from __future__ import annotations

from typing import Any

import pytest
from retention_support import BS, FakeClock, free_order, hit_tokens, make_manager, prompt, run

from pagedkv import FullAttentionSpec, HashExtras, InvalidArgumentError, KVCacheManager
from pagedkv.errors import PinBudgetError
from pagedkv.retention import (
    PriorityFreeQueue,
    RequestRetention,
    RetentionConfig,
    RetentionPolicy,
    TokenRangeRetention,
)

HIGH = RequestRetention(ranges=(TokenRangeRetention(priority=90),), decode_priority=90)
LOW = RequestRetention(ranges=(TokenRangeRetention(priority=10),), decode_priority=10)


def storm(mgr: KVCacheManager, first_tag: int, n: int, num_blocks: int = 3) -> None:
    """``n`` unique requests of ``num_blocks`` full blocks each, one after the other."""
    for t in range(first_tag, first_tag + n):
        run(mgr, f"storm{t}", prompt(t, num_blocks))


def test_pinned_prefix_survives_eviction_storm_and_goes_after_its_lease() -> None:
    clock = FakeClock()
    mgr = make_manager(12, clock, pin_budget_fraction=0.5)
    system = prompt(1, 2)
    run(mgr, "sys", system)
    lease = mgr.retention.pin(mgr.new_request("p", system).block_hashes, ttl_s=10.0)
    assert mgr.num_free_blocks == 9  # the 2 pinned free blocks are held out
    storm(mgr, 100, 20)
    assert hit_tokens(mgr, system) == 2 * BS
    clock.now = 5.0
    storm(mgr, 200, 20)
    assert hit_tokens(mgr, system) == 2 * BS
    clock.now = 10.0  # the lease ends: the blocks are ordinary LRU blocks again
    assert mgr.num_free_blocks == 11
    assert not lease.active and mgr.retention.num_pinned_blocks == 0
    storm(mgr, 300, 5)
    assert hit_tokens(mgr, system) == 0
    mgr.check_invariants()


def test_without_the_pin_the_same_storm_evicts_the_prefix() -> None:
    mgr = make_manager(12, FakeClock())
    system = prompt(1, 2)
    run(mgr, "sys", system)
    storm(mgr, 100, 5)
    assert hit_tokens(mgr, system) == 0


def test_refresh_on_hit_extends_the_lease_and_unpin_ends_it() -> None:
    clock = FakeClock()
    mgr = make_manager(12, clock, pin_budget_fraction=0.5)
    system = prompt(1, 2)
    run(mgr, "sys", system)
    lease = mgr.retention.pin_prefix(mgr.new_request("p", system), ttl_s=10.0,
                                     refresh_on_hit=True)
    clock.now = 8.0
    run(mgr, "user", system + [7, 7, 7])  # a hit restarts the lease: now ends at 18
    clock.now = 15.0
    storm(mgr, 100, 10)
    assert hit_tokens(mgr, system) == 2 * BS and lease.expires_at == 18.0
    mgr.retention.unpin(lease)
    assert not lease.active
    storm(mgr, 200, 5)
    assert hit_tokens(mgr, system) == 0


def test_pin_before_the_prefix_is_cached_holds_it_once_computed() -> None:
    mgr = make_manager(12, FakeClock(), pin_budget_fraction=0.5)
    system = prompt(1, 2)
    mgr.retention.pin(mgr.new_request("p", system).block_hashes, ttl_s=100.0)
    run(mgr, "sys", system)
    storm(mgr, 100, 10)
    assert hit_tokens(mgr, system) == 2 * BS


def test_high_priority_range_outlives_lower_ones() -> None:
    mgr = make_manager(10, FakeClock())
    run(mgr, "high", prompt(1, 2), retention=HIGH)
    run(mgr, "default", prompt(2, 2))
    run(mgr, "low", prompt(3, 2), retention=LOW)
    # Free order, least valuable first: unhashed tails, low, default, high.
    storm(mgr, 100, 1, num_blocks=2)  # takes 3 blocks: 1 never used + the 2 unhashed tails
    assert [hit_tokens(mgr, prompt(t, 2)) for t in (1, 2, 3)] == [8, 8, 8]
    storm(mgr, 200, 1, num_blocks=2)  # 3 more: the storm's tail, then the low blocks
    assert [hit_tokens(mgr, prompt(t, 2)) for t in (1, 2, 3)] == [8, 8, 0]
    storm(mgr, 300, 1, num_blocks=4)  # 5 more: the storm's tail, "default", storm 100
    assert hit_tokens(mgr, prompt(1, 2)) == 8
    assert hit_tokens(mgr, prompt(2, 2)) == 0


def test_block_takes_the_highest_priority_of_the_ranges_it_overlaps() -> None:
    r = RequestRetention(ranges=(
        TokenRangeRetention(token_start=0, token_end=6, priority=20),
        TokenRangeRetention(token_start=6, token_end=8, priority=70, duration_s=3.0),
    ), decode_priority=5)
    # Block 0 (tokens 0..3): 20; block 1 (4..7): 20 and 70 -> 70 with its duration;
    # block 2 (8..11) is uncovered prompt -> default 35; block 3 holds decode tokens.
    got = [r.block_retention(i, BS, num_prompt_tokens=12) for i in range(4)]
    assert got == [(20, None), (70, 3.0), (35, None), (5, None)]
    clock = FakeClock()
    mgr = make_manager(8, clock)
    run(mgr, "r", list(range(13)), retention=r)
    state = mgr.debug_state()["pool"]
    table_blocks = [b for b in range(1, 8) if state["block_hash"][b] is not None]
    prios = sorted(state["retention"]["priority"][b] for b in table_blocks)
    assert prios == [20, 35, 70]


def test_duration_reverts_priority_to_the_default_then_lru() -> None:
    clock = FakeClock()
    mgr = make_manager(10, clock)
    timed = RequestRetention(ranges=(TokenRangeRetention(priority=90, duration_s=5.0),))
    run(mgr, "timed", prompt(1, 2, extra=0), retention=timed)
    clock.now = 1.0
    run(mgr, "b", prompt(2, 2, extra=0))
    order = free_order(mgr)
    timed_blocks = order[-2:]  # level 90 is last
    clock.now = 4.0
    assert free_order(mgr)[-2:] == timed_blocks  # not yet reverted
    clock.now = 5.0  # reverted: back of the default level, behind "b" (freed at 1.0)
    clock.now = 7.0
    run(mgr, "c", prompt(3, 2, extra=0))
    order = free_order(mgr)
    assert order[-4:-2] == timed_blocks, "reverted at 5.0: before c (freed at 7.0)"
    assert mgr.debug_state()["pool"]["retention"]["levels"] == {35: 6}


def test_pin_budget_refuses_with_state_unchanged() -> None:
    mgr = make_manager(13, FakeClock(), pin_budget_fraction=0.25)  # 3 blocks of 12
    assert mgr.retention.pin_budget_blocks == 3
    run(mgr, "a", prompt(1, 2))
    run(mgr, "b", prompt(2, 2))
    mgr.retention.pin(mgr.new_request("p", prompt(1, 2)).block_hashes, ttl_s=10.0)
    before = mgr.debug_state()
    with pytest.raises(PinBudgetError, match="over the pin budget of 3 blocks"):
        mgr.retention.pin(mgr.new_request("q", prompt(2, 2)).block_hashes, ttl_s=10.0)
    assert mgr.debug_state() == before
    # Re-pinning keys already pinned costs nothing against the budget.
    mgr.retention.pin(mgr.new_request("p", prompt(1, 2)).block_hashes, ttl_s=20.0)
    assert mgr.retention.num_pinned_blocks == 2


def test_tenant_at_quota_evicts_its_own_blocks_not_anothers() -> None:
    mgr = make_manager(12, FakeClock(), tenant_quota_blocks={"a": 2})
    run(mgr, "b1", prompt(1, 3, extra=0), salt="b")  # b's blocks: the oldest
    run(mgr, "a1", prompt(2, 2, extra=0), salt="a")  # a at its quota
    run(mgr, "a2", prompt(3, 2, extra=0), salt="a")  # a over by 2: a1's blocks demoted
    run(mgr, "x", prompt(4, 6, extra=0), salt="c")   # 6 blocks: 4 never used + 2 demoted
    assert hit_tokens(mgr, prompt(1, 3, extra=0), salt="b") == 2 * BS  # all of b kept
    assert hit_tokens(mgr, prompt(2, 2, extra=0), salt="a") == 0
    assert hit_tokens(mgr, prompt(3, 2, extra=0), salt="a") == BS
    # Without quotas the same run evicts b's blocks (the least recently used).
    plain = make_manager(12, FakeClock())
    for rid, tag, n, salt in (("b1", 1, 3, "b"), ("a1", 2, 2, "a"), ("a2", 3, 2, "a"),
                              ("x", 4, 6, "c")):
        run(plain, rid, prompt(tag, n, extra=0), salt=salt)
    assert hit_tokens(plain, prompt(1, 3, extra=0), salt="b") == BS  # b's tail went
    assert hit_tokens(plain, prompt(2, 2, extra=0), salt="a") == BS


def test_unhashed_blocks_still_go_first() -> None:
    mgr = make_manager(9, FakeClock())
    run(mgr, "low", prompt(1, 2), retention=LOW)  # 2 level-10 blocks + 1 unhashed tail
    order = free_order(mgr)
    state = mgr.debug_state()["pool"]
    unhashed = [b for b in order if state["block_hash"][b] is None]
    assert order[: len(unhashed)] == unhashed and len(unhashed) == 6
    assert [state["retention"]["priority"][b] for b in order[len(unhashed):]] == [10, 10]


def test_preempt_pins_counts_pinned_blocks_as_free_and_evicts_them_last() -> None:
    clock = FakeClock()
    mgr = make_manager(8, clock, preempt_pins=True, pin_budget_fraction=0.5)
    system = prompt(1, 2)
    run(mgr, "sys", system)
    mgr.retention.pin(mgr.new_request("p", system).block_hashes, ttl_s=100.0)
    assert mgr.num_free_blocks == 7
    pinned = mgr.get_computed_blocks(mgr.new_request("q", system)).block_ids[0]
    assert free_order(mgr)[-2:] == pinned
    run(mgr, "big", prompt(2, 5, extra=0))  # needs 5 of 7: the 5 unpinned ones
    assert hit_tokens(mgr, system) == 2 * BS
    run(mgr, "huge", prompt(3, 7, extra=0))  # needs all 7: the pinned ones go last
    assert hit_tokens(mgr, system) == 0
    assert mgr.retention.num_pinned_blocks == 2  # the pin names content; it stays
    mgr.check_invariants()


def test_reset_prefix_cache_with_parked_pinned_blocks() -> None:
    mgr = make_manager(8, FakeClock(), pin_budget_fraction=0.5)
    system = prompt(1, 2)
    run(mgr, "sys", system)
    mgr.retention.pin(mgr.new_request("p", system).block_hashes, ttl_s=10.0)
    assert mgr.reset_prefix_cache()
    assert mgr.num_free_blocks == 7 and hit_tokens(mgr, system) == 0
    run(mgr, "sys2", system)  # the pin still names the content: held again
    assert mgr.retention.num_parked_blocks == 2


def test_evict_blocks_drops_a_pinned_free_block_to_the_unhashed_front() -> None:
    mgr = make_manager(8, FakeClock(), pin_budget_fraction=0.5)
    system = prompt(1, 2)
    run(mgr, "sys", system)
    mgr.retention.pin(mgr.new_request("p", system).block_hashes, ttl_s=10.0)
    blocks = mgr.get_computed_blocks(mgr.new_request("q", system)).block_ids[0]
    mgr.evict_blocks(blocks)
    mgr.check_invariants()
    assert mgr.num_free_blocks == 7 and mgr.retention.num_parked_blocks == 0


def test_bad_values_raise_documented_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="priority"):
        TokenRangeRetention(priority=101)
    with pytest.raises(InvalidArgumentError, match="token_end"):
        TokenRangeRetention(token_start=8, token_end=8)
    with pytest.raises(InvalidArgumentError, match="duration_s"):
        TokenRangeRetention(duration_s=0)
    with pytest.raises(InvalidArgumentError, match="pin_budget_fraction"):
        RetentionConfig(pin_budget_fraction=0)
    with pytest.raises(InvalidArgumentError, match="quota"):
        RetentionConfig(tenant_quota_blocks={"a": -1})
    mgr = make_manager(8, FakeClock())
    req = mgr.new_request("r", prompt(1, 2))
    for ttl in (0, -1.0, float("inf")):
        with pytest.raises(InvalidArgumentError, match="ttl_s"):
            mgr.retention.pin(req.block_hashes, ttl_s=ttl)
    with pytest.raises(InvalidArgumentError, match="nothing to pin"):
        mgr.retention.pin_prefix(req, ttl_s=1.0, num_tokens=3)


def test_manager_without_retention_has_no_control() -> None:
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2)
    mgr = KVCacheManager.from_spec(spec, num_blocks=8, max_model_len=64)
    assert mgr.retention is None
    assert mgr.pool.policy is None and not mgr.components


def test_retention_on_with_nothing_asked_allocates_the_same_block_ids() -> None:
    import random

    rng = random.Random(7)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2)
    plain = KVCacheManager.from_spec(spec, num_blocks=40, max_model_len=256)
    ret = make_manager(40, FakeClock())
    prefixes = [prompt(t, 3, extra=0) for t in range(4)]
    running: list[tuple[Any, Any]] = []
    for i in range(400):
        if running and (rng.random() < 0.4 or len(running) > 4):
            a, b = running.pop(rng.randrange(len(running)))
            plain.free(a)
            ret.free(b)
            continue
        tokens = rng.choice(prefixes) + [rng.randrange(5) for _ in range(rng.randrange(1, 20))]
        pair = []
        for mgr in (plain, ret):
            req = mgr.new_request(f"r{i}", tokens)
            hit = mgr.get_computed_blocks(req)
            new = mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                                     new_computed_blocks=hit)
            pair.append((req, hit.block_ids, new))
        assert pair[0][1:] == pair[1][1:], f"step {i}: hits or new blocks differ"
        if pair[0][2] is not None:
            for req, _, _ in pair:
                req.num_computed_tokens = req.num_tokens
            running.append((pair[0][0], pair[1][0]))
        if i % 50 == 0:
            ret.evict_blocks([])
            ret.check_invariants()
    assert plain.debug_state()["pool"]["free_queue"] == free_order(ret)


def test_moved_block_hashes_take_their_pin_mark_along() -> None:
    """``move_block_hashes`` (a running request keeps writing ``src``, the cache entries
    move to ``dst``): the pin mark and the tenant follow the primary key."""
    clock = FakeClock()
    mgr = make_manager(12, clock, tenant_quota_blocks={"a": 4})
    req = mgr.new_request("r", prompt(1, 2), hash_extras=HashExtras(cache_salt="a"))
    assert mgr.allocate_slots(req, req.num_tokens) is not None
    assert mgr.retention is not None
    mgr.retention.pin_prefix(req, ttl_s=10.0)
    pool = mgr.pool
    assert isinstance(pool.policy, RetentionPolicy)
    src = mgr.get_block_ids("r")[0][1]
    queue = pool.free_queue
    assert isinstance(queue, PriorityFreeQueue)
    assert queue.pinned[src] and queue.tenant[src] >= 0
    (dst,) = pool.get_new_blocks(1)
    pool.move_block_hashes(src, dst)
    assert queue.pinned[dst] and not queue.pinned[src]
    assert queue.tenant[dst] >= 0 and queue.tenant[src] == -1
    pool.check_invariants()
