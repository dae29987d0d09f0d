"""The compiled core against the pure-Python reference, in one process.

``pagedkv.core.native.forced_pure()`` builds pure objects beside compiled ones, so every
test here drives both: the C SHA-256 against hashlib (both compression functions), the C
block-hash loop against the pure one (digests; the compiled core leaves the hash memo
empty), the C free queue's restore checks, the compiled allocation's copies, and a
regression of the eviction count. Each kernel alone against its specification is
test_kernels_each.py; whole managers side by side, step by step, on every layout, the
one differential machine test_kernels_differential.py; every public call's documented
error raised the same way by both, ``test_core_native_errors.py``.

Without the compiled core (not built, or ``PAGEDKV_PURE=1``) they skip: there is nothing
to compare. ``PAGEDKV_REQUIRE_COMPILED=1`` (CI's first pass) makes that a failure.
"""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
import random
import weakref
from collections.abc import Iterator
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv import FullAttentionSpec, KVCacheManager
from pagedkv.core import native
from pagedkv.core.hashing import BlockHasher
from pagedkv.core.kernels import PURE
from pagedkv.core.pool import BlockPool

ccore = native.module()
pytestmark = pytest.mark.skipif(ccore is None or native.active() is None,
                                reason=f"no compiled core: {native.IMPORT_ERROR}")


def test_compiled_core_is_built_when_required() -> None:
    if os.environ.get("PAGEDKV_REQUIRE_COMPILED") == "1":
        assert native.CORE == "compiled", native.IMPORT_ERROR


