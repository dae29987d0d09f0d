"""The rest of vLLM 0.33's manager surface: deferred frees (``pop_blocks_for_free`` +
``release_blocks``), ``truncate_computed_blocks``, blocks to zero (``take_new_block_ids``,
``record_blocks_for_zeroing``), ``max_in_flight_tokens`` and ``full_sequence_must_fit``.

The differential suite (``python -m conformance``) drives each against vLLM; these tests
state the rules without vLLM. ``check_invariants`` runs after every step.
"""

from __future__ import annotations

from typing import Any

import pytest

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    InvalidArgumentError,
    KVCacheManager,
    MambaSpec,
    SlidingWindowSpec,
    UnknownRequestError,
)
from pagedkv.errors import InvalidHitError

HEADS: dict[str, Any] = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}


def full(bs: int = 4) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, **HEADS)


def make(*groups: Any, num_blocks: int = 11, **options: Any) -> KVCacheManager:
    mgr = KVCacheManager(CacheConfig(groups=groups or (full(),), num_blocks=num_blocks,
                                     max_model_len=256, **options))
    mgr.check_invariants()
    return mgr


def run(mgr: KVCacheManager, rid: str, tokens: list[int], n: int, **kw: Any) -> Any:
    req = mgr.new_request(rid, tokens)
    hit = mgr.get_computed_blocks(req)
    out = mgr.allocate_slots(req, n - hit.num_computed_tokens, new_computed_blocks=hit, **kw)
    mgr.check_invariants()
    if out is not None:
        req.num_computed_tokens = n
    return req, out


# ------------------------------------------------------------------ deferred frees


def test_pop_then_release_reversed_equals_free() -> None:
    a, b = make(), make()
    for mgr in (a, b):
        run(mgr, "x", list(range(13)), 13)  # blocks 1..4, 3 of them cached
        run(mgr, "y", list(range(100, 105)), 5)  # blocks 5, 6
    a.free("x")
    popped = b.pop_blocks_for_free("x")
    assert popped == [1, 2, 3, 4]
    assert b.num_free_blocks == 4 and not b.has_request("x")  # still referenced
    assert b.held_outside == {1: 1, 2: 1, 3: 1, 4: 1}
    b.check_invariants()
    b.release_blocks(popped[::-1])
    b.check_invariants()
    assert a.debug_state()["pool"] == b.debug_state()["pool"]
    assert b.held_outside == {}


def test_pop_of_unknown_request_is_empty_and_release_errors_change_nothing() -> None:
    mgr = make()
    assert mgr.pop_blocks_for_free("nobody") == []
    run(mgr, "x", list(range(9)), 9)
    popped = mgr.pop_blocks_for_free("x")
    before = mgr.debug_state()
    for bad in ([7], popped + popped, "12", [popped[0], "x"]):
        with pytest.raises(InvalidArgumentError):
            mgr.release_blocks(bad)  # type: ignore[arg-type]
        assert mgr.debug_state() == before
    mgr.release_blocks([0, *popped[::-1]])  # null ids are skipped
    mgr.check_invariants()
    with pytest.raises(InvalidArgumentError):
        mgr.release_blocks(popped)  # released already


def test_popped_blocks_stay_hittable_and_claimable() -> None:
    mgr = make()
    run(mgr, "x", list(range(9)), 9)
    popped = mgr.pop_blocks_for_free("x")
    req, out = run(mgr, "y", list(range(9)), 9)  # hits blocks 1, 2 still held
    assert mgr.get_block_ids("y")[0][:2] == popped[:2]
    mgr.release_blocks(popped[::-1])
    mgr.check_invariants()
    assert mgr.num_free_blocks == 10 - 3


def test_pop_trims_leading_nulls() -> None:
    mgr = make(SlidingWindowSpec(block_size=4, sliding_window=4, **HEADS), num_blocks=12)
    req, _ = run(mgr, "x", list(range(20)), 8)
    req.num_computed_tokens = 8
    assert mgr.allocate_slots(req, 8) is not None  # window 4: tokens 0..4 skipped
    table = mgr.get_block_ids("x")[0]
    assert table == [0, 2, 3, 4]
    assert mgr.pop_blocks_for_free("x") == [2, 3, 4]
    mgr.check_invariants()


# ------------------------------------------------------------------ truncated hits


def test_truncate_computed_blocks() -> None:
    mgr = make()
    run(mgr, "x", list(range(13)), 13)
    req = mgr.new_request("y", list(range(14)))
    hit = mgr.get_computed_blocks(req)
    assert (hit.num_computed_tokens, hit.block_ids) == (12, ([1, 2, 3],))
    cut = mgr.truncate_computed_blocks(hit, 8)
    assert (cut.num_computed_tokens, cut.block_ids) == (8, ([1, 2],))
    assert hit.block_ids == ([1, 2, 3],)  # the original is untouched
    before = mgr.debug_state()
    for bad in (-4, 16, 6, 8.0):
        with pytest.raises(InvalidArgumentError):
            mgr.truncate_computed_blocks(hit, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidHitError):
        make().truncate_computed_blocks(hit, 4)
    assert mgr.debug_state() == before
    assert mgr.allocate_slots(req, 6, new_computed_blocks=cut) == ([5, 6],)
    mgr.check_invariants()
    assert mgr.get_block_ids("y") == ([1, 2, 5, 6],)


