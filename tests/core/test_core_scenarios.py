"""Scenario tests pinning exact block ids and free-queue order (SPEC 3.2-3.7).

Every manager here has block size 4 and, unless stated, 10 blocks: block 0 is the null
block, so the free queue starts as [1, 2, ..., 9]. Every call is followed by
check_invariants() (see conftest.CheckedManager).
"""

from __future__ import annotations

from typing import Any

import pytest

from pagedkv import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    HashExtras,
    InvalidArgumentError,
    LoRA,
    MultiModalItem,
    UnknownRequestError,
)
from pagedkv.core.hashing import event_extra_keys

BS = 4


def _mm(identifier: str, offset: int, length: int) -> HashExtras:
    return HashExtras(mm_items=[MultiModalItem(identifier, offset, length)])


def _lora(name: str, adapter_id: int) -> HashExtras:
    return HashExtras(lora=LoRA(name, adapter_id))


def prefill(m: Any, rid: str, tokens: list[int], **request_options: Any) -> tuple[Any, Any, Any]:
    """Lookup + allocate the whole prompt; returns (request, hit, new block ids)."""
    req = m.new_request(rid, tokens, **request_options)
    hit = m.get_computed_blocks(req)
    new = m.allocate_slots(req, len(tokens) - hit.num_computed_tokens, new_computed_blocks=hit)
    if new is not None:
        req.num_computed_tokens = len(tokens)
    return req, hit, new


def free_queue(m: Any) -> list[int]:
    return list(m.debug_state()["pool"]["free_queue"])


def test_prefill_then_hit_from_second_request(make_mgr: Any) -> None:
    m = make_mgr()
    a, hit_a, new_a = prefill(m, "a", list(range(10)))
    assert hit_a.num_computed_tokens == 0
    assert new_a == ([1, 2, 3],)
    # Blocks 1 and 2 are full and cached; block 3 holds 2 tokens.
    b, hit_b, new_b = prefill(m, "b", list(range(8)) + [100, 101, 102])
    assert hit_b.block_ids == ([1, 2],)
    assert hit_b.num_computed_tokens == 8
    assert new_b == ([4],)
    assert m.get_block_ids("b") == ([1, 2, 4],)
    assert free_queue(m) == [5, 6, 7, 8, 9]


def test_fully_cached_prompt_recomputes_last_token(make_mgr: Any) -> None:
    m = make_mgr()
    a, _, new_a = prefill(m, "a", list(range(8)))
    assert new_a == ([1, 2],)
    m.free(a)
    assert free_queue(m) == [3, 4, 5, 6, 7, 8, 9, 2, 1]
    # Same 8 tokens: the hit is capped at 7 tokens, block aligned -> 1 block (4 tokens).
    b, hit_b, new_b = prefill(m, "b", list(range(8)))
    assert hit_b.block_ids == ([1],)
    assert hit_b.num_computed_tokens == 4
    # The last 4 tokens are recomputed into a new block from the front of the queue.
    assert new_b == ([3],)
    assert free_queue(m) == [4, 5, 6, 7, 8, 9, 2]
    # Block 3 now holds the same content as free cached block 2: both stay registered,
    # lookups return the earliest (2).
    c = m.new_request("c", list(range(8)) + [7])
    assert m.get_computed_blocks(c).block_ids == ([1, 2],)


def test_free_is_tail_first(make_mgr: Any) -> None:
    m = make_mgr()
    a, _, new_a = prefill(m, "a", list(range(12)))
    assert new_a == ([1, 2, 3],)
    m.free(a)
    # Deepest block of the chain first: it is evicted before the shared root.
    assert free_queue(m) == [4, 5, 6, 7, 8, 9, 3, 2, 1]


def test_unhashed_freed_blocks_are_reused_before_cached_ones(make_mgr: Any) -> None:
    m = make_mgr()
    a, _, _ = prefill(m, "a", list(range(10)))  # blocks 1, 2 cached; 3 partial
    m.free(a)
    assert free_queue(m) == [3, 4, 5, 6, 7, 8, 9, 2, 1]
    _, _, new_c = prefill(m, "c", [500, 501, 502])
    assert new_c == ([3],)


