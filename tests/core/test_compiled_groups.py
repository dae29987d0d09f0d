"""The compiled steady-state allocation for hybrid layouts (``GroupsAllocate``,
``pagedkv/_csrc/ccore_groups.h``) against its pure-Python specification.

A Hypothesis state machine runs a compiled-core manager and a pure-core manager side by
side on each layout the kernel serves — one sliding-window group, one chunked-local group,
full attention with a sliding window (same and mixed block sizes), with chunked local,
with a Mamba group (align mode: its own growth and release through its methods, zeroed
blocks) and all three together — and compares every answer (or error) and
``debug_state()`` after each step. The steps are an engine's: admissions with a hit,
running requests' allocations with every keyword set the kernel takes (lookahead,
reserve, in-flight tokens, lenient counts, delayed caching, the scheduling flags) and
values it must hand to the Python method (out of range, wrong types, a hit, a
full-sequence gate), ``cache_blocks`` with odd counts, frees, evictions, resets.

Without the compiled core (``PAGEDKV_PURE=1``, not built) they skip: nothing to compare.
"""

from __future__ import annotations

import copy
import pickle
import weakref
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from pagedkv.core import fast_paths, native
from pagedkv.errors import InvalidArgumentError

pytestmark = pytest.mark.skipif(native.active() is None,
                                reason=f"no compiled core: {native.IMPORT_ERROR}")

HEADS = {"num_kv_heads": 1, "head_size": 4, "dtype_bytes": 2}
MAX_LEN = 64


def _full(bs: int) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, **HEADS)


def _swa(bs: int, window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size=bs, sliding_window=window, **HEADS)


def _chunked(bs: int, chunk: int) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(block_size=bs, attention_chunk_size=chunk, **HEADS)


#: name -> (groups, pool blocks): every coordinator shape GroupsAllocate serves.
LAYOUTS: dict[str, tuple[tuple[Any, ...], int]] = {
    "swa": ((_swa(4, 8),), 16),
    "chunked": ((_chunked(4, 8),), 16),
    "full+swa": ((_full(4), _swa(4, 6)), 30),
    "full8+swa4": ((_full(8), _swa(4, 12)), 30),
    "full+chunked": ((_full(4), _chunked(4, 8)), 30),
    "full+mamba": ((_full(4), MambaSpec(block_size=4, state_bytes=16)), 30),
    "full+swa+mamba": ((_full(4), _swa(4, 8), MambaSpec(block_size=4, state_bytes=16)), 40),
}
PREFIXES = [[1000 + i for i in range(12)], [7] * 9, []]
#: Keyword sets of a running request's step: those the kernel takes, then odd ones it
#: hands to the Python method (which validates and raises, or takes the general path).
STEP_KEYWORDS: list[dict[str, Any]] = [
    {}, {"num_lookahead_tokens": 2}, {"reserved_blocks": 2}, {"delay_caching": True},
    {"has_scheduled_reqs": False, "full_sequence_must_fit": False},
    {"new_computed_blocks": None, "num_external_computed_tokens": 0,
     "num_encoder_tokens": 0, "num_new_computed_tokens": None},
    {"num_in_flight_tokens": 1, "lenient_counts": True},
    {"num_in_flight_tokens": 0, "lenient_counts": False, "delay_caching": False},
    {"num_lookahead_tokens": -1}, {"reserved_blocks": True}, {"lenient_counts": 1},
    {"num_in_flight_tokens": 10**6}, {"full_sequence_must_fit": True},
    {"num_external_computed_tokens": 2}, {"delay_caching": 1}, {"unknown": 0},
]


def manager_pair(layout: str) -> tuple[KVCacheManager, KVCacheManager]:
    groups, num_blocks = LAYOUTS[layout]
    config = CacheConfig(groups=groups, num_blocks=num_blocks, max_model_len=MAX_LEN,
                         enable_events=True, max_in_flight_tokens=8, watermark=0.05)
    compiled = KVCacheManager(config)
    with native.forced_pure():
        pure = KVCacheManager(config)
    return compiled, pure


