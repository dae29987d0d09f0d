"""The compiled core's lookup, free and quiet first take (``_csrc/ccore_lookup.h``).

On one full-attention group ``DecodeAllocate`` also stands in for ``get_computed_blocks``
and ``free``, and a first ``allocate_slots`` takes and registers its blocks without a
Python call when the pool's recorder hears nothing. These tests show (1) that the
compiled calls answer, change and count what the pure core does (a spy on the Python
methods sees none of them), and (2) that every other call reaches the Python method
before anything changed, so its errors and general path are the Python method's.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from compiled_support import manager, needs_compiled

from pagedkv import KVCacheManager, Request
from pagedkv.core import facade_allocation, facade_frees, facade_lookups, fast_paths
from pagedkv.errors import DuplicateRequestError, InvalidArgumentError

pytestmark = needs_compiled


class Spy:
    """A Python method, counting the calls the compiled entry hands to it."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self.calls = 0

    def __call__(self, mgr: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.function(mgr, *args, **kwargs)


def spied(**fields: Any) -> tuple[KVCacheManager, Spy, Spy]:
    """A compiled manager whose lookup and free report their fallbacks to spies."""
    mgr = manager(**fields)
    lookups, frees = Spy(facade_lookups.get_computed_blocks), Spy(facade_frees.free)
    fast = fast_paths.install(mgr, facade_allocation.allocate_slots,
                              facade_allocation.cache_blocks, lookup_function=lookups,
                              free_function=frees)
    assert fast is not None and fast.takes_lookups and fast.takes_frees
    mgr.allocate_slots = fast  # type: ignore[method-assign]
    mgr.get_computed_blocks = fast.get_computed_blocks  # type: ignore[method-assign]
    mgr.free = fast.free  # type: ignore[method-assign]
    return mgr, lookups, frees


def fields(hit: Any) -> tuple[Any, ...]:
    """A hit's fields but its issuer (each manager stamps its own)."""
    return hit.block_ids, hit.num_computed_tokens, hit.request_id, hit.generation, \
        hit.fingerprint, hit.group_tokens


def snapshot(mgr: KVCacheManager) -> tuple[Any, ...]:
    """Everything a lookup, first allocation or free may change."""
    return (mgr.debug_state(), sorted(mgr.live_requests), mgr.num_free_blocks,
            mgr.pool.num_evicted_blocks, mgr.make_prefix_cache_stats(),
            mgr.hit_rate_window.num_requests, mgr.hit_rate_window.hits)


PROMPTS = [list(range(10)), list(range(10)) + [99, 98], list(range(13)),
           list(range(100, 117)), list(range(200, 230)), list(range(10)) + [7] * 9,
           list(range(300, 364)), [5]]


def step(mgr: KVCacheManager, rid: str, prompt: list[int], preempted: bool) -> Any:
    """Look up and admit one request; (request, hit, answer)."""
    req = Request(rid, prompt, hasher=mgr.hasher)
    if preempted:
        req.num_preemptions = 1
    hit = mgr.get_computed_blocks(req)
    out = mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                             new_computed_blocks=hit)
    return req, hit, out


def test_lookups_frees_and_first_takes_are_compiled_and_equal_to_the_pure_core() -> None:
    """Hits, misses, preempted lookups, evictions, frees by request and by id, unknown
    frees: the compiled entries answer and change what the pure core does."""
    compiled, lookups, frees = spied()
    pure = manager(pure=True)
    assert isinstance(pure.get_computed_blocks.__self__, KVCacheManager)
    held: list[tuple[Request, Request]] = []
    for i, prompt in enumerate(PROMPTS * 3):
        a, b = (step(m, f"r{i}", prompt, preempted=i % 4 == 3) for m in (compiled, pure))
        assert fields(a[1]) == fields(b[1]) and a[1].issuer is compiled.issuer_token
        assert a[2] == b[2], prompt
        assert snapshot(compiled) == snapshot(pure)
        if a[2] is not None:
            held.append((a[0], b[0]))
        while len(held) > 2:  # the oldest go: by object, then by id
            x, y = held.pop(0)
            compiled.free(x if i % 2 else x.request_id)
            pure.free(y if i % 2 else y.request_id)
            compiled.free(x)  # freed already: nothing
            pure.free(y)
            assert snapshot(compiled) == snapshot(pure)
        compiled.check_invariants()
    compiled.free("never-seen")
    assert (lookups.calls, frees.calls) == (0, 0)