def test_eviction_from_the_front_removes_cached_block_and_emits_event(make_mgr: Any) -> None:
    m = make_mgr(num_blocks=4, enable_events=True)
    a, _, new_a = prefill(m, "a", list(range(12)))
    assert new_a == ([1, 2, 3],)
    stored = m.take_events()
    assert len(stored) == 1 and isinstance(stored[0], BlockStored)
    hashes = stored[0].block_hashes
    assert hashes == a.block_hashes[:3]
    m.free(a)
    assert free_queue(m) == [3, 2, 1]
    # 5 unrelated tokens need 2 blocks: 3 and 2 are taken and evicted from the index.
    _, _, new_d = prefill(m, "d", [900, 901, 902, 903, 904])
    assert new_d == ([3, 2],)
    events = m.take_events()
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    # One removed event per evicted hash (as vLLM 0.33), in eviction order.
    assert [e.block_hashes for e in removed] == [[hashes[2]], [hashes[1]]]
    assert m.num_evicted_blocks == 2
    # Block 1 is still cached: A's prompt now hits one block.
    e = m.new_request("e", list(range(12)))
    assert m.get_computed_blocks(e).block_ids == ([1],)


def test_duplicate_identical_blocks_are_all_kept(make_mgr: Any) -> None:
    m = make_mgr()
    a = m.new_request("a", list(range(8)) + [50])
    b = m.new_request("b", list(range(8)) + [60])
    hit_a = m.get_computed_blocks(a)
    hit_b = m.get_computed_blocks(b)  # looked up before A stored anything: a miss
    assert hit_b.num_computed_tokens == 0
    assert m.allocate_slots(a, 9, new_computed_blocks=hit_a) == ([1, 2, 3],)
    assert m.allocate_slots(b, 9, new_computed_blocks=hit_b) == ([4, 5, 6],)
    c = m.new_request("c", list(range(8)) + [70])
    assert m.get_computed_blocks(c).block_ids == ([1, 2],)
    # Dropping block 1 from the index leaves its duplicate 4 to serve the first block.
    m.evict_blocks([1])
    assert m.get_computed_blocks(c).block_ids == ([4, 2],)


def test_salted_and_unsalted_requests_never_share(make_mgr: Any) -> None:
    m = make_mgr(num_blocks=20)
    tokens = list(range(9))
    prefill(m, "plain", tokens)
    _, hit_s1, new_s1 = prefill(m, "s1", tokens, hash_extras=HashExtras(cache_salt="s1"))
    assert hit_s1.num_computed_tokens == 0
    _, hit_s2, _ = prefill(m, "s2", tokens, hash_extras=HashExtras(cache_salt="s2"))
    assert hit_s2.num_computed_tokens == 0
    _, hit_s1b, _ = prefill(m, "s1b", tokens, hash_extras=HashExtras(cache_salt="s1"))
    assert hit_s1b.block_ids == (new_s1[0][:2],)
    _, hit_plain, _ = prefill(m, "plain2", tokens)
    assert hit_plain.block_ids == ([1, 2],)


def test_lora_isolation(make_mgr: Any) -> None:
    m = make_mgr(num_blocks=20)
    tokens = list(range(9))
    _, _, new_a = prefill(m, "a", tokens, hash_extras=_lora("adapter-a", 1))
    _, hit_b, _ = prefill(m, "b", tokens, hash_extras=_lora("adapter-b", 2))
    _, hit_none, _ = prefill(m, "none", tokens)
    _, hit_a2, _ = prefill(m, "a2", tokens, hash_extras=_lora("adapter-a", 1))
    assert hit_b.num_computed_tokens == 0
    assert hit_none.num_computed_tokens == 0
    assert hit_a2.block_ids == (new_a[0][:2],)


def test_multimodal_isolation(make_mgr: Any) -> None:
    m = make_mgr(num_blocks=20)
    tokens = [0] * 9  # placeholder tokens: only the image identity differs
    _, _, new_a = prefill(m, "a", tokens, hash_extras=_mm("img-1", 2, 4))
    _, hit_b, _ = prefill(m, "b", tokens, hash_extras=_mm("img-2", 2, 4))
    _, hit_c, _ = prefill(m, "c", tokens, hash_extras=_mm("img-1", 2, 4))
    assert hit_b.num_computed_tokens == 0
    assert hit_c.block_ids == (new_a[0][:2],)
    # Same image at another offset is different content.
    _, hit_d, _ = prefill(m, "d", tokens, hash_extras=_mm("img-1", 1, 4))
    assert hit_d.num_computed_tokens == 0