class GroupsVsPure(RuleBasedStateMachine):
    """Every call made on both managers; every answer and the whole state compared."""

    layout = "full+swa"

    def __init__(self) -> None:
        super().__init__()
        self.mgrs = manager_pair(self.layout)
        assert type(self.mgrs[0].allocate_slots).__name__ == "GroupsAllocate"
        assert type(self.mgrs[1].allocate_slots).__name__ == "method"
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
          suffix=st.lists(st.integers(0, 300), min_size=1, max_size=20))
    def new_request(self, prefix: int, suffix: list[int]) -> None:
        self.counter += 1
        rid = f"r{self.counter}"
        reqs = [m.new_request(rid, PREFIXES[prefix] + suffix) for m in self.mgrs]
        self.waiting.append((reqs[0], reqs[1]))

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100))
    def admit(self, i: int) -> None:
        pair = self.waiting[i % len(self.waiting)]
        hits = [m.get_computed_blocks(pair[k]) for k, m in enumerate(self.mgrs)]
        assert hits[0].block_ids == hits[1].block_ids
        n_new = pair[0].num_tokens - hits[0].num_computed_tokens
        new = self.both(lambda m, k: m.allocate_slots(pair[k], n_new,
                                                      new_computed_blocks=hits[k]))
        if new is not None:
            for req in pair:
                req.num_computed_tokens = req.num_tokens
            self.waiting.remove(pair)
            self.running.append(pair)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), tokens=st.lists(st.integers(0, 1 << 18), min_size=1,
                                                 max_size=9),
          kw=st.sampled_from(range(len(STEP_KEYWORDS))), delta=st.integers(0, 1))
    def step(self, i: int, tokens: list[int], kw: int, delta: int) -> None:
        """A running request's step: new tokens, then ``allocate_slots`` with one keyword
        set; ``delta`` 1 counts one new token as computed already (an engine counting
        the token in flight)."""
        pair = self.running[i % len(self.running)]
        if pair[0].num_tokens + len(tokens) > MAX_LEN:
            return
        for req in pair:
            req.append_output_tokens(tokens)
            req.num_computed_tokens = max(0, req.num_computed_tokens + delta)
        n = pair[0].num_tokens - pair[0].num_computed_tokens
        kwargs = STEP_KEYWORDS[kw]
        new = self.both(lambda m, k: m.allocate_slots(pair[k], max(n, 1), **kwargs))
        if new is not None:
            for req in pair:
                req.num_computed_tokens = req.num_tokens

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.sampled_from([0, -1, 1, 10**9, True, 1.0, None]))
    def odd_step(self, i: int, n: Any) -> None:
        pair = self.running[i % len(self.running)]
        self.both(lambda m, k: m.allocate_slots(pair[k], n))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.sampled_from([0, 1, 4, 8, 15, 16, 17, 33, 64, 10**9,
                                                     -1, True, 2.0, None]))
    def cache_blocks(self, i: int, n: Any) -> None:
        pair = self.running[i % len(self.running)]
        self.both(lambda m, k: m.cache_blocks(pair[k], n))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def finish(self, i: int) -> None:
        pair = self.running.pop(i % len(self.running))
        self.both(lambda m, k: m.free(pair[k]))

    @rule(ids=st.lists(st.integers(0, 40), max_size=3))
    def evict(self, ids: list[int]) -> None:
        self.both(lambda m, k: m.evict_blocks(ids))

    @rule()
    def reset(self) -> None:
        self.both(lambda m, k: m.reset_prefix_cache())

    @rule()
    def queries(self) -> None:
        self.both(lambda m, k: (m.num_free_blocks, m.num_evicted_blocks,
                                m.take_new_block_ids(), len(m.take_events())))

    @invariant()
    def same_state(self) -> None:
        assert self.mgrs[0].debug_state() == self.mgrs[1].debug_state()
        for mgr in self.mgrs:
            mgr.check_invariants()


