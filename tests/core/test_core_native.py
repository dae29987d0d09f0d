"""The compiled core against the pure-Python reference, in one process.

``pagedkv.core.native.forced_pure()`` builds pure objects beside compiled ones, so every
test here drives both: the C SHA-256 against hashlib (both compression functions), the C
block-hash loop against the pure one (digests; the compiled core leaves the hash memo
empty), a Hypothesis
state machine running a compiled-core manager and a pure-core manager side by side
(every return value and ``debug_state()`` compared after each step), and every public
call's documented error raised the same way by both (``test_core_native_errors.py``).

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
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedkv import FullAttentionSpec, KVCacheManager, Request
from pagedkv.core import native
from pagedkv.core.hashing import BlockHasher
from pagedkv.core.kernels import PURE

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
    assert compiled.hasher._plain is not PURE.hash_plain and pure.hasher._plain is PURE.hash_plain
    return compiled, pure


def hit_view(hit: Any) -> tuple[Any, int]:
    return hit.block_ids, hit.num_computed_tokens


class CompiledVsPure(RuleBasedStateMachine):
    """Every call made on both managers; every answer and the whole state compared."""

    def __init__(self) -> None:
        super().__init__()
        self.mgrs = manager_pair(hash_memo_blocks=6)
        # The compiled manager takes a running request's plain call in C (fast_paths).
        assert type(self.mgrs[0].allocate_slots).__name__ == "DecodeAllocate"
        assert type(self.mgrs[1].allocate_slots).__name__ == "method"
        assert type(self.mgrs[0].cache_blocks).__name__ == "builtin_function_or_method"
        self.waiting: list[tuple[Request, Request]] = []
        self.running: list[tuple[Request, Request]] = []
        self.counter = 0

    def both(self, call: Any) -> Any:
        """``call(manager, index)`` on both; the answers (or errors) must be equal."""
        out = []
        for i, mgr in enumerate(self.mgrs):
            try:
                out.append(("ok", call(mgr, i)))
            except Exception as exc:  # compared, not swallowed
                out.append(("error", (type(exc), str(exc))))
        assert out[0] == out[1]
        return out[0][1]

    @rule(prefix=st.sampled_from(range(len(PREFIXES))),
          suffix=st.lists(st.integers(0, 300), min_size=1, max_size=13))
    def new_request(self, prefix: int, suffix: list[int]) -> None:
        self.counter += 1
        rid = f"r{self.counter}"
        reqs = [m.new_request(rid, PREFIXES[prefix] + suffix) for m in self.mgrs]
        assert reqs[0].block_hashes == reqs[1].block_hashes
        self.waiting.append((reqs[0], reqs[1]))

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100), delay=st.booleans())
    def admit(self, i: int, delay: bool = False) -> None:
        """``delay``: the blocks wait for a ``cache_blocks`` call (KV arriving later)."""
        pair = self.waiting[i % len(self.waiting)]
        hits = [m.get_computed_blocks(pair[k]) for k, m in enumerate(self.mgrs)]
        assert hit_view(hits[0]) == hit_view(hits[1])
        n_new = pair[0].num_tokens - hits[0].num_computed_tokens
        new = self.both(lambda m, k: m.allocate_slots(pair[k], n_new,
                                                      new_computed_blocks=hits[k],
                                                      delay_caching=delay))
        if new is not None:
            for req in pair:
                req.num_computed_tokens = req.num_tokens
            self.waiting.remove(pair)
            self.running.append(pair)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), tokens=st.lists(st.integers(0, 1 << 18), min_size=1,
                                                 max_size=6))
    def decode(self, i: int, tokens: list[int]) -> None:
        pair = self.running[i % len(self.running)]
        if pair[0].num_tokens + len(tokens) > 64:
            return
        for req in pair:
            req.append_output_tokens(tokens)
        assert pair[0].block_hashes == pair[1].block_hashes
        self.both(lambda m, k: m.allocate_slots(pair[k], len(tokens)))
        for req in pair:
            req.num_computed_tokens = req.num_tokens

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.sampled_from([0, -1, 1, 2, 10**9, True, 1.0, None]),
          computed=st.sampled_from([None, -1, 0, 1, 10**9, 1.5, "x"]))
    def odd_decode(self, i: int, n: Any, computed: Any) -> None:
        """allocate_slots(request, n) with counts the compiled entry point must hand to the
        Python method (which raises the documented error), or takes itself."""
        pair = self.running[i % len(self.running)]
        saved = [r.num_computed_tokens for r in pair]
        if computed is not None:
            for req in pair:
                req.num_computed_tokens = computed
        try:
            self.both(lambda m, k: m.allocate_slots(pair[k], n))
        finally:
            for req, c in zip(pair, saved, strict=True):
                req.num_computed_tokens = c

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.integers(1, 6), delta=st.integers(-2, 2),
          in_flight=st.sampled_from([None, 0, 1, 2, 100, -1, True, 1.0]),
          lenient=st.sampled_from([None, True, False, 1]),
          other=st.booleans())
    def engine_decode(self, i: int, n: int, delta: int, in_flight: Any, lenient: Any,
                      other: bool) -> None:
        """An engine's counting (vLLM 0.33's async scheduling: the in-flight token counted
        as computed, new tokens past the request's): ``num_in_flight_tokens`` and
        ``lenient_counts`` as keywords, which the compiled entry point takes itself when
        they are in range, else hands to the Python method; ``other`` adds a keyword it
        never takes."""
        pair = self.running[i % len(self.running)]
        saved = [r.num_computed_tokens for r in pair]
        kwargs: dict[str, Any] = {}
        if in_flight is not None:
            kwargs["num_in_flight_tokens"] = in_flight
        if lenient is not None:
            kwargs["lenient_counts"] = lenient
        if other:
            kwargs["reserved_blocks"] = 0
        for req in pair:
            req.num_computed_tokens = max(0, req.num_tokens + delta)
        try:
            self.both(lambda m, k: m.allocate_slots(pair[k], n, **kwargs))
        finally:
            for req, c in zip(pair, saved, strict=True):
                req.num_computed_tokens = c

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.sampled_from([0, 1, 4, 15, 16, 17, 33, 64, 10**9, -1,
                                                     True, 2.0, None]))
    def cache_blocks(self, i: int, n: Any) -> None:
        """cache_blocks, which the compiled manager's ``cache_blocks`` takes in C for a
        plain count within the request's slots and hands to Python otherwise."""
        pair = self.running[i % len(self.running)]
        self.both(lambda m, k: m.cache_blocks(pair[k], n))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def finish(self, i: int) -> None:
        pair = self.running.pop(i % len(self.running))
        self.both(lambda m, k: m.free(pair[k]))

    @rule(ids=st.lists(st.integers(0, 15), max_size=3))
    def evict(self, ids: list[int]) -> None:
        self.both(lambda m, k: m.evict_blocks(ids))

    @rule()
    def reset(self) -> None:
        self.both(lambda m, k: m.reset_prefix_cache())

    @rule()
    def queries(self) -> None:
        self.both(lambda m, k: (m.num_free_blocks, m.usage, m.num_evicted_blocks,
                                m.make_prefix_cache_stats(), m.take_new_block_ids()))

    @invariant()
    def same_state(self) -> None:
        assert self.mgrs[0].debug_state() == self.mgrs[1].debug_state()
        for mgr in self.mgrs:
            mgr.check_invariants()


