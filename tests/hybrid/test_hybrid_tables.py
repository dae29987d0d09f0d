"""Table tests per manager, from worked examples: which blocks are cached (``X``) or not
(``.``), the lookup bound, and the expected hit shape (``0`` = null block, ``bN`` = the
block cached for position N)."""

from __future__ import annotations

import pytest
from hybrid_support import chunked, cross, full, mamba, sliding

from pagedkv.core.managers import (
    ChunkedLocalManager,
    CrossAttentionManager,
    FullAttentionManager,
    MambaAlignManager,
    MambaCheckpointManager,
    MambaManager,
    SlidingWindowManager,
    manager_class_for,
)
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.pool import BlockPool, GroupInfo
from pagedkv.core.specs import KVCacheSpec
from pagedkv.errors import InvalidArgumentError

HASHES = [f"h{i}".encode() for i in range(16)]


class _Prompt:
    """The few request attributes the pool reads when it registers blocks."""

    def __init__(self, num_blocks: int, bs: int) -> None:
        self.block_hashes = HASHES[:num_blocks]
        self.all_token_ids = list(range(num_blocks * bs))
        self.hash_extras = None
        self.block_extra_keys: list[object] = []


def _manager(spec: KVCacheSpec, pattern: str, *, drop: bool = False) -> tuple[
        SingleTypeManager, dict[int, int]]:
    """A manager over a fresh pool where block position i is cached iff pattern[i] == X.
    Returns the manager and position -> block id of the cached blocks."""
    bs = spec.block_size
    pool = BlockPool(64, hash_block_size=bs, groups=[GroupInfo(bs, spec.kind, None)])
    m = manager_class_for(spec)(spec, pool, 0, drop_last_hit=drop)
    ids = pool.get_new_blocks(len(pattern))
    pool.cache_full_blocks(_Prompt(len(pattern), bs), ids, 0, len(pattern), 0)
    pool.evict_blocks([b for b, c in zip(ids, pattern, strict=True) if c != "X"])
    pool.free_blocks(ids)
    pool.check_invariants()
    return m, {i: b for i, (b, c) in enumerate(zip(ids, pattern, strict=True)) if c == "X"}


def _shape(hit: list[int], pos_of: dict[int, int]) -> list[str]:
    by_id = {b: i for i, b in pos_of.items()}
    return ["0" if not b else f"b{by_id[b]}" for b in hit]


# (window, block size, cached pattern, max_length, drop_last_hit, expected shape)
SLIDING_CASES = [
    # window 8, block 4: the run of ceil(7/4) = 2 blocks ending at the bound.
    (8, 4, "XXXX", 16, False, ["0", "0", "b2", "b3"]),
    (8, 4, "XXXX", 15, False, ["0", "b1", "b2"]),
    (8, 4, "XXXX", 3, False, []),
    # a miss right of the run: the rightmost run wins, trailing blocks trimmed.
    (8, 4, "XX.X", 16, False, ["b0", "b1"]),
    (8, 4, ".XX.X", 20, False, ["0", "b1", "b2"]),
    # no run of 2 anywhere: the run from block 0 counts, even if short.
    (8, 4, "X.X.", 16, False, ["b0"]),
    (8, 4, ".X.X", 16, False, []),
    # window 5, block 4: ceil(4/4) = 1 block suffices.
    (5, 4, "X..X", 16, False, ["0", "0", "0", "b3"]),
    # window 1: a token reads only itself, every block is skippable.
    (1, 4, "....", 16, False, ["0", "0", "0", "0"]),
    # drop_last_hit: one more contiguous block, then drop the last.
    (8, 4, "XXXX", 16, True, ["0", "b1", "b2"]),
    (8, 4, ".XXX", 16, True, ["0", "b1", "b2"]),
    (8, 4, "..XX", 16, True, ["b0"][:0]),  # only 2 contiguous, not from block 0
    (8, 4, "XX..", 16, True, ["b0"]),
    (8, 4, "XXX.XX", 24, True, ["b0", "b1"]),
]


@pytest.mark.parametrize(("window", "bs", "pattern", "max_length", "drop", "expected"),
                         SLIDING_CASES)
def test_sliding_window_lookup(window: int, bs: int, pattern: str, max_length: int,
                               drop: bool, expected: list[str]) -> None:
    m, pos_of = _manager(sliding(bs, window), pattern, drop=drop)
    assert isinstance(m, SlidingWindowManager)
    assert _shape(m.find_longest_cache_hit(HASHES, max_length), pos_of) == expected