def test_reset_refused_while_in_use_and_accepted_after(make_mgr: Any) -> None:
    m = make_mgr(enable_events=True)
    a, _, _ = prefill(m, "a", list(range(9)))
    m.take_events()
    before = m.debug_state()
    assert m.reset_prefix_cache() is False
    assert m.debug_state() == before
    m.free(a)
    assert m.reset_prefix_cache() is True
    assert m.take_events() == [AllBlocksCleared()]
    b = m.new_request("b", list(range(9)))
    assert m.get_computed_blocks(b).num_computed_tokens == 0


def test_refused_allocation_leaves_state_unchanged(make_mgr: Any) -> None:
    m = make_mgr(num_blocks=4, enable_events=True)
    a, _, _ = prefill(m, "a", list(range(8)))  # blocks 1, 2 cached
    m.free(a)
    held, _, _ = prefill(m, "held", [700])  # takes block 3
    # Needs 3 blocks: 1 revived hit block + 2 new, but only 2 free (1 and 2).
    b = m.new_request("b", list(range(4)) + [800] * 6)
    hit = m.get_computed_blocks(b)
    assert hit.block_ids == ([1],)
    before = m.debug_state()
    assert m.allocate_slots(b, 6, new_computed_blocks=hit) is None
    assert m.debug_state() == before
    assert not m.has_request("b")
    # Decode of a running request that would need a new block: also a clean "no".
    m.free(held)
    c, _, new_c = prefill(m, "c", list(range(100, 112)))
    assert new_c == ([3, 2, 1],)
    c.append_output_tokens(5)
    before = m.debug_state()
    assert m.allocate_slots(c, 1) is None
    assert m.debug_state() == before


def test_caller_mistakes_raise_and_change_nothing(make_mgr: Any) -> None:
    m = make_mgr()
    a, hit_a, _ = prefill(m, "a", list(range(9)))
    before = m.debug_state()
    with pytest.raises(InvalidArgumentError, match="num_new_tokens"):
        m.allocate_slots(a, 0)
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        m.allocate_slots(a, -1)
    b = m.new_request("b", list(range(9)))
    hit_b = m.get_computed_blocks(b)
    with pytest.raises(InvalidArgumentError, match="already holds blocks"):
        m.allocate_slots(a, 1, new_computed_blocks=hit_b)
    with pytest.raises(UnknownRequestError, match="unknown request 'nope'"):
        m.get_block_ids("nope")
    with pytest.raises(UnknownRequestError):
        m.cache_blocks(b, 4)
    with pytest.raises(InvalidArgumentError, match="does not belong"):
        m.evict_blocks([1, 99])
    after = m.debug_state()
    after["stats"] = before["stats"]  # the lookup of b is the only intended change
    after["hit_rate_window"] = before["hit_rate_window"]
    assert after == before
    m.free("never-allocated")  # aborting an unknown request is a no-op
    assert m.debug_state()["block_tables"] == before["block_tables"]


def test_prefix_cache_stats_count_preempted_relookups_apart(make_mgr: Any) -> None:
    m = make_mgr()
    a, _, _ = prefill(m, "a", list(range(9)))
    b, _, _ = prefill(m, "b", list(range(9)))
    m.free(b)
    b.num_preemptions += 1
    b.num_computed_tokens = 0
    m.get_computed_blocks(b)
    stats = m.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (2, 18, 8)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 9, 8)
    assert stats.hit_rate == pytest.approx(8 / 18)
    assert m.make_prefix_cache_stats().requests == 0  # a new interval
    assert m.hit_rate_window.hit_rate == pytest.approx(8 / 18)


def test_hit_rate_window_keeps_last_n_requests(make_mgr: Any) -> None:
    m = make_mgr(num_blocks=40, hit_rate_window_requests=2)
    prefill(m, "a", list(range(9)))     # 0 hit of 9
    prefill(m, "b", list(range(9)))     # 8 of 9
    prefill(m, "c", [7] * 9)            # 0 of 9
    assert m.hit_rate_window.num_requests == 2
    assert m.hit_rate_window.hit_rate == pytest.approx(8 / 18)


def test_delayed_caching_registers_blocks_later(make_mgr: Any) -> None:
    m = make_mgr()
    a = m.new_request("a", list(range(9)))
    assert m.allocate_slots(a, 9, delay_caching=True) == ([1, 2, 3],)
    b = m.new_request("b", list(range(9)))
    assert m.get_computed_blocks(b).num_computed_tokens == 0
    m.cache_blocks(a, 8)
    assert m.get_computed_blocks(b).block_ids == ([1, 2],)


