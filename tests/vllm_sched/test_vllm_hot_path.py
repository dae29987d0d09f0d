"""The compiled core on vLLM's hot path, sync and async scheduling.

A running request's decode allocation reaches the façade as ``allocate_slots(view, n,
num_in_flight_tokens=k, lenient_counts=True)`` (vLLM's own counting, one step in flight
under async scheduling), which the compiled core's ``DecodeAllocate`` takes without
calling Python; only admissions (a hit to adopt, a first allocation) reach the Python
method. On a hybrid (full attention + sliding window) the same call is taken by the
compiled ``GroupsAllocate`` (window release, capacity check, growth and registration for
every group), and the lookups, frees, block takes and registrations reach the compiled
loops as far as the core has them: counted here per path, with the Python fallbacks.
That the schedules stay exactly stock's is ``test_scheduler_cls``'s check (both cores)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (pip install 'pagedkv[vllm]')")

from vllm_sched_support import build_scheduler, make_requests, run

from pagedkv.core import fast_paths, native
from pagedkv.core.manager import KVCacheManager

NUM_REQUESTS = 12
MAX_TOKENS = 24
compiled_only = pytest.mark.skipif(native.active() is None,
                                   reason="the compiled core is not in use")


def _scheduler(tmp: Path, async_scheduling: bool, window: int | None = None) -> Any:
    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler

    cls = PagedKVAsyncScheduler if async_scheduling else PagedKVScheduler
    return build_scheduler(tmp, cls, async_scheduling=async_scheduling, num_blocks=400,
                           window=window)


def _count_adapter_calls(s: Any) -> dict[str, Any]:
    """Wrap the façade's allocate_slots (whatever it is) to count calls by keyword set."""
    mgr = s.kv_cache_manager.pagedkv
    inner = mgr.allocate_slots
    seen: dict[str, Any] = {"calls": 0, "steady": 0}

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen["calls"] += 1
        if sorted(kwargs) == ["lenient_counts", "num_in_flight_tokens"]:
            seen["steady"] += 1
        return inner(*args, **kwargs)

    mgr.allocate_slots = counted
    return seen


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("window", [None, 32], ids=["full", "full+swa"])
def test_decode_calls_carry_only_the_engine_counting(tmp_path: Path, window: int | None,
                                                     overlap: bool) -> None:
    s = _scheduler(tmp_path, overlap, window)
    seen = _count_adapter_calls(s)
    run(s, make_requests(NUM_REQUESTS, max_tokens=MAX_TOKENS), overlap=overlap)
    # One general call per admission (roomy pool: no preemption), every decode steady.
    assert seen["calls"] - seen["steady"] == NUM_REQUESTS
    assert seen["steady"] >= NUM_REQUESTS * (MAX_TOKENS - 4)


@compiled_only
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("window", "kernel"), [(None, "DecodeAllocate"),
                                                (32, "GroupsAllocate")],
                         ids=["full", "full+swa"])
def test_compiled_decode_path_takes_every_decode_call(tmp_path: Path, overlap: bool,
                                                      window: int | None, kernel: str) -> None:
    s = _scheduler(tmp_path, overlap, window)
    mgr = s.kv_cache_manager.pagedkv
    fallbacks = [0]

    def python_method(self: KVCacheManager, *args: Any, **kwargs: Any) -> Any:
        fallbacks[0] += 1
        return KVCacheManager.allocate_slots(self, *args, **kwargs)

    # The same compiled object the manager installs, with a counting Python method.
    fast = fast_paths.install(mgr, python_method, KVCacheManager.cache_blocks)
    assert fast is not None and type(fast).__name__ == kernel
    mgr.allocate_slots = fast
    seen = _count_adapter_calls(s)
    run(s, make_requests(NUM_REQUESTS, max_tokens=MAX_TOKENS), overlap=overlap)
    assert seen["calls"] >= NUM_REQUESTS * (MAX_TOKENS - 3)
    # Only the admissions reach Python; every decode step stays in C, async included.
    assert fallbacks[0] == NUM_REQUESTS


def _count_compiled_loops(pool: Any) -> dict[str, int]:
    """Wrap the pool's compiled loops, and the Python entry points that would use them,
    with counters (instance attributes, read on every call)."""
    counts: dict[str, int] = {}

    def wrap(name: str, key: str) -> None:
        # The registration kernel is the pool's index's (pool.prefix).
        owner = pool.prefix if name == "_index_register" else pool
        inner = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[key] = counts.get(key, 0) + 1
            return inner(*args, **kwargs)

        setattr(owner, name, counted)

    for name, key in [("_pool_free", "free: C"), ("free_blocks", "free: calls"),
                      ("_pool_take", "take: C"), ("get_new_blocks", "take: calls"),
                      ("_index_register", "register: C"),
                      ("cache_full_blocks", "register: calls"),
                      ("longest_hit", "lookup: C")]:
        wrap(name, key)
    return counts


@compiled_only
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_hybrid_pool_loops_reach_the_compiled_core(tmp_path: Path, overlap: bool) -> None:
    s = _scheduler(tmp_path, overlap, window=32)
    mgr = s.kv_cache_manager.pagedkv
    assert type(mgr.allocate_slots).__name__ == "GroupsAllocate"  # two groups, in C
    counts = _count_compiled_loops(mgr.pool)
    run(s, make_requests(NUM_REQUESTS, max_tokens=MAX_TOKENS), overlap=overlap)
    # Frees, takes and registrations: every call in C (block 16, window 32: every
    # window block is reachable, so registration takes no mask and stays compiled).
    for path in ("free", "take"):
        assert counts[f"{path}: calls"] > NUM_REQUESTS, path
        assert counts[f"{path}: C"] == counts[f"{path}: calls"], path
    # A running step's registration calls the index's kernel from C (GroupsAllocate),
    # without the pool's cache_full_blocks: more kernel calls than Python entries.
    assert counts["register: C"] > NUM_REQUESTS
    assert counts["register: C"] >= counts["register: calls"]
    # The lookup is one C call over both groups (HybridHit: every group's rule and the
    # fixed point), so the per-group probe kernel is never called from Python.
    assert type(mgr.coordinator.find_longest_cache_hit).__name__ == "HybridHit"
    assert counts.get("lookup: C", 0) == 0