def test_a_compiled_hit_is_adopted_by_the_python_method() -> None:
    """The hit the compiled lookup builds passes the Python method's checks (a keyword
    the compiled admission leaves to it) and claims the same blocks."""
    mgr = manager()
    first = Request("a", list(range(12)), hasher=mgr.hasher)
    mgr.allocate_slots(first, 12)
    first.num_computed_tokens = 12
    mgr.free(first)
    req = Request("b", list(range(12)) + [1], hasher=mgr.hasher)
    hit = mgr.get_computed_blocks(req)
    assert hit.num_computed_tokens == 12
    out = mgr.allocate_slots(req, 1, new_computed_blocks=hit, num_lookahead_tokens=0)
    assert out is not None and mgr.coordinator.managers[0].req_to_blocks["b"][:3] == \
        list(hit.block_ids[0])


def appended_behind(mgr: KVCacheManager) -> Request:
    req = Request("x", list(range(8)), hasher=mgr.hasher)
    req.all_token_ids.append(5)  # not through append_output_tokens: no hashes
    return req


class Duck:
    """A request-like object that is not pagedkv's Request."""

    def __init__(self) -> None:
        self.request_id = "duck"
        self.num_tokens = 4
        self.num_preemptions = 0
        self.block_hashes: list[bytes] = []


@pytest.mark.parametrize("case", ["too-long", "appended-behind", "foreign-type",
                                  "not-a-request"])
def test_uncovered_lookups_go_to_the_python_method(case: str) -> None:
    """Each uncovered lookup reaches the Python method with nothing changed: it answers
    or raises there."""
    mgr, lookups, _ = spied()
    before = snapshot(mgr)
    if case == "too-long":
        with pytest.raises(InvalidArgumentError):
            mgr.get_computed_blocks(Request("x", list(range(80))))
    elif case == "appended-behind":
        pure = manager(pure=True)
        got, want = (m.get_computed_blocks(appended_behind(m)) for m in (mgr, pure))
        assert fields(got) == fields(want)
        before = snapshot(pure)
    elif case == "foreign-type":
        assert mgr.get_computed_blocks(Duck()).num_computed_tokens == 0  # type: ignore[arg-type]
        before = None
    else:
        with pytest.raises(InvalidArgumentError):
            mgr.get_computed_blocks(7)  # type: ignore[arg-type]
    assert lookups.calls == 1
    if before is not None:
        assert snapshot(mgr) == before


@pytest.mark.parametrize("case", ["duplicate", "not-a-request", "foreign-type"])
def test_uncovered_frees_go_to_the_python_method(case: str) -> None:
    mgr, _, frees = spied()
    req = Request("r", list(range(8)), hasher=mgr.hasher)
    mgr.allocate_slots(req, 8)
    before = snapshot(mgr)
    if case == "duplicate":
        with pytest.raises(DuplicateRequestError):
            mgr.free(Request("r", list(range(8))))
    elif case == "not-a-request":
        with pytest.raises(InvalidArgumentError):
            mgr.free(3.5)  # type: ignore[arg-type]
    else:
        mgr.free(Duck())  # type: ignore[arg-type]  # unknown id: nothing
    assert frees.calls == 1 and snapshot(mgr) == before


def test_a_listening_pool_frees_through_the_python_method() -> None:
    """A pool with a listener is not plain: the free is the Python method's."""
    mgr, _, frees = spied()
    req = Request("r", list(range(8)), hasher=mgr.hasher)
    mgr.allocate_slots(req, 8)
    mgr.pool.listeners = (object(),)  # type: ignore[assignment]
    try:
        mgr.free(req)
    finally:
        mgr.pool.listeners = ()
    assert frees.calls == 1 and "r" not in mgr.live_requests
    mgr.check_invariants()


def test_events_take_the_python_take_and_agree() -> None:
    """With events on, the recorder hears: the first take and registration run through
    the pool's Python methods and the events equal the pure core's."""
    compiled, pure = manager(enable_events=True), manager(pure=True, enable_events=True)
    for m in (compiled, pure):
        for i, prompt in enumerate(PROMPTS * 2):
            req, _, out = step(m, f"r{i}", prompt, preempted=False)
            if out is not None:
                m.free(req)
    assert compiled.take_events() == pure.take_events()
    assert snapshot(compiled) == snapshot(pure)


