"""The compiled steady-state allocation for hybrid layouts (``GroupsAllocate``,
``pagedkv/_csrc/ccore_groups.h``) against its pure-Python specification.

Focused checks of the kernel here: that a steady step stays in C on each layout it
serves (one sliding-window group, one chunked-local group, full attention with a sliding
window (same and mixed block sizes), with chunked local, with a Mamba group (align mode)
and all three together), the sliding window's release and refusal, copies and pickles,
and its constructor's checks. The compiled-vs-pure comparison of every answer and the
whole state, step by step, on these layouts and more, is the one differential machine in
test_kernels_differential.py (its ``odd_step`` rule carries the keyword sets and odd
counts this file's former machine drew).

Without the compiled core (``PAGEDKV_PURE=1``, not built) they skip: nothing to compare.
"""

from __future__ import annotations

import copy
import pickle
import weakref
from typing import Any

import pytest

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
from pagedkv.core.managers.sliding_window import SlidingWindowManager
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
def manager_pair(layout: str) -> tuple[KVCacheManager, KVCacheManager]:
    groups, num_blocks = LAYOUTS[layout]
    config = CacheConfig(groups=groups, num_blocks=num_blocks, max_model_len=MAX_LEN,
                         enable_events=True, max_in_flight_tokens=8, watermark=0.05)
    compiled = KVCacheManager(config)
    with native.forced_pure():
        pure = KVCacheManager(config)
    return compiled, pure


def _running(mgr: KVCacheManager, rid: str, prompt: int) -> Request:
    req = mgr.new_request(rid, list(range(prompt)))
    assert mgr.allocate_slots(req, prompt) is not None
    req.num_computed_tokens = prompt
    return req


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_steady_steps_stay_in_c(layout: str) -> None:
    """No call reaches the Python method: the plain admissions (a new request's first
    call, ``ccore_hybrid_first.h``) and every decode step, with the engine's keywords or
    the plain call, are taken by the compiled kernel."""
    mgr, _ = manager_pair(layout)
    python_calls = [0]

    def python_method(self: KVCacheManager, *args: Any, **kwargs: Any) -> Any:
        python_calls[0] += 1
        return KVCacheManager.allocate_slots(self, *args, **kwargs)

    fast = fast_paths.install(mgr, python_method, KVCacheManager.cache_blocks)
    assert type(fast).__name__ == "GroupsAllocate"
    mgr.allocate_slots = fast  # type: ignore[method-assign]
    reqs = [_running(mgr, f"r{i}", 5 + i) for i in range(3)]
    assert python_calls[0] == 0
    for step in range(20):
        for req in reqs:
            req.append_output_tokens([step])
            kwargs = ({"num_in_flight_tokens": 0, "lenient_counts": True} if step % 2
                      else {"num_lookahead_tokens": 0, "reserved_blocks": 0})
            assert mgr.allocate_slots(req, 1, **kwargs) is not None
            req.num_computed_tokens = req.num_tokens
    assert python_calls[0] == 0
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


def _constructor_arguments(mgr: KVCacheManager) -> dict[str, Any]:
    """GroupsAllocate's valid keyword arguments for ``mgr``, but its groups and plans."""
    return {"function": KVCacheManager.allocate_slots,
            "cache_function": KVCacheManager.cache_blocks, "manager": mgr,
            "live_requests": {}, "pool": mgr.pool, "zeroing": [False], "new_block_ids": [[]],
            "request_type": Request, "max_model_len": 8, "hash_block_size": 4,
            "cache_alignment": 1}


def test_constructor_refuses_bad_groups() -> None:
    ccore = native.module()
    assert ccore is not None
    mgr, _ = manager_pair("full+swa")
    good = {**_constructor_arguments(mgr), "cache_plan": ()}
    for groups in [(), ((0, 9, 0, 4, 0, None, {}),), ((0, 1, 0, 4, 0, None, {}),),
                   ((0, 2, 0, 4, 6, None, {}),), ((0, 0, 0, 0, 0, None, {}),)]:
        with pytest.raises(ValueError, match="GroupsAllocate"):
            ccore.GroupsAllocate(**good, groups=groups)


@pytest.mark.parametrize("layout", ["full+mamba", "full+swa+mamba", "full+chunked", "swa",
                                    "full8+swa4"])
def test_running_steps_call_no_group_method(layout: str) -> None:
    """A running request's step runs a Mamba group's release and growth
    (``ccore_hybrid_step.h``) and every plain or Mamba group's registration in C: none of
    the managers' methods is called (instance spies shadow them; aside: a sliding window
    registering only some blocks, a group of several hash blocks per block whose prompt
    tail entry its method checks), and the tables, events and pool agree with the pure
    core's step by step."""
    mgr, pure = manager_pair(layout)
    calls: list[str] = []
    for m in mgr.coordinator.managers:
        for name in ("remove_skipped_blocks", "allocate_new_blocks",
                     "get_num_blocks_to_allocate", "cache_blocks"):
            if name == "remove_skipped_blocks" and not m.drops_blocks:
                continue
            if name == "cache_blocks" and (
                    (isinstance(m, SlidingWindowManager) and m.reachable_mask(0, 1) is not None)
                    or m.hash_stride > 1):
                continue  # some blocks only, or a prompt's tail entry: its method
            method = getattr(m, name)

            def spy(*args: Any, _name: str = name, _method: Any = method) -> Any:
                calls.append(_name)
                return _method(*args)

            setattr(m, name, spy)
    reqs = [[_running(m, f"r{i}", 6 + 3 * i) for i in range(2)] for m in (mgr, pure)]
    calls.clear()
    for step in range(24):
        for m, rs in zip((mgr, pure), reqs, strict=True):
            for req in rs:
                req.append_output_tokens([step % 3])
                assert m.allocate_slots(req, 1, num_lookahead_tokens=step % 2) is not None
                req.num_computed_tokens = req.num_tokens
            if step % 5 == 4:
                m.new_step_starts()
        assert calls == []
        assert mgr.take_events() == pure.take_events()
        assert mgr.debug_state() == pure.debug_state()
    mgr.check_invariants()


def test_constructor_refuses_bad_state_and_registration_entries() -> None:
    ccore = native.module()
    assert ccore is not None
    mgr, _ = manager_pair("full+mamba")
    good = _constructor_arguments(mgr)
    state = ({}, {}, set(), {})
    for groups, plan in [
        (((2, 0, 1, 4, 0, None, {}),), ()),                       # a state kind, no state
        (((2, 0, 1, 4, 0, None, {}, ({}, {}, {}, {})),), ()),     # allocated not a set
        (((2, 0, 0, 4, 0, None, {}, state),), ()),                # growth with lookahead
        (((0, 0, 0, 4, 0, None, {}),), ((4, None, {}, None, (1, 1, 0, {}, {}, set(), {}, 0)),)),
        (((0, 0, 0, 4, 0, None, {}),), ((4, None, {}, {}, (4, 1, 0, {}, {}, set(), {}, 0)),)),
        (((0, 0, 0, 4, 0, None, {}),), ((4, None, {}, {}, (1, 1, 0, {}, {}, set())),)),
    ]:
        with pytest.raises((TypeError, ValueError), match="GroupsAllocate"):
            ccore.GroupsAllocate(**good, groups=groups, cache_plan=plan)
    with pytest.raises(TypeError, match="GroupsAllocate registrar"):
        ccore.GroupsAllocate(**good, groups=((0, 0, 0, 4, 0, None, {}),), cache_plan=(),
                             registrar=(mgr.pool, [], [], 3, None))
