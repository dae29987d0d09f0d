"""Sub-block ("partial") prefix hits with copy on write, as vLLM 0.33 serves them: full
attention 16 + align-mode Mamba 16, hashed at 4 tokens.

The differential suite's layout ``full+mamba/unit4`` checks the same against vLLM after
every operation; this test states the worked case without vLLM.
"""

from __future__ import annotations

import pytest

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager, MambaSpec
from pagedkv.core.coordinator import HybridCoordinator, PartialHitCoordinator
from pagedkv.errors import InvalidHitError

HEADS = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}


def make(hash_block_size: int = 4, **options: object) -> KVCacheManager:
    groups = (FullAttentionSpec(block_size=16, **HEADS), MambaSpec(block_size=16, state_bytes=64))
    mgr = KVCacheManager(CacheConfig(groups=groups, num_blocks=40, max_model_len=256,
                                     hash_block_size=hash_block_size, enable_events=True,
                                     **options))  # type: ignore[arg-type]
    mgr.check_invariants()
    return mgr


def test_partial_hits_only_with_a_finer_hash_block() -> None:
    assert isinstance(make().coordinator, PartialHitCoordinator)
    assert isinstance(make(16).coordinator, HybridCoordinator)
    assert not make(16).partial_hits
    assert not make(drop_last_hit=True).partial_hits  # kept block aligned (departure)


def producer(mgr: KVCacheManager) -> None:
    """Request a (41-token prompt) computes 40 tokens, its last hash boundary before the
    last token: the state at 40 is registered as a partial entry on Mamba block 4, and
    full attention's block 3 gets the partial key of tokens 0..39."""
    a = mgr.new_request("a", list(range(1, 42)))
    assert mgr.allocate_slots(a, 40) == ([1, 2, 3], [0, 0, 4])
    a.num_computed_tokens = 40
    mgr.check_invariants()
    mgr.new_step_starts()
    # a's next step overwrites block 4: the entry moves to a copy (block 5), filled by
    # the copy 4 -> 5 before the step runs; a keeps writing block 4.
    assert mgr.allocate_slots(a, 1) == ([], [])
    a.num_computed_tokens = 41
    mgr.check_invariants()
    taken = mgr.take_block_copies()
    assert [(c.src_block_id, c.dst_block_id) for c in taken.copies] == [(4, 5)]
    assert taken.retained == (4, 5)
    assert mgr.get_block_ids("a") == ([1, 2, 3], [0, 0, 4])
    mgr.release_blocks(taken.retained)
    mgr.check_invariants()


def test_hit_ending_inside_a_block_is_copied_on_write() -> None:
    mgr = make()
    producer(mgr)
    mgr.new_step_starts()  # the moved entry counts as registered in a's step
    b = mgr.new_request("b", list(range(1, 41)) + [900, 901, 902, 903, 904, 905])
    hit = mgr.get_computed_blocks(b)
    assert (hit.num_computed_tokens, hit.block_ids) == (40, ([1, 2, 3], [0, 0, 5]))
    assert mgr.take_new_block_ids() == [1, 2, 3]
    assert mgr.allocate_slots(b, 6, new_computed_blocks=hit) == ([6], [7])
    mgr.check_invariants()
    # b writes tokens 40.. into private copies of the blocks it hit inside.
    assert mgr.get_block_ids("b") == ([1, 2, 6], [0, 0, 7])
    assert mgr.take_new_block_ids() == [6]  # the copy is a new attention block
    taken = mgr.take_block_copies()
    assert [(c.src_block_id, c.dst_block_id) for c in taken.copies] == [(3, 6), (5, 7)]
    assert taken.retained == (3, 6, 5, 7)
    assert mgr.take_block_copies().copies == ()  # taken once
    mgr.release_blocks(taken.retained)
    mgr.check_invariants()
    mgr.free("a")
    mgr.free("b")
    mgr.check_invariants()
    assert mgr.num_free_blocks == 39


def test_same_step_hit_on_a_moved_state_is_refused() -> None:
    mgr = make()
    producer(mgr)  # no new step after the move
    b = mgr.new_request("b", list(range(1, 41)) + [900, 901])
    hit = mgr.get_computed_blocks(b)
    before = mgr.debug_state()
    assert mgr.allocate_slots(b, 2, new_computed_blocks=hit) is None
    assert mgr.debug_state() == before


def test_a_stale_partial_hit_is_refused() -> None:
    mgr = make()
    producer(mgr)
    mgr.new_step_starts()
    b = mgr.new_request("b", list(range(1, 41)) + [900, 901])
    hit = mgr.get_computed_blocks(b)
    mgr.evict_blocks([5])  # the Mamba state is gone since the lookup
    with pytest.raises(InvalidHitError):
        mgr.allocate_slots(b, 2, new_computed_blocks=hit)
    mgr.check_invariants()
    hit = mgr.get_computed_blocks(b)  # full attention still hits inside block 3
    assert hit.num_computed_tokens == 0  # but no Mamba state: no hit


def test_release_of_copy_blocks_before_the_request_frees() -> None:
    mgr = make()
    producer(mgr)
    mgr.new_step_starts()
    b = mgr.new_request("b", list(range(1, 41)) + [900, 901])
    hit = mgr.get_computed_blocks(b)
    assert mgr.allocate_slots(b, 2, new_computed_blocks=hit) is not None
    mgr.free("b")  # the copies still hold their blocks
    mgr.check_invariants()
    taken = mgr.take_block_copies()
    assert len(taken.copies) == 2
    mgr.release_blocks(taken.retained)
    mgr.check_invariants()
