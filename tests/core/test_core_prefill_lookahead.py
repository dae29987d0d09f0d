"""A drafter's prefill lookahead (``CacheConfig.num_prefill_lookahead_tokens``, vLLM's
``num_reprefillable_tokens``): the last ``P - 1`` computed tokens are never registered.
Both cores; ``check_invariants`` after each call."""

from __future__ import annotations

import pytest

import pagedkv
from pagedkv import ConfigError, InvalidArgumentError
from pagedkv.core.reprefill import hybrid_cacheable_tokens, unitary_cacheable_tokens

BS = 16


def _full(block_size: int = BS) -> pagedkv.FullAttentionSpec:
    return pagedkv.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                     dtype_bytes=2)


def _manager(lookahead: int, *groups: pagedkv.KVCacheSpec,
             drop_last_hit: bool = False) -> pagedkv.KVCacheManager:
    return pagedkv.KVCacheManager(pagedkv.CacheConfig(
        groups=groups or (_full(),), num_blocks=48, max_model_len=512,
        num_prefill_lookahead_tokens=lookahead, drop_last_hit=drop_last_hit))


def _cached_blocks(mgr: pagedkv.KVCacheManager, rid: str) -> list[int]:
    return mgr.get_num_cached_blocks(rid)


@pytest.mark.parametrize(("lookahead", "computed", "registered"),
                         [(1, 32, 2), (3, 32, 1), (3, 33, 1), (3, 34, 2), (0, 31, 1)])
def test_one_group_registers_only_finalized_tokens(lookahead: int, computed: int,
                                                   registered: int) -> None:
    mgr = _manager(lookahead)
    req = mgr.new_request("r", list(range(1, 41)))
    assert mgr.allocate_slots(req, computed) is not None
    mgr.check_invariants()
    assert _cached_blocks(mgr, "r") == [registered]
    req.num_computed_tokens = computed
    assert mgr.allocate_slots(req, 40 - computed) is not None  # the rest of the prompt
    assert _cached_blocks(mgr, "r") == [2]  # 40 - 2 tokens: two full blocks
    mgr.check_invariants()


def test_the_held_back_block_is_registered_once_finalized_on_the_decode_path() -> None:
    mgr = _manager(3)
    req = mgr.new_request("r", list(range(1, 33)))
    assert mgr.allocate_slots(req, 32) is not None
    req.num_computed_tokens = 32
    assert _cached_blocks(mgr, "r") == [1]
    for token in (900, 901):
        req.append_output_tokens(token)
        assert mgr.allocate_slots(req, 1) is not None  # the compiled core's path, if built
        req.num_computed_tokens += 1
        mgr.check_invariants()
    assert _cached_blocks(mgr, "r") == [2]
    probe = mgr.new_request("probe", list(range(1, 33)) + [900, 901, 7])
    assert mgr.get_computed_blocks(probe).num_computed_tokens == 32


def test_hybrid_groups_align_and_only_dropping_groups_hold_back() -> None:
    swa = pagedkv.SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8,
                                    dtype_bytes=2, sliding_window=40)
    mgr = _manager(3, _full(32), swa, drop_last_hit=True)
    req = mgr.new_request("r", list(range(1, 81)))
    assert mgr.allocate_slots(req, 64) is not None
    mgr.check_invariants()
    # Alignment 32: 64 computed -> full attention (block 32) min(62, 32 + 32) = 62 tokens,
    # one block; sliding window (block 16) min(62, 32 + 16) = 48 tokens, three blocks.
    assert _cached_blocks(mgr, "r") == [1, 3]


def test_cacheable_token_rules_worked_cases() -> None:
    class Group:
        def __init__(self, block_size: int, drop: bool) -> None:
            self.block_size, self.drop_last_hit = block_size, drop

    assert unitary_cacheable_tokens(32, 2) == 30
    assert unitary_cacheable_tokens(1, 2) == 0
    assert hybrid_cacheable_tokens(64, 2, 32, Group(16, True)) == 48
    assert hybrid_cacheable_tokens(64, 2, 32, Group(16, False)) == 64
    assert hybrid_cacheable_tokens(20, 2, 32, Group(16, True)) == 0
    assert hybrid_cacheable_tokens(70, 2, 32, Group(16, True)) == 68


def test_configuration_is_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="num_prefill_lookahead_tokens"):
        _manager(-1)
    with pytest.raises(ConfigError, match="scheduler_block_size"):
        _manager(17, drop_last_hit=True)
    _manager(17)  # without the EAGLE drop vLLM has no such rule
    _manager(16, drop_last_hit=True)
