"""The façade's calls for engines that schedule ahead (vLLM 0.33's scheduler):
in-flight-aware window frees, lenient engine counts, bounded lookups with stats counted
at admission, public skipped-block removal, per-block reads and cached-block lookup."""

from __future__ import annotations

import pytest

import pagedkv
from pagedkv import KVCacheManager
from pagedkv.errors import InvalidArgumentError, UnknownRequestError

HEADS = dict(num_kv_heads=1, head_size=8, dtype_bytes=2)


def _swa(window: int = 8, num_blocks: int = 64) -> KVCacheManager:
    spec = pagedkv.SlidingWindowSpec(block_size=4, sliding_window=window, **HEADS)
    return KVCacheManager.from_spec(spec, num_blocks=num_blocks, max_model_len=256)


def _full(num_blocks: int = 64) -> KVCacheManager:
    spec = pagedkv.FullAttentionSpec(block_size=4, **HEADS)
    return KVCacheManager.from_spec(spec, num_blocks=num_blocks, max_model_len=256)


def _nulls(mgr: KVCacheManager, rid: str) -> int:
    return sum(1 for b in mgr.get_block_ids(rid)[0] if b == 0)


def _running(mgr: KVCacheManager, rid: str, n: int) -> pagedkv.Request:
    req = mgr.new_request(rid, list(range(1, n + 1)))
    assert mgr.allocate_slots(req, n) is not None
    req.num_computed_tokens = n
    return req


# ------------------------------------------------------------------ in-flight window frees

def test_window_blocks_a_running_step_reads_stay_until_processed() -> None:
    # Window 8, block 4: 24 computed of which the last 8 still in flight. Processed 16:
    # token 16 reads 9..16, so 9 tokens (2 blocks) are skipped; counting the in-flight
    # tokens as processed would free 4 blocks the running step still reads.
    mgr = _swa()
    req = _running(mgr, "r", 24)
    req.append_output_tokens(99)
    assert mgr.allocate_slots(req, 1, num_in_flight_tokens=8) is not None
    assert _nulls(mgr, "r") == 2
    req.num_computed_tokens = 25
    assert mgr.allocate_slots(req, 1, num_in_flight_tokens=0, lenient_counts=True) is not None
    assert _nulls(mgr, "r") == 4  # processed now: they go
    mgr.check_invariants()


def test_without_in_flight_tokens_the_window_frees_on_computed_tokens() -> None:
    mgr = _swa()
    req = _running(mgr, "r", 24)
    req.append_output_tokens(99)
    assert mgr.allocate_slots(req, 1) is not None
    assert _nulls(mgr, "r") == 4


def test_in_flight_tokens_frees_equal_an_allocation_at_the_processed_count() -> None:
    a, b = _swa(), _swa()
    ra, rb = _running(a, "r", 24), _running(b, "r", 24)
    ra.append_output_tokens(7)
    rb.append_output_tokens(7)
    a.allocate_slots(ra, 1, num_in_flight_tokens=5)
    rb.num_computed_tokens = 19
    b.remove_skipped_blocks("r", 19)
    # The same blocks were freed; a then holds one more (its new slot).
    assert a.get_block_ids("r")[0][:6] == b.get_block_ids("r")[0]
    assert a.num_free_blocks == b.num_free_blocks - 1


def test_chunked_local_frees_wait_for_in_flight_tokens_too() -> None:
    spec = pagedkv.ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **HEADS)
    mgr = KVCacheManager.from_spec(spec, num_blocks=64, max_model_len=256)
    req = _running(mgr, "r", 24)
    req.append_output_tokens(3)
    mgr.allocate_slots(req, 1, num_in_flight_tokens=9)  # processed 15: chunk 8..15
    assert _nulls(mgr, "r") == 2


@pytest.mark.parametrize("bad", [-1, 1.5, "2", 25])
def test_bad_in_flight_counts_are_refused_with_state_unchanged(bad: object) -> None:
    mgr = _swa()
    req = _running(mgr, "r", 24)
    req.append_output_tokens(1)
    before = mgr.debug_state()
    with pytest.raises(InvalidArgumentError, match="num_in_flight_tokens"):
        mgr.allocate_slots(req, 1, num_in_flight_tokens=bad)  # type: ignore[arg-type]
    assert mgr.debug_state() == before


# ------------------------------------------------------------------ lenient counts

def test_draft_tokens_past_the_request_get_slots_but_are_never_registered() -> None:
    mgr = _full()
    req = mgr.new_request("r", list(range(1, 11)))  # 10 tokens: 2 full blocks
    with pytest.raises(InvalidArgumentError, match="more than its 10 tokens"):
        mgr.allocate_slots(req, 13)
    new = mgr.allocate_slots(req, 13, lenient_counts=True)
    assert new is not None and len(new[0]) == 4  # ceil(13 / 4)
    assert mgr.estimate_cached_tokens(req) == 8  # only the 2 full real blocks
    mgr.check_invariants()