@pytest.fixture(params=["shani", "portable"])
def sha_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each SHA-256 compression function in turn (SHA-NI only where the CPU has it)."""
    assert ccore is not None
    detected = ccore.sha256_mode(False)
    if request.param == "shani" and detected != "shani":
        pytest.skip("this CPU has no SHA extensions")
    ccore.sha256_mode(request.param == "portable")
    yield request.param
    ccore.sha256_mode(False)


def test_sha256_equals_hashlib_at_every_padding_length(sha_mode: str) -> None:
    assert ccore is not None
    rng = random.Random(7)
    for n in [*range(0, 260), 1000, 4095, 4096, 65537]:
        data = rng.randbytes(n)
        assert ccore.sha256(data) == hashlib.sha256(data).digest(), (sha_mode, n)
    # FIPS 180-4 examples (NIST CSRC): "abc" and the 448-bit two-block message.
    assert ccore.sha256(b"abc").hex() == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    assert ccore.sha256(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").hex() == (
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")


def hasher_pair(block_size: int, memo_blocks: int) -> tuple[BlockHasher, BlockHasher]:
    compiled = BlockHasher(block_size, memo_blocks=memo_blocks)
    with native.forced_pure():
        pure = BlockHasher(block_size, memo_blocks=memo_blocks)
    assert compiled._plain is not PURE.hash_plain and pure._plain is PURE.hash_plain
    return compiled, pure


token_ids = st.one_of(
    st.integers(0, 300),                      # 1- and 2-byte CBOR heads
    st.integers(0, (1 << 17) - 1),            # up to the 4-byte head
    st.integers(1 << 17, (1 << 64) - 1),      # past the fast table: the pure path takes it
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    block_size=st.sampled_from([1, 2, 3, 16, 48, 1000, 1100]),
    memo_blocks=st.sampled_from([0, 1, 3, 64, 16384]),
    prompts=st.lists(st.tuples(st.lists(token_ids, max_size=60), st.integers(1, 40)),
                     min_size=1, max_size=6),
    prefix_len=st.integers(0, 2500),
)
def test_block_hashes_equal_memo_unused(block_size: int, memo_blocks: int,
                                        prompts: list[tuple[list[int], int]],
                                        prefix_len: int) -> None:
    compiled, pure = hasher_pair(block_size, memo_blocks)
    rng = random.Random(prefix_len)
    shared = [rng.randrange(32000) for _ in range(prefix_len)]  # long: several chunks
    for tail, step in prompts:
        tokens = shared + tail
        a: list[bytes] = []
        b: list[bytes] = []
        for end in [*range(0, len(tokens), step * block_size), len(tokens)]:
            compiled.extend(a, tokens[:end])
            pure.extend(b, tokens[:end])
            assert a == b
    # The compiled core hashes every plain block in C, without the memo (only ids past its
    # token table take the pure path, which may fill it).
    if all(t < 1 << 17 for tail, _ in prompts for t in tail):
        assert not compiled._memo and not compiled._memo_old


def test_bad_parent_and_non_list_tokens_take_the_pure_path() -> None:
    compiled, pure = hasher_pair(4, 64)
    for parent in (b"short", b"x" * 33):
        a, b = [parent], [parent]
        compiled.extend(a, list(range(20)))
        pure.extend(b, list(range(20)))
        assert a == b
    a, b = [], []
    compiled.extend(a, tuple(range(20)))
    pure.extend(b, range(20))
    assert a == b and len(a) == 5


SPEC = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=4, dtype_bytes=2)
PREFIXES = [[1000 + i for i in range(12)], [(1 << 17) + i for i in range(8)], [5] * 9, []]


def manager_pair(**fields: Any) -> tuple[KVCacheManager, KVCacheManager]:
    fields = {"num_blocks": 14, "max_model_len": 64, **fields}
    compiled = KVCacheManager.from_spec(SPEC, **fields)
    with native.forced_pure():
        pure = KVCacheManager.from_spec(SPEC, **fields)
    assert compiled.hasher._plain is not PURE.hash_plain
    assert pure.hasher._plain is PURE.hash_plain
    return compiled, pure


def test_eviction_of_a_duplicated_key_is_counted_once() -> None:
    """Found by a compiled-vs-pure machine: an allocation takes a cached block whose key
    has a duplicate (the pool's ``_evict`` path, which counts the eviction itself) and
    then the duplicate (evicted inline by the take kernel, which returns its count): each
    eviction counted once, on both cores."""
    req = SimpleNamespace(block_hashes=[b"k" * 32])
    pools = []
    for pure in (False, True):
        with native.forced_pure() if pure else nullcontext():
            pool = BlockPool(4, hash_block_size=4)
        assert pool.get_new_blocks(3) == [1, 2, 3]
        pool.cache_full_blocks(cast(Any, req), [1], 0, 1, 0)
        pool.cache_full_blocks(cast(Any, req), [2], 0, 1, 0)  # a duplicate of block 1
        pool.free_blocks([1, 2, 3])
        assert pool.get_new_blocks(3) == [3, 1, 2]
        assert pool.num_evicted_blocks == 2
        pool.check_invariants()
        pools.append(pool)
    assert pools[0].debug_state() == pools[1].debug_state()


def test_free_queue_restore_refuses_corrupt_links() -> None:
    """A pickled queue comes back equal; tampered links are refused before any use."""
    import struct

    assert ccore is not None
    q = ccore.FreeQueue(8, first_id=1)
    q.remove(3)
    q.append(3)
    restore, (n, nxt, prv, num_free) = q.__reduce__()
    assert restore(n, nxt, prv, num_free).to_list() == q.to_list() == pickle.loads(
        pickle.dumps(q)).to_list()

    def with_link(links: bytes, slot: int, value: int) -> bytes:
        out = bytearray(links)
        struct.pack_into("=i", out, 4 * slot, value)
        return bytes(out)

    corrupt = [
        (with_link(nxt, 1, 10**6), prv, num_free),  # a link far outside the arrays
        (with_link(nxt, 1, -5), prv, num_free),
        (nxt, with_link(prv, 2, 10**6), num_free),
        (with_link(nxt, 2, 1), prv, num_free),  # a cycle: 1 -> 2 -> 1
        (nxt, prv, num_free + 1),  # a wrong count
        (nxt, prv, -1),
    ]
    for links_next, links_prev, count in corrupt:
        with pytest.raises(ValueError, match="corrupt"):
            restore(n, links_next, links_prev, count)


def test_compiled_allocate_slots_survives_copy_and_pickle() -> None:
    """The compiled ``allocate_slots`` is rebuilt for a copy (deepcopy, pickle) and binds
    the copy, whose allocations then equal the original's."""
    mgr, _ = manager_pair()
    assert type(mgr.allocate_slots).__name__ == "DecodeAllocate"
    req = mgr.new_request("a", list(range(6)))
    assert mgr.allocate_slots(req, 6) == ([1, 2],)
    req.num_computed_tokens = 6
    for twin in (copy.deepcopy(mgr), pickle.loads(pickle.dumps(mgr))):
        assert type(twin.allocate_slots).__name__ == "DecodeAllocate"
        assert twin.allocate_slots.manager is twin
        assert twin.cache_blocks.__self__ is twin.allocate_slots
        assert twin.debug_state() == mgr.debug_state()
        twin_req = twin.live_requests["a"]
        twin_req.append_output_tokens([7, 8, 9])
        assert twin.allocate_slots(twin_req, 3) == ([3],)
        twin.check_invariants()
    assert mgr.num_free_blocks == 11
    # No reference cycle through the compiled attribute: the manager goes with its last name.
    gone = weakref.ref(mgr)
    del mgr, req, twin, twin_req
    assert gone() is None


def test_allocate_slots_after_its_manager_is_freed_is_a_documented_error() -> None:
    """A kept ``mgr.allocate_slots`` outliving its manager raises the documented
    InvalidArgumentError naming the fix, not a raw ReferenceError (the compiled attribute
    holds its manager weakly so that a manager is freed with its last name)."""
    from pagedkv.errors import InvalidArgumentError

    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    mgr = KVCacheManager.from_spec(spec, num_blocks=12, max_model_len=64)
    req = mgr.new_request("a", prompt_token_ids=list(range(6)))
    assert mgr.allocate_slots(req, 6) is not None
    req.num_computed_tokens = 6
    req.append_output_tokens([1])
    allocate = mgr.allocate_slots
    assert type(allocate).__name__ == "DecodeAllocate"
    del mgr
    for call in (lambda: allocate(req, 1), lambda: allocate(req, 1, num_lookahead_tokens=0)):
        with pytest.raises(InvalidArgumentError, match="keep a reference to the manager"):
            call()