def test_lookahead_and_external_tokens_get_slots(make_mgr: Any) -> None:
    m = make_mgr(num_blocks=20)
    a, _, new_a = prefill(m, "a", list(range(6)))
    assert new_a == ([1, 2],)
    a.append_output_tokens(6)
    # 1 new token + 4 lookahead slots: 6 + 1 + 4 = 11 tokens -> 3 blocks.
    assert m.allocate_slots(a, 1, num_lookahead_tokens=4) == ([3],)
    # 8 tokens computed elsewhere (remote prefill) + 4 new: 12 slots -> 3 blocks; as
    # vLLM, the external tokens' blocks join the table first and are not returned.
    b = m.new_request("b", [300 + i for i in range(12)])
    assert m.allocate_slots(b, 4, num_external_computed_tokens=8) == ([6],)
    assert m.get_block_ids("b") == ([4, 5, 6],)


def test_max_model_len_caps_slots(make_mgr: Any) -> None:
    m = make_mgr(max_model_len=10)
    a = m.new_request("a", list(range(9)))
    assert m.allocate_slots(a, 9, num_lookahead_tokens=20) == ([1, 2, 3],)


def test_common_prefix_blocks(make_mgr: Any) -> None:
    m = make_mgr()
    prefill(m, "a", list(range(10)))
    prefill(m, "b", list(range(8)) + [42, 43])
    assert m.get_num_common_prefix_blocks("a", 2) == [2]
    assert m.get_num_common_prefix_blocks("a", 3) == [0]


def test_caching_off_never_hits_and_never_hashes_blocks(make_mgr: Any) -> None:
    m = make_mgr(enable_caching=False)
    a, _, new_a = prefill(m, "a", list(range(9)))
    assert new_a == ([1, 2, 3],)
    _, hit_b, _ = prefill(m, "b", list(range(9)))
    assert hit_b.num_computed_tokens == 0
    assert m.debug_state()["pool"]["index"] == [{}]
    m.free(a)
    # Unhashed blocks go to the front, in tail-first order.
    assert free_queue(m)[:3] == [3, 2, 1]


def test_stored_event_contents(make_mgr: Any) -> None:
    m = make_mgr(enable_events=True)
    a, _, _ = prefill(m, "a", list(range(9)),
                      hash_extras=HashExtras(lora=LoRA("ad", 7), cache_salt="t"))
    [ev] = m.take_events()
    assert isinstance(ev, BlockStored)
    assert ev.block_hashes == a.block_hashes[:2]
    assert ev.parent_block_hash is None
    assert ev.token_ids == list(range(8))
    assert ev.block_size == BS
    assert (ev.lora_id, ev.lora_name, ev.group_idx, ev.medium) == (7, "ad", 0, "GPU")
    # Untagged, as vLLM's to_event_extra_keys sends them: bare LoRA name and salt.
    assert ev.extra_keys == [["ad", "t"], ["ad"]]
    assert ev.kv_cache_spec_kind == "full_attention"
    # Decoding fills block 3: a second event whose parent is block 2's hash.
    a.append_output_tokens([9, 10, 11])
    for _ in range(3):
        assert m.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    [ev2] = m.take_events()
    assert ev2.parent_block_hash == a.block_hashes[1]
    assert ev2.token_ids == [8, 9, 10, 11]
    assert m.take_events() == []


def test_events_off_buffers_nothing(make_mgr: Any) -> None:
    m = make_mgr()
    prefill(m, "a", list(range(9)))
    assert m.take_events() == []
    assert m.debug_state()["pool"]["events"] is None


def test_prefix_index_snapshot_lists_parents_first(make_mgr: Any) -> None:
    m = make_mgr(num_blocks=20, enable_events=True)
    a, _, _ = prefill(m, "a", list(range(13)))
    b, _, _ = prefill(m, "b", list(range(8)) + [50] * 5)
    snap = m.prefix_index_snapshot()
    seen: set[bytes] = set()
    for ev in snap:
        assert isinstance(ev, BlockStored)
        assert ev.parent_block_hash is None or ev.parent_block_hash in seen
        seen.update(ev.block_hashes)
    assert seen == set(a.block_hashes[:3]) | set(b.block_hashes[:3])