# (chunk, block size, cached pattern, max_length, drop_last_hit, expected shape)
CHUNKED_CASES = [
    # The reference's examples: chunk 8, block 4.
    (8, 4, "XXXX", 15, False, ["0", "0", "b2"]),
    (8, 4, "XX.X", 15, False, ["0", "0"]),
    (8, 4, "....", 16, False, ["0", "0", "0", "0"]),
    # within the first chunk: a plain left-to-right prefix.
    (8, 4, "X.XX", 7, False, ["b0"]),
    (8, 4, ".XXX", 7, False, []),
    (8, 4, "XXXXXX", 23, False, ["0", "0", "0", "0", "b4"]),
    # drop_last_hit: a run from a chunk start, minus its last block.
    (8, 4, "XXXX", 15, True, ["0", "0"]),
    (8, 4, "..XX", 16, True, ["0", "0", "b2"]),
    (8, 4, "X...", 16, True, []),
    (8, 4, "XX..", 16, True, ["b0"]),
    (8, 4, "....", 16, True, []),
]


@pytest.mark.parametrize(("chunk", "bs", "pattern", "max_length", "drop", "expected"),
                         CHUNKED_CASES)
def test_chunked_local_lookup(chunk: int, bs: int, pattern: str, max_length: int,
                              drop: bool, expected: list[str]) -> None:
    m, pos_of = _manager(chunked(bs, chunk), pattern, drop=drop)
    assert isinstance(m, ChunkedLocalManager)
    assert _shape(m.find_longest_cache_hit(HASHES, max_length), pos_of) == expected


MAMBA_CASES = [
    ("XXXX", 16, False, ["0", "0", "0", "b3"]),
    ("XX..", 16, False, ["0", "b1"]),
    ("X.X.", 15, False, ["0", "0", "b2"]),
    ("XXXX", 3, False, []),
    ("....", 16, False, []),
    # drop_last_hit: the checkpoint after the hit must be cached too.
    ("XXXX", 16, True, ["0", "0", "b2"]),
    ("X.X.", 16, True, []),
    ("XX.X", 16, True, ["b0"]),
]


@pytest.mark.parametrize(("pattern", "max_length", "drop", "expected"), MAMBA_CASES)
def test_mamba_checkpoint_lookup(pattern: str, max_length: int, drop: bool,
                                 expected: list[str]) -> None:
    m, pos_of = _manager(mamba(4), pattern, drop=drop)
    assert isinstance(m, MambaCheckpointManager)
    assert _shape(m.find_longest_cache_hit(HASHES, max_length), pos_of) == expected


@pytest.mark.parametrize(("pattern", "max_length", "drop", "expected"), [
    ("XX.X", 16, False, ["b0", "b1"]),
    ("XXXX", 15, False, ["b0", "b1", "b2"]),
    ("XXXX", 15, True, ["b0", "b1"]),
])
def test_full_attention_lookup(pattern: str, max_length: int, drop: bool,
                               expected: list[str]) -> None:
    m, pos_of = _manager(full(4), pattern, drop=drop)
    assert type(m) is FullAttentionManager
    assert _shape(m.find_longest_cache_hit(HASHES, max_length), pos_of) == expected


def test_kinds_that_never_hit() -> None:
    spec = mamba(4, checkpoints=False)
    assert manager_class_for(spec, enable_caching=False) is MambaManager
    m = MambaManager(spec, BlockPool(8, hash_block_size=4), 0)
    assert m.find_longest_cache_hit(HASHES, 16) == []
    m, _ = _manager(cross(4, 100), "XXXX")
    assert isinstance(m, CrossAttentionManager)
    assert m.find_longest_cache_hit(HASHES, 16) == []


def test_mamba_align_lookup_takes_the_rightmost_state() -> None:
    """Align mode (caching on): the deepest cached state within the bound, nulls before
    it; no run is needed (a state summarises its whole prefix)."""
    m, pos = _manager(mamba(4, checkpoints=False), "X_X_")
    assert type(m) is MambaAlignManager
    assert _shape(m.find_longest_cache_hit(HASHES, 16), pos) == ["0", "0", "b2"]
    assert _shape(m.find_longest_cache_hit(HASHES, 11), pos) == ["b0"]
    assert m.find_longest_cache_hit(HASHES, 3) == []


# (kind, computed tokens) -> skipped tokens
@pytest.mark.parametrize(("spec", "computed", "skipped"), [
    (sliding(4, 8), 7, 0), (sliding(4, 8), 8, 1), (sliding(4, 8), 13, 6),
    (chunked(4, 8), 7, 0), (chunked(4, 8), 8, 8), (chunked(4, 8), 13, 8),
    (mamba(64), 0, 0), (mamba(64), 64, 0), (mamba(64), 65, 64), (mamba(64), 130, 128),
])
def test_skipped_tokens(spec: KVCacheSpec, computed: int, skipped: int) -> None:
    m, _ = _manager(spec, "")
    assert m.num_skipped_tokens(computed) == skipped  # type: ignore[attr-defined]


def test_chunk_must_be_a_multiple_of_the_block_size() -> None:
    with pytest.raises(InvalidArgumentError, match="multiple of the block size 16"):
        _manager(chunked(16, 24), "")
