"""Each compiled kernel of :mod:`pagedkv.core.kernels_hybrid_lookup`
(``pagedkv/_csrc/ccore_hybrid_lookup_*.h``) against its pure twin: same values, same
changes, and ``None`` with nothing changed exactly where its contract says."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.core import kernels_hybrid_lookup, native
from pagedkv.core.hashing import BlockHasher, HashExtras, LoRA, MultiModalItem

ccore = native.active()
pytestmark = pytest.mark.skipif(
    ccore is None, reason=f"compares compiled kernels with pure ones ({native.IMPORT_ERROR})")

TEXT = st.text(alphabet=st.sampled_from("ab\u00e9\u4e2d\U0001f600"), max_size=30)

extras_st = st.builds(
    HashExtras,
    lora=st.none() | st.builds(LoRA, name=TEXT, adapter_id=st.integers(0, 9),
                               path=TEXT | st.just("p" * 300)),
    mm_items=st.lists(st.builds(MultiModalItem, identifier=TEXT,
                                offset=st.integers(0, 70), length=st.integers(1, 40)),
                      max_size=4).map(tuple),
    cache_salt=st.none() | TEXT,
)


@settings(max_examples=400, deadline=None)
@given(extras=extras_st, block_size=st.integers(1, 17), start_blocks=st.integers(0, 5),
       num_blocks=st.integers(0, 8), with_keys=st.booleans(),
       keys_before=st.integers(0, 2))
def test_extra_tails_equals_its_twin(extras: HashExtras, block_size: int, start_blocks: int,
                                     num_blocks: int, with_keys: bool,
                                     keys_before: int) -> None:
    assert ccore is not None
    start = start_blocks * block_size
    stop = start + num_blocks * block_size
    before: list[Any] = [["x"]] * keys_before
    pure_keys = list(before) if with_keys else None
    c_keys = list(before) if with_keys else None
    want = kernels_hybrid_lookup.extra_tails(extras, start, stop, block_size, pure_keys)
    got = ccore.extra_tails(extras, start, stop, block_size, c_keys)
    assert got == want
    assert c_keys == pure_keys


@pytest.mark.parametrize("extras", [
    HashExtras(prompt_embeds=(b"e",) * 8),
    HashExtras(lora=LoRA("a", 1, None)),  # type: ignore[arg-type]
    HashExtras(mm_items=(MultiModalItem("\ud800", 0, 2),)),  # not UTF-8 encodable
])
def test_extra_tails_not_covered_changes_nothing(extras: HashExtras) -> None:
    assert ccore is not None
    keys: list[Any] = [None]
    assert ccore.extra_tails(extras, 0, 8, 4, keys) is None
    assert keys == [None]


def test_extra_tails_bad_range_is_not_covered() -> None:
    assert ccore is not None
    extras = HashExtras(cache_salt="s")
    assert ccore.extra_tails(extras, 0, 7, 4, None) is None
    assert ccore.extra_tails(extras, 0, 8, 0, None) is None
    with pytest.raises(TypeError):
        ccore.extra_tails(extras, 0, 8)  # type: ignore[call-arg]


@settings(max_examples=150, deadline=None)
@given(extras=extras_st, tokens=st.lists(st.integers(0, 1000), max_size=60),
       block_size=st.integers(1, 9))
def test_keyed_hashes_and_keys_equal_the_pure_hasher(extras: HashExtras, tokens: list[int],
                                                     block_size: int) -> None:
    """The compiled hasher (extra_tails then hash_keyed) against the pure hasher."""
    if extras.is_empty:
        return
    with native.forced_pure():
        pure = BlockHasher(block_size)
    compiled = BlockHasher(block_size)
    out: list[tuple[list[bytes], list[Any]]] = []
    for hasher in (pure, compiled):
        hashes: list[bytes] = []
        keys: list[Any] = []
        hasher.extend(hashes, tokens, extras=extras, keys_out=keys)
        out.append((hashes, keys))
    assert out[0] == out[1]