def test_truncated_window_hit_without_its_window_is_refused_at_allocation() -> None:
    mgr = make(SlidingWindowSpec(block_size=4, sliding_window=8, **HEADS), num_blocks=12)
    run(mgr, "x", list(range(17)), 17)
    req = mgr.new_request("y", list(range(17)))
    hit = mgr.get_computed_blocks(req)
    assert hit.block_ids == ([0, 0, 3, 4],)
    cut = mgr.truncate_computed_blocks(hit, 8)  # [0, 0]: the window before 8 is gone
    with pytest.raises(InvalidHitError):
        mgr.allocate_slots(req, 4, new_computed_blocks=cut)
    mgr.check_invariants()


# ------------------------------------------------------------------ blocks to zero


def test_new_blocks_recorded_for_zeroing_with_a_mamba_group() -> None:
    mgr = make(full(4), MambaSpec(block_size=4, state_bytes=64), num_blocks=20)
    assert mgr.take_new_block_ids() == []
    req, out = run(mgr, "x", list(range(10)), 10)
    assert out == ([1, 2, 3], [0, 0, 4])
    assert mgr.take_new_block_ids() == [1, 2, 3]  # attention blocks only
    assert mgr.take_new_block_ids() == []
    mgr.record_blocks_for_zeroing("x", 4)
    assert mgr.take_new_block_ids() == [2, 3]
    before = mgr.debug_state()
    with pytest.raises(InvalidArgumentError):
        mgr.record_blocks_for_zeroing("x", 6)
    with pytest.raises(UnknownRequestError):
        mgr.record_blocks_for_zeroing("nobody", 0)
    assert mgr.debug_state() == before


def test_zeroing_is_off_by_default_without_mamba_and_can_be_forced() -> None:
    mgr = make()
    run(mgr, "x", list(range(10)), 10)
    assert mgr.take_new_block_ids() == []
    forced = make(zero_new_blocks=True)
    run(forced, "x", list(range(10)), 10)
    assert forced.take_new_block_ids() == [1, 2, 3]
    with pytest.raises(InvalidArgumentError):
        make(zero_new_blocks="yes")


# ------------------------------------------------------------------ admission gate


def test_full_sequence_must_fit_gates_chunked_prefill() -> None:
    mgr = make()  # 10 usable blocks of 4
    run(mgr, "a", list(range(100, 124)), 24)  # 6 blocks, 4 free
    req = mgr.new_request("b", list(range(20)))  # 5 blocks in all
    before = mgr.debug_state()
    assert mgr.allocate_slots(req, 4, full_sequence_must_fit=True) is None
    assert mgr.debug_state() == before
    assert mgr.allocate_slots(req, 4) == ([7],)  # the first chunk alone fits
    with pytest.raises(InvalidArgumentError):
        mgr.allocate_slots(req, 4, full_sequence_must_fit=1)  # type: ignore[arg-type]


def test_full_sequence_must_fit_counts_the_watermark_not_reserved_blocks() -> None:
    mgr = make(watermark=0.2)  # 2 blocks
    run(mgr, "a", list(range(100, 112)), 12, has_scheduled_reqs=False)  # 7 free
    req = mgr.new_request("b", list(range(20)))  # 5 blocks: 5 + 2 <= 7
    # The gate: 5 + 2 <= 7 (reserved blocks not subtracted); the step: 1 + 4 + 2 <= 7.
    assert mgr.allocate_slots(req, 4, full_sequence_must_fit=True,
                              reserved_blocks=4) is not None


@pytest.mark.parametrize(("spec", "cap"), [
    (SlidingWindowSpec(block_size=4, sliding_window=8, **HEADS), 7),  # ceil(23/4) + 1
    (ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **HEADS), 6),
])
def test_windowed_groups_admit_up_to_their_cap(spec: Any, cap: int) -> None:
    # max_in_flight_tokens 16: sliding window ceil((8 - 1 + 16) / 4) + 1 = 7 blocks;
    # chunked local ceil((8 + 16) / 4) = 6 blocks (vLLM 0.33's runtime cap).
    for free, ok in ((cap, True), (cap - 1, False)):
        mgr = make(spec, num_blocks=free + 1, max_in_flight_tokens=16)
        req = mgr.new_request("x", list(range(200)))  # 50 blocks without the cap
        assert (mgr.allocate_slots(req, 4, full_sequence_must_fit=True) is not None) is ok
        mgr.check_invariants()


def test_max_in_flight_tokens_is_validated() -> None:
    for bad in (0, -1, 2.5, "16"):
        with pytest.raises(InvalidArgumentError):
            make(max_in_flight_tokens=bad)
