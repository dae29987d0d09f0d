"""``pop_blocks_for_free`` and ``take_block_copies`` on each way of calling them: the
common calls (a live Request object, an id; a coordinator that never copies) skip the
checks' frames, every other call is checked as documented (``facade_frees``)."""

from __future__ import annotations

import pytest

from pagedkv import (
    CacheConfig,
    FullAttentionSpec,
    KVCacheManager,
    Request,
    SlidingWindowSpec,
)
from pagedkv.core.held_blocks import NO_COPIES
from pagedkv.errors import DuplicateRequestError, InvalidArgumentError

HEADS = {"num_kv_heads": 1, "head_size": 4, "dtype_bytes": 2}


def _manager(window: bool) -> KVCacheManager:
    spec = (SlidingWindowSpec(block_size=4, sliding_window=8, **HEADS) if window
            else FullAttentionSpec(block_size=4, **HEADS))
    return KVCacheManager(CacheConfig(groups=(spec,), num_blocks=24, max_model_len=64))


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("by_id", [False, True])
def test_pop_of_a_live_request(window: bool, by_id: bool) -> None:
    mgr = _manager(window)
    req = mgr.new_request("a", list(range(10)))
    assert mgr.allocate_slots(req, 10) is not None
    table = [b for b in mgr.get_block_ids("a")[0] if b]
    popped = mgr.pop_blocks_for_free("a" if by_id else req)
    assert popped == table and "a" not in mgr.live_requests
    assert mgr.pop_blocks_for_free(req) == [] and mgr.pop_blocks_for_free("a") == []
    mgr.release_blocks(popped[::-1])
    mgr.check_invariants()


def test_pop_checks_what_it_does_not_know() -> None:
    mgr = _manager(False)
    req = mgr.new_request("a", list(range(10)))
    assert mgr.pop_blocks_for_free(req) == []  # not admitted: nothing
    assert mgr.allocate_slots(req, 10) is not None
    twin = Request("a", list(range(10)))  # another object under the live id
    with pytest.raises(DuplicateRequestError):
        mgr.pop_blocks_for_free(twin)
    for bad in (5, None, b"a"):
        with pytest.raises(InvalidArgumentError):
            mgr.pop_blocks_for_free(bad)  # type: ignore[arg-type]
    assert "a" in mgr.live_requests


def test_take_block_copies_without_sub_block_hits() -> None:
    mgr = _manager(True)
    assert mgr.take_block_copies() is NO_COPIES