TestCompiledVsPure = CompiledVsPure.TestCase
TestCompiledVsPure.settings = settings(max_examples=200, stateful_step_count=40,
                                       deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])


def test_eviction_of_a_duplicated_key_is_counted_once() -> None:
    """Found by the machine above: a decode's new block evicts a cached block whose key has
    a duplicate (the pool's ``_evict`` path, which counts the eviction itself, beside the
    compiled take loop's inline count): both cores count it once."""
    machine = CompiledVsPure()
    machine.new_request(prefix=0, suffix=[0])
    machine.admit(i=0)
    machine.finish(i=0)
    machine.evict(ids=[1])
    machine.new_request(prefix=1, suffix=[0, 0, 0, 0])
    machine.admit(i=0)
    machine.new_request(prefix=0, suffix=[0] * 9)
    machine.admit(i=0)
    machine.decode(i=0, tokens=[0, 0, 0, 0, 0])
    machine.same_state()
    assert machine.mgrs[0].num_evicted_blocks == 2


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(2, 40),
       ops=st.lists(st.tuples(st.sampled_from(["pop", "pop_n", "remove", "append", "append_n",
                                                "prepend_n"]),
                              st.integers(0, 1000)), max_size=60))
def test_free_queue_equals_pure(num_blocks: int, ops: list[tuple[str, int]]) -> None:
    """The C queue against FreeBlockQueue: the same answers, the same order, every step."""
    from pagedkv.core.free_queue import FreeBlockQueue

    assert ccore is not None
    c = ccore.FreeQueue(num_blocks, first_id=1)
    p = FreeBlockQueue(num_blocks, first_id=1)
    out = set(range(1, num_blocks)) - set(p)  # ids not queued (none yet)
    for op, x in ops:
        queued = p.to_list()
        if op == "pop" and queued:
            assert c.popleft() == p.popleft()
        elif op == "pop_n":
            n = x % (len(queued) + 1)
            assert c.popleft_n(n) == p.popleft_n(n)
        elif op == "remove" and queued:
            b = queued[x % len(queued)]
            c.remove(b)
            p.remove(b)
        elif op in ("append", "append_n", "prepend_n") and out:
            ids = sorted(out)[: 1 + x % len(out)] if op != "append" else [sorted(out)[0]]
            if op == "append":
                c.append(ids[0])
                p.append(ids[0])
            else:
                getattr(c, op)(ids)
                getattr(p, op)(ids)
        out = set(range(1, num_blocks)) - set(p.to_list())
        assert c.to_list() == p.to_list() == list(c) == c.check_invariants()
        assert c.num_free == p.num_free
    with pytest.raises(IndexError):
        c.append(num_blocks)  # outside the pool: refused, never written


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