MACHINE_SETTINGS = settings(max_examples=100, stateful_step_count=40, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_groups_allocate_equals_pure(layout: str) -> None:
    machine = type(f"GroupsVsPure_{layout}", (GroupsVsPure,), {"layout": layout})
    test = machine.TestCase
    test.settings = MACHINE_SETTINGS
    test().runTest()


def _running(mgr: KVCacheManager, rid: str, prompt: int) -> Request:
    req = mgr.new_request(rid, list(range(prompt)))
    assert mgr.allocate_slots(req, prompt) is not None
    req.num_computed_tokens = prompt
    return req


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_steady_steps_stay_in_c(layout: str) -> None:
    """Only admissions reach the Python method: every decode step, with the engine's
    keywords or the plain call, is taken by the compiled kernel."""
    mgr, _ = manager_pair(layout)
    python_calls = [0]

    def python_method(self: KVCacheManager, *args: Any, **kwargs: Any) -> Any:
        python_calls[0] += 1
        return KVCacheManager.allocate_slots(self, *args, **kwargs)

    fast = fast_paths.install(mgr, python_method, KVCacheManager.cache_blocks)
    assert type(fast).__name__ == "GroupsAllocate"
    mgr.allocate_slots = fast  # type: ignore[method-assign]
    reqs = [_running(mgr, f"r{i}", 5 + i) for i in range(3)]
    assert python_calls[0] == 3
    for step in range(20):
        for req in reqs:
            req.append_output_tokens([step])
            kwargs = ({"num_in_flight_tokens": 0, "lenient_counts": True} if step % 2
                      else {"num_lookahead_tokens": 0, "reserved_blocks": 0})
            assert mgr.allocate_slots(req, 1, **kwargs) is not None
            req.num_computed_tokens = req.num_tokens
    assert python_calls[0] == 3
    mgr.check_invariants()


def test_sliding_window_release_and_refusal_in_c() -> None:
    """Worked case (window 8, block 4): 13 computed tokens skip block 0; a refused call
    still releases it (as vLLM 0.33), and registers nothing."""
    mgr, pure = manager_pair("swa")
    for m in (mgr, pure):
        req = _running(m, "a", 12)
        req.append_output_tokens([1])
        assert m.allocate_slots(req, 1) == ([4],)
        req.num_computed_tokens = 13
        req.append_output_tokens(list(range(40)))
        # 14 blocks for 53 tokens: 10 more, 12 free once block 0 is released, 3 reserved.
        assert m.allocate_slots(req, 40, reserved_blocks=3) is None
        assert m.coordinator.managers[0].req_to_blocks["a"][0] == 0
    assert mgr.debug_state() == pure.debug_state()


def test_groups_allocate_survives_copy_and_pickle_and_holds_its_manager_weakly() -> None:
    mgr, _ = manager_pair("full+swa+mamba")
    req = _running(mgr, "a", 9)
    for twin in (copy.deepcopy(mgr), pickle.loads(pickle.dumps(mgr))):
        assert type(twin.allocate_slots).__name__ == "GroupsAllocate"
        assert twin.allocate_slots.manager is twin
        twin_req = twin.live_requests["a"]
        twin_req.append_output_tokens([1, 2, 3, 4])
        assert twin.allocate_slots(twin_req, 4) is not None
        twin.check_invariants()
    allocate = mgr.allocate_slots
    gone = weakref.ref(mgr)
    del mgr, twin, twin_req
    assert gone() is None
    with pytest.raises(InvalidArgumentError, match="keep a reference to the manager"):
        allocate(req, 1)


def test_constructor_refuses_bad_groups() -> None:
    ccore = native.module()
    assert ccore is not None
    mgr, _ = manager_pair("full+swa")
    good = {"function": KVCacheManager.allocate_slots,
            "cache_function": KVCacheManager.cache_blocks, "manager": mgr,
            "live_requests": {}, "pool": mgr.pool, "zeroing": [False], "new_block_ids": [[]],
            "request_type": Request, "cache_plan": (), "max_model_len": 8,
            "hash_block_size": 4, "cache_alignment": 1}
    for groups in [(), ((0, 9, 0, 4, 0, None, {}),), ((0, 1, 0, 4, 0, None, {}),),
                   ((0, 2, 0, 4, 6, None, {}),), ((0, 0, 0, 0, 0, None, {}),)]:
        with pytest.raises(ValueError, match="GroupsAllocate"):
            ccore.GroupsAllocate(**good, groups=groups)
