"""The lookup kernels (``pagedkv/_csrc/ccore_hybrid_fixed_point.h``,
``ccore_lookup_request.h``) against their pure twins in
:mod:`pagedkv.core.kernels_hybrid_hits` on random inputs, and both against the
coordinators' own Python lookups (the rules the kernels inline) on managers filled by
random requests."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    MambaSpec,
    SlidingWindowSpec,
)
from pagedkv.core import kernels_hybrid_hits as khh
from pagedkv.core import native
from pagedkv.core.coordinator_base import ComputedBlocks
from pagedkv.core.coordinator_hybrid import HybridCoordinator
from pagedkv.core.coordinator_simple import UnitaryCoordinator

ccore = native.active()
needs_compiled = pytest.mark.skipif(
    ccore is None, reason=f"compares compiled kernels with pure ones ({native.IMPORT_ERROR})")

KEYS = [bytes([i]) * 4 for i in range(12)]


@st.composite
def _entries(draw: Any, num_groups: int) -> tuple[Any, ...]:
    group = draw(st.integers(0, num_groups - 1))
    kind = draw(st.integers(0, 3))
    bs = draw(st.sampled_from([1, 2, 4, 8]))
    stride = draw(st.integers(1, 3))
    index = draw(st.dictionaries(st.sampled_from(KEYS), st.integers(1, 50), max_size=12))
    a = b = 0
    if kind == khh.KIND_WINDOW:
        a = draw(st.integers(-1, 4))
    elif kind == khh.KIND_CHUNK:
        b = draw(st.integers(1, 4))
        a = b * bs
    elif kind == khh.KIND_STATE:
        a = draw(st.sampled_from([1, 2, 4, 8, 16]))
    return (group, kind, index, stride, bs, a, b)


@st.composite
def _plans(draw: Any) -> tuple[Any, ...]:
    if draw(st.booleans()):
        entry = draw(_entries(1))
        return (1, 1, True, (), (entry,)) if draw(st.booleans()) else (1, 1, True, (entry,), ())
    num_groups = draw(st.integers(1, 4))
    lcm = draw(st.sampled_from([1, 2, 4, 8, 16]))
    full = tuple(draw(st.lists(_entries(num_groups), max_size=2)))
    others = tuple(draw(st.lists(_entries(num_groups), min_size=0 if full else 1,
                                 max_size=3)))
    return (num_groups, lcm, False, full, others)


@needs_compiled
@settings(max_examples=600, deadline=None)
@given(plan=_plans(), hashes=st.lists(st.sampled_from(KEYS), max_size=30),
       max_length=st.integers(-20, 260))
def test_hybrid_hit_compiled_equals_pure(plan: tuple[Any, ...], hashes: list[bytes],
                                         max_length: int) -> None:
    """Any plan, hashes and bound (negative ones too): the same blocks, the same length."""
    assert ccore is not None
    expected = khh.hybrid_hit(plan)(hashes, max_length)
    assert ccore.HybridHit(plan)(hashes, max_length) == expected
    assert ccore.HybridHit(plan)(tuple(hashes), max_length) == expected
    if all(e[1] != khh.KIND_CHUNK for e in (*plan[3], *plan[4])):  # else [0] * 10**30
        assert ccore.HybridHit(plan)(hashes, 10**30) == khh.hybrid_hit(plan)(hashes, 10**30)


@needs_compiled
def test_hybrid_hit_refuses_bad_plans_and_arguments() -> None:
    assert ccore is not None
    good = (0, 0, {}, 1, 4, 0, 0)
    for plan in [(1, 0, True, (good,), ()), (1, 1, True, (), ()), (2, 1, True, (good,), ()),
                 (1, 1, False, (), ()),
                 (1, 1, False, ((1, 0, {}, 1, 4, 0, 0),), ()),
                 (1, 1, False, ((0, 2, {}, 1, 4, 0, 0),), ()),
                 (1, 1, False, ((0, 9, {}, 1, 4, 0, 0),), ())]:
        with pytest.raises(ValueError):
            ccore.HybridHit(plan)
    for plan in [[1, 1, True, (good,), ()], (1, 1, False, ((0, 0, [], 1, 4, 0, 0),), ())]:
        with pytest.raises(TypeError):
            ccore.HybridHit(plan)
    find = ccore.HybridHit((1, 1, True, (good,), ()))
    with pytest.raises(TypeError):
        find([b"a"], 1.5)
    with pytest.raises(TypeError):
        find([b"a"])
    with pytest.raises(TypeError):
        find(5, 3)
    with pytest.raises(OverflowError):
        find([b"a"], -(10**30))


HEADS = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
LAYOUTS: dict[str, tuple[Any, ...]] = {
    "swa": (SlidingWindowSpec(block_size=4, sliding_window=6, **HEADS),),
    "chunked": (ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **HEADS),),
    "full+swa": (FullAttentionSpec(block_size=4, **HEADS),
                 SlidingWindowSpec(block_size=4, sliding_window=6, **HEADS)),
    "full8+swa4": (FullAttentionSpec(block_size=8, **HEADS),
                   SlidingWindowSpec(block_size=4, sliding_window=4, **HEADS)),
    "full+chunked": (FullAttentionSpec(block_size=8, **HEADS),
                     ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **HEADS)),
    "full+mamba": (FullAttentionSpec(block_size=4, **HEADS),
                   MambaSpec(block_size=4, state_bytes=64)),
    "full+swa+mamba": (FullAttentionSpec(block_size=4, **HEADS),
                       SlidingWindowSpec(block_size=4, sliding_window=6, **HEADS),
                       MambaSpec(block_size=4, state_bytes=64)),
}


def _manager(layout: str, num_blocks: int, pure: bool) -> KVCacheManager:
    cfg = CacheConfig(groups=LAYOUTS[layout], num_blocks=num_blocks, max_model_len=64)
    if pure:
        with native.forced_pure():
            return KVCacheManager(cfg)
    return KVCacheManager(cfg)


def _python_lookup(coordinator: Any, hashes: list[bytes], n: int) -> Any:
    """The coordinator class's own lookup (the Python fixed point, each manager's rule)."""
    kind = HybridCoordinator if isinstance(coordinator, HybridCoordinator) else (
        UnitaryCoordinator)
    return kind.find_longest_cache_hit(coordinator, hashes, n)


@settings(max_examples=60, deadline=None)
@given(layout=st.sampled_from(sorted(LAYOUTS)), num_blocks=st.integers(8, 40),
       pure=st.booleans() if ccore is not None else st.just(True),
       prompts=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 40), st.booleans(),
                                  st.booleans()), min_size=1, max_size=8))
def test_lookups_equal_the_coordinators_python_lookup(
        layout: str, num_blocks: int, pure: bool,
        prompts: list[tuple[int, int, bool, bool]]) -> None:
    """On a manager filled by admissions over shared prefixes (some freed, some evicted,
    some preempted), the kernel's lookup equals the coordinator's own Python lookup at
    every bound, and ``get_computed_blocks`` counts and builds the hit as the façade's
    Python form (``kernels_hybrid_hits.lookup_request``) on a copy of the manager."""
    mgr = _manager(layout, num_blocks, pure)
    coordinator: Any = mgr.coordinator
    assert "find_longest_cache_hit" in coordinator.__dict__  # the kernel is in front
    for n, (prefix, length, free_after, preempted) in enumerate(prompts):
        req = mgr.new_request(f"r{n}", [7 * prefix + t % 5 for t in range(length)])
        hashes = req.block_hashes
        for bound in range(length + 2):
            assert coordinator.find_longest_cache_hit(hashes, bound) == _python_lookup(
                coordinator, hashes, bound)
        if preempted:
            req.num_preemptions = 1
        twin = copy.deepcopy(mgr)
        twin_req = twin.live_requests.get(req.request_id, req)
        spec = khh.lookup_request(twin.coordinator.find_longest_cache_hit, twin, twin_req,
                                  req.num_tokens)
        hit = mgr.get_computed_blocks(req)
        assert type(hit) is ComputedBlocks and hit == ComputedBlocks(*hit)
        assert hit[:2] == spec[:2] and hit[3:6] == spec[3:6] and spec.issuer is twin.issuer_token
        assert mgr.lookups.snapshot() == twin.lookups.snapshot()
        assert (mgr.hit_rate_window.queries, mgr.hit_rate_window.hits) == (
            twin.hit_rate_window.queries, twin.hit_rate_window.hits)
        req.num_preemptions = 0
        new = mgr.allocate_slots(req, length - hit.num_computed_tokens, new_computed_blocks=hit)
        if new is not None and free_after:
            req.num_computed_tokens = length
            mgr.free(req)
        mgr.check_invariants()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_copied_and_pickled_managers_keep_their_lookup(layout: str) -> None:
    """The kernel is built again in a copy (deepcopy, pickle), over the copy's index."""
    mgr = _manager(layout, 24, False)
    req = mgr.new_request("a", list(range(20)))
    mgr.allocate_slots(req, 20)
    for twin in (copy.deepcopy(mgr), pickle.loads(pickle.dumps(mgr))):
        other = twin.new_request("b", list(range(20)) + [3])
        assert twin.get_computed_blocks(other)[:2] == mgr.get_computed_blocks(
            mgr.new_request("b", list(range(20)) + [3]))[:2]
        assert twin.coordinator.__dict__["find_longest_cache_hit"] is not (
            mgr.coordinator.__dict__["find_longest_cache_hit"])
        twin.free(twin.live_requests["a"])
        assert twin.reset_prefix_cache()  # the index dicts are cleared in place
        c = twin.new_request("c", list(range(20)))
        got = twin.get_computed_blocks(c)
        assert (got.block_ids, got.num_computed_tokens) == _python_lookup(
            twin.coordinator, c.block_hashes, 19)
        assert not any(any(t) for t in got.block_ids)  # no cached block left
    c = mgr.new_request("c", list(range(20)))  # the original keeps its cache
    got = mgr.get_computed_blocks(c)
    assert (got.block_ids, got.num_computed_tokens) == _python_lookup(
        mgr.coordinator, c.block_hashes, 19)


@needs_compiled
def test_lookup_request_compiled_equals_pure_on_odd_finders() -> None:
    """Caching off (a finder answering None), a preempted request, a finder that raises,
    one that answers a non-tuple: the same hit, counters and errors."""
    assert ccore is not None
    out = []
    for kernel in (khh.lookup_request, ccore.lookup_request):
        mgr = _manager("full+swa", 16, False)
        req = mgr.new_request("a", list(range(9)))
        got: list[Any] = [kernel(lambda h, n: None, mgr, req, 9) is mgr._empty_hit]
        req.num_preemptions = 2
        hit = kernel(lambda h, n: (([1], [0]), n), mgr, req, 9)
        got.append((hit[:2], hit[3:], hit.issuer is mgr.issuer_token, mgr.lookups.snapshot()))

        def boom(h: list[bytes], n: int) -> Any:
            raise KeyError(n)
        with pytest.raises(KeyError):
            kernel(boom, mgr, req, 9)
        got.append(mgr.lookups.snapshot())
        out.append(got)
    assert out[0] == out[1]
    mgr = _manager("full+swa", 16, False)
    with pytest.raises(TypeError):
        ccore.lookup_request(lambda h, n: [[], 0], mgr, mgr.new_request("a", [1]), 1)