def test_async_placeholders_computed_past_the_tokens_are_accepted() -> None:
    mgr = _full()
    req = _running(mgr, "r", 8)
    req.num_computed_tokens = 9  # one output placeholder counted as computed, not appended
    assert mgr.allocate_slots(req, 1, lenient_counts=True) is not None
    assert len(mgr.get_block_ids("r")[0]) == 3  # ceil(10 / 4)


def test_a_request_with_computed_tokens_but_no_blocks_is_allocated_leniently() -> None:
    mgr = _full()
    req = mgr.new_request("r", list(range(1, 17)))
    req.num_computed_tokens = 8  # its KV for 8 tokens came from elsewhere
    with pytest.raises(InvalidArgumentError, match="holds no blocks"):
        mgr.allocate_slots(req, 8)
    assert mgr.allocate_slots(req, 8, lenient_counts=True) == ([1, 2, 3, 4],)


def test_a_shorter_num_new_computed_tokens_cuts_the_hit() -> None:
    mgr = _full()
    first = _running(mgr, "a", 17)
    mgr.free(first)
    req = mgr.new_request("b", list(range(1, 18)))
    hit = mgr.get_computed_blocks(req)
    assert hit.num_computed_tokens == 16
    with pytest.raises(InvalidArgumentError, match="num_new_computed_tokens"):
        mgr.allocate_slots(req, 9, new_computed_blocks=hit, num_new_computed_tokens=8)
    new = mgr.allocate_slots(req, 9, new_computed_blocks=hit, num_new_computed_tokens=8,
                             lenient_counts=True)
    assert new is not None
    table = mgr.get_block_ids("b")[0]
    assert table[:2] == list(hit.block_ids[0][:2]) and len(table) == 5
    mgr.check_invariants()


def test_lenient_counts_must_be_a_bool() -> None:
    mgr = _full()
    req = mgr.new_request("r", [1, 2, 3])
    with pytest.raises(InvalidArgumentError, match="lenient_counts"):
        mgr.allocate_slots(req, 3, lenient_counts=1)  # type: ignore[arg-type]


# ------------------------------------------------------------------ lookups and stats

def test_lookup_prefix_is_bounded_and_leaves_stats_to_record_lookup() -> None:
    mgr = _full()
    mgr.free(_running(mgr, "a", 17))
    mgr.make_prefix_cache_stats()
    req = mgr.new_request("b", list(range(1, 18)))
    assert mgr.lookup_prefix(req, 8, record_stats=False).num_computed_tokens == 8
    assert mgr.lookup_prefix(req, record_stats=False).num_computed_tokens == 16
    assert mgr.make_prefix_cache_stats().requests == 0
    mgr.record_lookup(req, 16)
    stats = mgr.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 17, 16)
    with pytest.raises(InvalidArgumentError, match="max_hit_tokens"):
        mgr.lookup_prefix(req, 18)
    with pytest.raises(InvalidArgumentError, match="num_hit_tokens"):
        mgr.record_lookup(req, 18)


def test_a_bounded_hit_is_adopted_like_any_hit() -> None:
    mgr = _full()
    mgr.free(_running(mgr, "a", 17))
    req = mgr.new_request("b", list(range(1, 18)))
    hit = mgr.lookup_prefix(req, 12)
    assert hit.num_computed_tokens == 12
    assert mgr.allocate_slots(req, 5, new_computed_blocks=hit) is not None
    mgr.check_invariants()


# ------------------------------------------------------------------ reads

def test_remove_skipped_blocks_is_public_and_checked() -> None:
    mgr = _swa()
    _running(mgr, "r", 24)
    mgr.remove_skipped_blocks("r", 16)
    assert _nulls(mgr, "r") == 2
    with pytest.raises(UnknownRequestError):
        mgr.remove_skipped_blocks("nope", 4)
    with pytest.raises(InvalidArgumentError):
        mgr.remove_skipped_blocks("r", -1)


def test_block_info_and_get_cached_block_read_the_pool() -> None:
    mgr = _full()
    req = _running(mgr, "a", 9)
    b0 = mgr.get_block_ids("a")[0][0]
    info = mgr.block_info(b0)
    assert info.ref_cnt == 1 and info.block_hash == req.block_hashes[0] and not info.is_null
    assert mgr.block_info(0).is_null
    assert mgr.get_cached_block(req.block_hashes[0], [0]) == [b0]
    assert mgr.get_cached_block(b"x" * 32, [0]) is None
    with pytest.raises(InvalidArgumentError):
        mgr.block_info(64)
    with pytest.raises(InvalidArgumentError):
        mgr.get_cached_block(req.block_hashes[0], [3])
