"""``estimate_cached_tokens``: tokens in registered blocks, read without side effects.

The differential suite (``python -m conformance``) compares it with vLLM 0.33 for every
request after every operation; these cases pin the rules one at a time.
"""

from __future__ import annotations

import pytest
from hybrid_support import admit, cross, full, make_mgr, sliding, tokens

from pagedkv import InvalidArgumentError, KVCacheManager


def _state(mgr: KVCacheManager) -> str:
    return repr(mgr.debug_state())


def test_counts_registered_blocks_only() -> None:
    mgr = make_mgr([full(4)])
    req = mgr.new_request("r", tokens(13))
    assert mgr.estimate_cached_tokens(req) == 0  # holds nothing yet
    assert mgr.allocate_slots(req, 6) is not None
    assert mgr.estimate_cached_tokens(req) == 4  # one full block registered
    req.num_computed_tokens = 6
    assert mgr.allocate_slots(req, 7) is not None
    assert mgr.estimate_cached_tokens(req) == 12  # three full blocks, the fourth filling
    mgr.check_invariants()


def test_reads_only() -> None:
    mgr = make_mgr([full(4)], enable_events=True)
    d = admit(mgr, "a", tokens(13))
    mgr.take_events()
    mgr.make_prefix_cache_stats()
    before = _state(mgr)
    for _ in range(3):
        assert mgr.estimate_cached_tokens(d.req) == 12
    assert _state(mgr) == before
    assert mgr.take_events() == []
    assert mgr.make_prefix_cache_stats().requests == 0
    mgr.check_invariants()


def test_evicted_tail_falls_back_to_earlier_block() -> None:
    mgr = make_mgr([full(4)])
    d = admit(mgr, "a", tokens(13))
    table = mgr.get_block_ids("a")[0]
    mgr.evict_blocks([table[2]])
    assert mgr.estimate_cached_tokens(d.req) == 8
    mgr.check_invariants()


def test_minimum_over_groups_and_cross_attention_skipped() -> None:
    mgr = make_mgr([full(4), full(8)], hash_block_size=4)
    d = admit(mgr, "a", tokens(13))
    assert mgr.estimate_cached_tokens(d.req) == 8  # group 0: 12, group 1: 8
    mgr2 = make_mgr([full(4), cross(4, 16)])
    req = mgr2.new_request("b", tokens(13))
    assert mgr2.allocate_slots(req, 13, num_encoder_tokens=16) is not None
    assert mgr2.estimate_cached_tokens(req) == 12  # cross attention never registers
    mgr2.check_invariants()


def test_sliding_window_leading_nulls() -> None:
    mgr = make_mgr([sliding(4, 8)])
    d = admit(mgr, "a", tokens(30), chunk_tokens=8)
    assert 0 in mgr.get_block_ids("a")[0]  # blocks outside the window were released
    assert mgr.estimate_cached_tokens(d.req) == 28
    mgr.check_invariants()


def test_partial_key_counts_its_prefix() -> None:
    # Block 8 over hash blocks of 4: the first 4 tokens of a filling block get a
    # partial-prefix key, which covers 4 tokens (vLLM: block_hash_num_tokens = 4).
    mgr = make_mgr([full(8)], hash_block_size=4)
    req = mgr.new_request("a", tokens(6))
    assert mgr.allocate_slots(req, 3) is not None
    assert mgr.estimate_cached_tokens(req) == 0
    req.num_computed_tokens = 3
    assert mgr.allocate_slots(req, 3) is not None
    assert mgr.estimate_cached_tokens(req) == 4
    mgr.check_invariants()


def test_caching_off_is_zero() -> None:
    mgr = make_mgr([full(4)], enable_caching=False)
    d = admit(mgr, "a", tokens(13))
    assert mgr.estimate_cached_tokens(d.req) == 0


def test_after_free_is_zero() -> None:
    mgr = make_mgr([full(4)])
    d = admit(mgr, "a", tokens(13))
    mgr.free(d.req)
    assert mgr.estimate_cached_tokens(d.req) == 0
    mgr.check_invariants()


@pytest.mark.parametrize("bad", ["a", None, 3, b"a"])
def test_not_a_request_raises_state_unchanged(bad: object) -> None:
    mgr = make_mgr([full(4)])
    admit(mgr, "a", tokens(13))
    before = _state(mgr)
    with pytest.raises(InvalidArgumentError, match="expected a request object"):
        mgr.estimate_cached_tokens(bad)  # type: ignore[arg-type]
    assert _state(mgr) == before
