"""Each compiled hybrid kernel (``pagedkv/_csrc/ccore_hybrid*.h``) against its pure twin
in :mod:`pagedkv.core.kernels_hybrid`: same values, same changes, same errors; and the
hasher's compiled keyed path against the pure hasher."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import BlockHasher
from pagedkv.core import kernels_hybrid, native
from pagedkv.core.hashing import HashExtras, LoRA, MultiModalItem

ccore = native.active()
pytestmark = pytest.mark.skipif(
    ccore is None, reason=f"compares compiled kernels with pure ones ({native.IMPORT_ERROR})")

TAILS = [b"\xf6", b"\x81\x63abc", b"\x82\x01\x02" * 30, b""]


def _outcome(fn: Any, hashes: list[bytes], *args: Any) -> tuple[Any, list[bytes]]:
    try:
        return fn(hashes, *args), hashes
    except (TypeError, ValueError) as exc:
        return (type(exc), str(exc)), hashes


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.one_of(st.integers(0, (1 << 17) + 5), st.integers(-3, 30)),
                    max_size=40),
    block_size=st.integers(-1, 9),
    start_blocks=st.integers(-1, 4),
    num_blocks=st.integers(0, 6),
    parent=st.sampled_from([bytes(32), b"\x07" * 32, b"short", "str"]),
    tails=st.lists(st.sampled_from(TAILS + ["text"]), max_size=7),
    hashes_before=st.integers(0, 2),
)
def test_hash_keyed_equals_its_twin(tokens: list[int], block_size: int, start_blocks: int,
                                    num_blocks: int, parent: Any, tails: list[Any],
                                    hashes_before: int) -> None:
    start = start_blocks * block_size
    stop = start + num_blocks * block_size
    if len(tails) == num_blocks and num_blocks and tails[0] == "text":
        tails = [b"\xf6"] * num_blocks  # mostly well-formed calls
    before = [bytes([i]) * 32 for i in range(hashes_before)]
    c = _outcome(ccore.hash_keyed, list(before), tokens, start, stop, block_size, parent,
                 list(tails))
    p = _outcome(kernels_hybrid.hash_keyed, list(before), tokens, start, stop, block_size,
                 parent, list(tails))
    assert c == p


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3000), min_size=0, max_size=70),
    bs=st.sampled_from([1, 4, 8, 16]),
    lora=st.sampled_from([None, ("sql", 3, "/a"), ("sql", 3, "/b")]),
    mm=st.lists(st.tuples(st.sampled_from(["img-a", "img-b"]), st.integers(0, 60),
                          st.integers(1, 12)), max_size=3),
    salt=st.sampled_from([None, "", "tenant"]),
    split=st.integers(0, 70),
    record=st.booleans(),
)
def test_compiled_keyed_hashing_equals_the_pure_hasher(
        tokens: list[int], bs: int, lora: Any, mm: list[tuple[str, int, int]],
        salt: str | None, split: int, record: bool) -> None:
    extras = HashExtras(lora=None if lora is None else LoRA(*lora),
                        mm_items=tuple(MultiModalItem(*m) for m in mm), cache_salt=salt)
    compiled = BlockHasher(bs, memo_blocks=0)
    with native.forced_pure():
        pure = BlockHasher(bs)
    assert compiled._keyed is not None and pure._keyed is None
    out: list[tuple[list[bytes], list[Any] | None]] = []
    for hasher in (compiled, pure):
        hashes: list[bytes] = []
        keys: list[Any] | None = [] if record else None
        hasher.extend(hashes, tokens[:split], extras, keys)  # in two calls, as a request
        hasher.extend(hashes, tokens, extras, keys)
        out.append((hashes, keys))
    assert out[0] == out[1]
    assert len(out[0][0]) == len(tokens) // bs


def test_a_token_off_the_table_falls_back_and_still_agrees() -> None:
    extras = HashExtras(lora=LoRA("sql", 3, "/a"))
    tokens = [5, 1 << 20, 7, 9, 11, 13, 15, 17]
    hashes: list[bytes] = []
    assert not ccore.hash_keyed([], tokens, 0, 8, 4, bytes(32), [b"\xf6", b"\xf6"])
    BlockHasher(4).extend(hashes, tokens, extras)
    with native.forced_pure():
        expected: list[bytes] = []
        BlockHasher(4).extend(expected, tokens, extras)
    assert hashes == expected and len(hashes) == 2
