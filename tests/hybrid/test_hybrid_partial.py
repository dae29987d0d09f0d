"""Partial-prefix entries (``BlockPool.cache_partial_block``): a block of a group whose block
is k > 1 hash blocks long, registered under the hash of a prefix ending inside it.

Pool of 16 blocks, hash block 4; group 0 has block size 4, group 1 block size 8.
"""

from __future__ import annotations

import pytest

from pagedkv import BlockHasher, BlockRemoved, BlockStored, Request
from pagedkv.core.pool import BlockPool, GroupInfo
from pagedkv.core.recorder import EventBuffer
from pagedkv.errors import InvalidArgumentError

GROUPS = [GroupInfo(4, "full_attention", None), GroupInfo(8, "full_attention", None)]


def _pool(events: bool = True) -> BlockPool:
    return BlockPool(16, hash_block_size=4, groups=GROUPS,
                     recorder=EventBuffer(GROUPS, 4) if events else None)


def _req(n: int, base: int = 100) -> Request:
    return Request("r", list(range(base, base + n)), hasher=BlockHasher(4))


def test_partial_key_becomes_the_primary_hash_of_an_unhashed_block() -> None:
    pool = _pool()
    req = _req(12)  # hashes at 4, 8, 12 tokens
    (b0, b1) = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, [b0, b1], 0, 1, group=1)  # block 0 = tokens 0..7
    assert pool.recorder.take()
    h = pool.cache_partial_block(req, b1, 12, group=1)  # tokens 8..11 of block 1
    assert h == req.block_hashes[2]
    assert pool.index[1].get(h) == b1
    assert pool.block_hash[b1] == h
    pool.check_invariants()
    (ev,) = pool.recorder.take()
    assert isinstance(ev, BlockStored)
    assert ev.block_hashes == [req.block_hashes[2]]
    assert ev.parent_block_hash == req.block_hashes[1]
    assert ev.token_ids == list(range(108, 112)) and ev.block_size == 4
    assert ev.group_idx == 1
    # Registering the same key again changes nothing.
    state = pool.debug_state()
    assert pool.cache_partial_block(req, b1, 12, group=1) == h
    assert pool.debug_state() == state


def test_promotion_to_the_full_block_hash_replaces_the_partial_key() -> None:
    pool = _pool()
    req = _req(16)
    (b0, b1) = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, [b0, b1], 0, 1, group=1)
    partial = pool.cache_partial_block(req, b1, 12, group=1)
    pool.recorder.take()
    pool.cache_full_blocks(req, [b0, b1], 1, 2, group=1)
    full_hash = req.block_hashes[3]
    assert pool.index[1].get(full_hash) == b1
    assert partial is not None and pool.index[1].get(partial) is None
    pool.check_invariants()
    removed, stored = pool.recorder.take()
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [partial]
    assert isinstance(stored, BlockStored) and stored.block_hashes == [full_hash]
    assert pool.num_evicted_blocks == 0  # a promotion is not an eviction


def test_secondary_key_on_a_full_block_goes_with_it_on_eviction() -> None:
    pool = _pool()
    req = _req(16)
    (b0, b1) = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, [b0, b1], 0, 2, group=1)
    h = pool.cache_partial_block(req, b1, 12, group=1)
    assert h is not None
    assert pool.index[1].get(h) == b1
    assert pool.block_hash[b1] == req.block_hashes[3]  # the primary stays the full hash
    pool.check_invariants()
    pool.recorder.take()
    pool.evict_blocks([b1])
    assert pool.index[1].get(h) is None
    assert pool.index[1].get(req.block_hashes[3]) is None
    pool.check_invariants()
    assert sorted(e.block_hashes[0] for e in pool.recorder.take()) == sorted(
        [h, req.block_hashes[3]])


def test_two_blocks_under_one_partial_key() -> None:
    pool = _pool()
    req = _req(12)
    (a, b) = pool.get_new_blocks(2)
    h = pool.cache_partial_block(req, a, 4, group=1)
    assert pool.cache_partial_block(req, b, 4, group=1) == h
    assert h is not None and pool.index[1].get(h) == a
    pool.check_invariants()
    pool.evict_blocks([a])
    assert pool.index[1].get(h) == b
    pool.check_invariants()


def test_a_free_partial_block_is_a_cached_eviction_candidate() -> None:
    pool = _pool()
    req = _req(12)
    blocks = pool.get_new_blocks(15)
    h = pool.cache_partial_block(req, blocks[0], 4, group=1)
    pool.free_blocks(blocks)
    # unhashed blocks go to the front, the partially cached one to the back
    assert pool.free_queue.to_list()[-1] == blocks[0]
    pool.recorder.take()
    pool.get_new_blocks(15)
    assert h is not None and pool.index[1].get(h) is None
    assert [type(e) for e in pool.recorder.take()] == [BlockRemoved]
    assert pool.num_evicted_blocks == 1
    pool.check_invariants()


def test_reset_and_snapshot_know_partial_keys() -> None:
    pool = _pool()
    req = _req(12)
    (b,) = pool.get_new_blocks(1)
    h = pool.cache_partial_block(req, b, 4, group=1)
    (snap,) = pool.recorder.snapshot(pool.block_hash, pool.block_group)
    assert snap.block_hashes == [h] and snap.parent_block_hash is None
    pool.free_blocks([b])
    assert pool.reset_prefix_cache()
    assert h is not None and pool.index[1].get(h) is None
    pool.check_invariants()


@pytest.mark.parametrize(("num_tokens", "group", "match"), [
    (8, 1, "not a multiple of group 1"),   # a full-block boundary: use cache_full_blocks
    (6, 1, "multiple of the hash block size 4"),
    (0, 1, "positive"),
    (16, 1, "at most the 12 hashed tokens"),
    (4, 0, "not a multiple of group 0"),   # group 0 blocks are one hash block long
])
def test_invalid_partial_keys_raise_and_change_nothing(num_tokens: int, group: int,
                                                      match: str) -> None:
    pool = _pool()
    req = _req(12)
    (b,) = pool.get_new_blocks(1)
    state = pool.debug_state()
    with pytest.raises(InvalidArgumentError, match=match):
        pool.cache_partial_block(req, b, num_tokens, group=group)
    assert pool.debug_state() == state


def test_partial_key_needs_an_in_use_block() -> None:
    pool = _pool()
    with pytest.raises(InvalidArgumentError, match="not an in-use block"):
        pool.cache_partial_block(_req(12), 3, 4, group=1)
    assert pool.cache_partial_block(_req(12), 0, 4, group=1) is None  # null block ignored


def test_caching_off_registers_nothing() -> None:
    pool = BlockPool(8, hash_block_size=4, enable_caching=False,
                     groups=[GroupInfo(8, None, None)])
    (b,) = pool.get_new_blocks(1)
    assert pool.cache_partial_block(_req(12), b, 4, group=0) is None
    pool.check_invariants()
