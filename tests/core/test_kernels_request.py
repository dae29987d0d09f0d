"""The request's compiled hashing kernels (``pagedkv/_csrc/ccore_request.h``) against
their pure twins in :mod:`pagedkv.core.kernels_request`: same values, same changes, and
``None`` (or False) with nothing changed exactly where their contracts say; and a
:class:`Request` built and grown on the compiled core equal to one on the pure core."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.core import kernels_request, native
from pagedkv.core.hashing import BlockHasher, HashExtras, LoRA, MultiModalItem
from pagedkv.core.request import Request
from pagedkv.errors import InvalidArgumentError

ccore = native.active()
pytestmark = pytest.mark.skipif(
    ccore is None, reason=f"compares compiled kernels with pure ones ({native.IMPORT_ERROR})")

TEXT = st.text(alphabet=st.sampled_from("ab\u00e9\u4e2d\U0001f600"), max_size=30)
SEED = BlockHasher(4).seed

extras_st = st.none() | st.builds(
    HashExtras,
    lora=st.none() | st.builds(LoRA, name=TEXT, adapter_id=st.integers(0, 9),
                               path=TEXT | st.just("p" * 300)),
    mm_items=st.lists(st.builds(MultiModalItem, identifier=TEXT,
                                offset=st.integers(0, 70), length=st.integers(1, 40)),
                      max_size=4).map(tuple),
    cache_salt=st.none() | TEXT,
)
# Ids of every CBOR width, the compiled kernel's limit (2**32) and beyond.
token_st = st.integers(0, 30) | st.integers(0, 70000) | st.sampled_from(
    [23, 24, 255, 256, 65535, 65536, (1 << 17) - 1, 1 << 17, (1 << 32) - 1, 1 << 32,
     (1 << 64) - 1])


def _both(tokens: Any, block_size: int, seed: bytes, extras: HashExtras | None,
          with_keys: bool) -> None:
    """Both kernels on their own copies of the same lists: where the compiled one
    answers, the same answer and changes; where it answers None, nothing changed."""
    assert ccore is not None
    before: list[Any] = [b"x" * 32]
    keys_before: list[Any] = [["k"]]
    p_hashes, c_hashes = list(before), list(before)
    p_keys = list(keys_before) if with_keys else None
    c_keys = list(keys_before) if with_keys else None
    got = ccore.start_request(c_hashes, tokens, block_size, seed, extras, c_keys)
    if got is None:
        assert c_hashes == before
        assert c_keys == (keys_before if with_keys else None)
        return
    want = kernels_request.start_request(p_hashes, tokens, block_size, seed, extras, p_keys)
    assert got == want
    assert type(got) is list and got is not tokens
    assert c_hashes == p_hashes
    assert c_keys == p_keys


@settings(max_examples=400, deadline=None)
@given(tokens=st.lists(token_st, max_size=80), block_size=st.integers(1, 17),
       extras=extras_st, with_keys=st.booleans(), as_tuple=st.booleans())
def test_start_request_equals_its_twin(tokens: list[int], block_size: int,
                                       extras: HashExtras | None, with_keys: bool,
                                       as_tuple: bool) -> None:
    _both(tuple(tokens) if as_tuple else tokens, block_size, SEED, extras, with_keys)


def test_start_request_covers_the_common_inputs() -> None:
    assert ccore is not None
    hashes: list[bytes] = []
    keys: list[Any] = []
    extras = HashExtras(lora=LoRA("a", 1, "p"), cache_salt="s",
                        mm_items=(MultiModalItem("img", 3, 4),))
    got = ccore.start_request(hashes, list(range(2000)), 16, SEED, extras, keys)
    assert got == list(range(2000)) and len(hashes) == len(keys) == 125
    hashes.clear()
    assert ccore.start_request(hashes, [(1 << 32) - 1] * 8, 4, SEED, None, None) is not None
    assert len(hashes) == 2
    huge = 1 << 62  # no full block: nothing sized by the block
    for extras in (None, HashExtras(cache_salt="s")):
        assert ccore.start_request([], [1, 2], huge, SEED, extras, []) == [1, 2]
        assert ccore.extend_request([], [1, 2], huge, SEED, extras, []) is True


@pytest.mark.parametrize("tokens, seed, extras", [
    ([], SEED, None),                                     # empty
    ([1, 2, True, 4], SEED, None),                        # not an exact int
    ([1, 2, 3, -1], SEED, None),                          # not an id
    ([1, 2, 3, 1 << 32], SEED, None),                     # past the compiled limit
    ([1, 2, 3, 4.0], SEED, None),
    (range(8), SEED, None),                               # not a list or tuple
    ([1, 2, 3, 4], b"short", None),                       # a seed of another length
    ([1, 2, 3, 4], SEED, HashExtras(prompt_embeds=(b"e",) * 4)),
    ([1, 2, 3, 4], SEED, HashExtras(lora=LoRA("a", 1, None))),  # type: ignore[arg-type]
    ([1, 2, 3, 4], SEED, HashExtras(cache_salt="x", mm_items=(
        MultiModalItem("\ud800", 0, 2),))),               # not UTF-8 encodable
    ([1, 2, 3, 4], SEED, object()),                       # not the HashExtras shape
])
def test_start_request_not_covered_changes_nothing(tokens: Any, seed: bytes,
                                                   extras: Any) -> None:
    assert ccore is not None
    hashes: list[bytes] = [b"h"]
    keys: list[Any] = [None]
    assert ccore.start_request(hashes, tokens, 2, seed, extras, keys) is None
    assert hashes == [b"h"] and keys == [None]


def test_start_request_bad_arguments_raise_like_the_twin() -> None:
    assert ccore is not None
    for fn in (ccore.start_request, kernels_request.start_request):
        with pytest.raises(TypeError):
            fn((), [1], 1, SEED, None, None)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            fn([], [1], 1, SEED, None, ())  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            fn([], [1], 0, SEED, None, None)
    with pytest.raises(TypeError):
        ccore.start_request([], [1], 1)  # type: ignore[call-arg]
    for fn2 in (ccore.extend_request, kernels_request.extend_request):
        with pytest.raises(TypeError):
            fn2((), [1], 1, SEED, None, None)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            fn2([], [1], 1, SEED, None, ())  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            fn2([], [1], 0, SEED, None, None)
    with pytest.raises(TypeError):
        ccore.extend_request([], [1], 1)  # type: ignore[call-arg]


@settings(max_examples=400, deadline=None)
@given(tokens=st.lists(token_st, max_size=80), block_size=st.integers(1, 17),
       done_blocks=st.integers(0, 6), extras=extras_st, with_keys=st.booleans(),
       as_tuple=st.booleans(), foreign_parent=st.booleans())
def test_extend_request_equals_its_twin(tokens: list[int], block_size: int, done_blocks: int,
                                        extras: HashExtras | None, with_keys: bool,
                                        as_tuple: bool, foreign_parent: bool) -> None:
    """Blocks already hashed (``done_blocks`` of them, digests or a parent of another
    length), then both kernels on copies."""
    assert ccore is not None
    before = [bytes([k]) * 32 for k in range(done_blocks)]
    if foreign_parent and before:
        before[-1] = b"short"
    keys_before: list[Any] = [["k"]] * done_blocks
    seq: Any = tuple(tokens) if as_tuple else tokens
    p_hashes, c_hashes = list(before), list(before)
    p_keys = list(keys_before) if with_keys else None
    c_keys = list(keys_before) if with_keys else None
    got = ccore.extend_request(c_hashes, seq, block_size, SEED, extras, c_keys)
    if not got:
        assert got is False
        assert c_hashes == before
        assert c_keys == (keys_before if with_keys else None)
        return
    assert got is True
    assert kernels_request.extend_request(p_hashes, seq, block_size, SEED, extras, p_keys)
    assert c_hashes == p_hashes
    assert c_keys == p_keys


@pytest.mark.parametrize("tokens, hashes, extras, want", [
    ([1, 2, 3], [], None, True),                          # no full block: done
    (range(8), [], None, False),                          # not a list or tuple
    ([1, 2, True, 4], [], None, False),                   # a new block's id not an int
    ([True, 2, 3, 4], [SEED], None, True),                # ... only new blocks are read
    ([1, 2, 3, 1 << 32], [], None, False),                # past the compiled limit
    ([1, 2, 3, 4], [], HashExtras(prompt_embeds=(b"e",) * 4), False),
    ([1, 2, 3, 4, 5, 6], [b"short"], None, False),        # a parent of another length
    ([1, 2, 3, 4], [], object(), False),                  # not the HashExtras shape
])
def test_extend_request_coverage(tokens: Any, hashes: list[bytes], extras: Any,
                                 want: bool) -> None:
    assert ccore is not None
    before = list(hashes)
    keys: list[Any] = [None] * len(hashes)
    assert ccore.extend_request(hashes, tokens, 2, SEED, extras, keys) is want
    if not want:
        assert hashes == before and keys == [None] * len(before)


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(token_st, max_size=60), block_size=st.integers(1, 9),
       extras=extras_st, secret=st.none() | st.binary(max_size=8),
       outputs=st.lists(st.lists(token_st, max_size=9) | token_st, max_size=6))
def test_request_on_the_compiled_core_equals_the_pure_core(
        tokens: list[int], block_size: int, extras: HashExtras | None,
        secret: bytes | None, outputs: list[Any]) -> None:
    """A Request (the kernels' one caller) built and grown both ways: same tokens,
    hashes, keys, extras, or the same error."""
    built: list[Any] = []
    for pure in (False, True):
        with native.forced_pure() if pure else nullcontext():
            hasher = BlockHasher(block_size, secret_seed=secret)
            assert (hasher._start is None) == (hasher._step is None) == pure
            try:
                r = Request("r", tokens, hasher=hasher, hash_extras=extras)
                for out in outputs:
                    r.append_output_tokens(out)
            except InvalidArgumentError as exc:
                built.append(str(exc))
                continue
        built.append((r.all_token_ids, r.block_hashes, r.block_extra_keys, r.hash_extras,
                      r.num_prompt_tokens))
    assert built[0] == built[1]