def test_stored_events_split_at_blocks_not_newly_registered(make_mgr: Any) -> None:
    """Every stored event's token_ids cover exactly its blocks: a block in the range that
    is already registered (here via delayed caching of a partially cached table) splits
    the event, and its parent is the hash right before it."""
    m = make_mgr(num_blocks=20, enable_events=True)
    a = m.new_request("a", list(range(16)))
    assert m.allocate_slots(a, 16, delay_caching=True) == ([1, 2, 3, 4],)
    m.cache_blocks(a, 8)
    [first] = m.take_events()
    assert first.block_hashes == a.block_hashes[:2]
    m.evict_blocks([2])  # block 2 leaves the index; blocks 1 stays registered
    m.take_events()
    m.cache_blocks(a, 16)  # positions 2 and 3 are new; 0 and 1 were counted as cached
    [ev] = m.take_events()
    assert ev.block_hashes == a.block_hashes[2:4]
    assert ev.parent_block_hash == a.block_hashes[1]
    assert ev.token_ids == list(range(8, 16))
    for e in (first, ev):
        assert len(e.token_ids) == len(e.block_hashes) * e.block_size
        assert len(e.extra_keys) == len(e.block_hashes)


def test_stored_event_around_null_blocks_has_vllm_shape() -> None:
    """One stored record per registering call, as vLLM 0.33: hashes (and extra keys) of
    the registered positions only, token ids over the whole range, parent before it."""
    from pagedkv import BlockHasher, Request
    from pagedkv.core.pool import BlockPool
    from pagedkv.core.recorder import EventBuffer, GroupInfo

    groups = [GroupInfo(4, None, None)]
    pool = BlockPool(10, hash_block_size=4, groups=groups, recorder=EventBuffer(groups, 4))
    req = Request("r", list(range(20)), hasher=BlockHasher(4))
    ids = pool.get_new_blocks(4)
    table = [ids[0], 0, ids[1], ids[2], 0]  # block positions 1 and 4 are null
    pool.cache_full_blocks(req, table, 0, 5, 0)
    [event] = pool.recorder.take()
    h = req.block_hashes
    assert event.block_hashes == [h[0], h[2], h[3]]
    assert event.parent_block_hash is None
    assert event.token_ids == list(range(20))
    assert event.extra_keys == [None, None, None]
    # A snapshot still gives every block its own tokens and its true parent.
    snap = pool.recorder.snapshot(pool.block_hash, pool.block_group)
    assert sorted(((e.block_hashes, e.parent_block_hash, e.token_ids) for e in snap),
                  key=lambda t: t[2]) == [
        ([h[0]], None, [0, 1, 2, 3]),
        ([h[2]], None, [8, 9, 10, 11]),  # its parent h[1] is not cached
        ([h[3]], h[2], [12, 13, 14, 15]),
    ]
    pool.check_invariants()


def test_stored_events_reuse_the_hashers_extra_keys_and_derive_missing_ones(
        make_mgr: Any) -> None:
    """Keys the hasher recorded are the ones the event carries; a request whose hashes
    were supplied by the caller (no keys recorded) gets the same keys derived."""
    extras = HashExtras(mm_items=[MultiModalItem("img", 2, 5)], cache_salt="s")
    m = make_mgr(enable_events=True)
    a, _, _ = prefill(m, "a", list(range(9)), hash_extras=extras)
    assert a.block_extra_keys == [extras.block_keys(0, 4), extras.block_keys(4, 8)]
    [ev] = m.take_events()
    assert ev.extra_keys == [event_extra_keys(k) for k in a.block_extra_keys]
    assert ev.extra_keys == [[["img", 2], "s"], [["img", -2]]]
    m2 = make_mgr(enable_events=True)
    b, _, _ = prefill(m2, "b", list(range(9)), hash_extras=extras,
                      block_hashes=a.block_hashes)
    assert b.block_extra_keys == []
    [ev2] = m2.take_events()
    assert ev2 == ev


def test_null_recorder_has_no_snapshot(make_mgr: Any) -> None:
    m = make_mgr()
    with pytest.raises(InvalidArgumentError, match="enable_events=True"):
        m.prefix_index_snapshot()


def test_block_ids_for_computed_tokens_clip_attention_tables(make_mgr: Any) -> None:
    m = make_mgr()
    a, _, new = prefill(m, "a", list(range(11)))  # 3 blocks of 4
    assert new == ([1, 2, 3],)
    assert m.get_block_ids_for_computed_tokens("a", 5) == ([1, 2],)
    assert m.get_block_ids_for_computed_tokens("a", 0) == ([],)
    assert m.get_block_ids_for_computed_tokens("a", 100) == ([1, 2, 3],)
    with pytest.raises(UnknownRequestError):
        m.get_block_ids_for_computed_tokens("nope", 4)