def test_hooked_lookups_and_frees_are_not_compiled() -> None:
    """Without the Python functions the entries are not installed (a component's hooks)."""
    mgr = manager()
    fast = fast_paths.install(mgr, facade_allocation.allocate_slots,
                              facade_allocation.cache_blocks)
    assert not fast.takes_lookups and not fast.takes_frees
    with pytest.raises(TypeError, match="lookup_function"):
        fast.get_computed_blocks(Request("x", [1]))
    with pytest.raises(TypeError, match="free_function"):
        fast.free("x")


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy,
                                   lambda m: pickle.loads(pickle.dumps(m))])
def test_a_copied_manager_has_its_own_compiled_entries(clone: Any) -> None:
    mgr = manager()
    req = Request("r", list(range(8)), hasher=mgr.hasher)
    mgr.allocate_slots(req, 8)
    other = clone(mgr)
    for m in (mgr, other):
        assert m.get_computed_blocks.__self__.manager is m
        assert m.free.__self__.manager is m
    if clone is not copy.copy:  # a shallow copy shares the tables
        other.free("r")
        assert "r" in mgr.live_requests and "r" not in other.live_requests


@pytest.mark.parametrize("events", [False, True])
def test_a_quiet_pool_takes_and_registers_without_python_calls(events: bool) -> None:
    """On a plain pool whose recorder hears nothing, a first call takes and registers its
    blocks in C (the pool's Python take and the index's registration are never called);
    with events on, both run in Python so the recorder hears them."""
    mgr = manager(enable_events=events)
    calls = {"take": 0, "register": 0}

    def counted(name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return function(*args, **kwargs)
        return call

    pool = mgr.pool
    pool.get_new_blocks = counted("take", pool.get_new_blocks)  # type: ignore[method-assign]
    pool.cache_full_blocks = counted(  # type: ignore[method-assign]
        "register", pool.cache_full_blocks)
    pool.prefix.cache_full_blocks = pool.cache_full_blocks  # type: ignore[method-assign]
    for i, prompt in enumerate(PROMPTS * 3):
        req, _, out = step(mgr, f"r{i}", prompt, preempted=False)
        if out is not None:
            mgr.free(req)
        mgr.check_invariants()
    assert pool.num_evicted_blocks > 0  # the takes evicted cached blocks too
    if events:
        assert calls["take"] > 0 and calls["register"] > 0
    else:
        assert calls == {"take": 0, "register": 0}


def test_a_take_evicting_duplicate_keys_goes_through_the_index_and_agrees() -> None:
    """Two requests that looked the same prompt up before either was admitted register
    the same keys twice (duplicates); once freed, the compiled take that reuses those
    blocks evicts them through the prefix index's Python method and leaves what the pure
    core leaves."""
    compiled, pure = manager(num_blocks=12), manager(pure=True, num_blocks=12)
    through_index = {"calls": 0}
    evict = compiled.pool.prefix.evict_block

    def counted(b: int, **kwargs: Any) -> None:
        through_index["calls"] += 1
        evict(b, **kwargs)

    compiled.pool.prefix.evict_block = counted  # type: ignore[method-assign]
    python_take = compiled.pool.get_new_blocks

    def no_python_take(n: int) -> list[int]:
        through_index["python takes"] = through_index.get("python takes", 0) + 1
        return python_take(n)

    compiled.pool.get_new_blocks = no_python_take  # type: ignore[method-assign]
    for mgr in (compiled, pure):
        twins = [Request(f"twin{k}", list(range(16)), hasher=mgr.hasher) for k in range(2)]
        hits = [mgr.get_computed_blocks(req) for req in twins]  # both miss
        for req, hit in zip(twins, hits, strict=True):
            assert mgr.allocate_slots(req, 16, new_computed_blocks=hit) is not None
        for req in twins:
            mgr.free(req)
    assert snapshot(compiled) == snapshot(pure)
    for i in range(4):  # new prompts take every free block, the twins' ones included
        a, b = (step(m, f"new{i}", list(range(500 + 12 * i, 512 + 12 * i)), False)
                for m in (compiled, pure))
        assert a[2] == b[2]
        assert snapshot(compiled) == snapshot(pure)
        for m, req in ((compiled, a[0]), (pure, b[0])):
            m.free(req)
        compiled.check_invariants()
    assert through_index["calls"] > 0 and "python takes" not in through_index
    assert compiled.pool.num_evicted_blocks == pure.pool.num_evicted_blocks > 0
