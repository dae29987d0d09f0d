"""The compiled core on vLLM's hot path: under pagedkv's vLLM schedulers (sync) a running
request's decode allocation reaches the façade as ``allocate_slots(view, n)`` (no
keywords), which the compiled core's ``DecodeAllocate`` takes without calling Python.
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


def _scheduler(tmp: Path, async_scheduling: bool, window: int | None = None) -> Any:
    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler

    cls = PagedKVAsyncScheduler if async_scheduling else PagedKVScheduler
    return build_scheduler(tmp, cls, async_scheduling=async_scheduling, num_blocks=400,
                           window=window)


def _count_adapter_calls(s: Any) -> dict[str, int]:
    """Wrap the façade's allocate_slots (whatever it is) to count calls by shape."""
    mgr = s.kv_cache_manager.pagedkv
    inner = mgr.allocate_slots
    seen = {"positional": 0, "keywords": 0}

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen["keywords" if kwargs else "positional"] += 1
        return inner(*args, **kwargs)

    mgr.allocate_slots = counted
    return seen


@pytest.mark.parametrize("window", [None, 32], ids=["full", "full+swa"])
def test_only_first_allocations_carry_keywords(tmp_path: Path, window: int | None) -> None:
    s = _scheduler(tmp_path, False, window)
    seen = _count_adapter_calls(s)
    run(s, make_requests(NUM_REQUESTS, max_tokens=24))
    # One admission per request (roomy pool: no preemption), every decode step positional.
    assert seen["keywords"] == NUM_REQUESTS
    assert seen["positional"] >= NUM_REQUESTS * 20


def test_async_steps_in_flight_keep_the_lenient_call(tmp_path: Path) -> None:
    # With one step in flight vLLM counts its token as computed before appending it, so
    # a decode call's tokens run past the request's: only the lenient (keyword) call
    # means that, and the compiled decode path does not take it (docs/vllm.md).
    s = _scheduler(tmp_path, True)
    seen = _count_adapter_calls(s)
    run(s, make_requests(NUM_REQUESTS, max_tokens=24), overlap=True)
    assert seen["keywords"] >= NUM_REQUESTS * 20


@pytest.mark.skipif(native.active() is None, reason="the compiled core is not in use")
def test_compiled_decode_path_takes_the_adapters_calls(tmp_path: Path) -> None:
    s = _scheduler(tmp_path, False)  # one full-attention group: what the fast path covers
    mgr = s.kv_cache_manager.pagedkv
    python_calls = [0]

    def python_method(self: KVCacheManager, *args: Any, **kwargs: Any) -> Any:
        python_calls[0] += 1
        return KVCacheManager.allocate_slots(self, *args, **kwargs)

    # The same compiled object the manager installs, with a counting Python method.
    fast = fast_paths.install(mgr, python_method)
    assert fast is not None and type(fast).__name__ == "DecodeAllocate"
    mgr.allocate_slots = fast
    seen = _count_adapter_calls(s)
    run(s, make_requests(NUM_REQUESTS, max_tokens=24))
    total = seen["keywords"] + seen["positional"]
    assert total >= NUM_REQUESTS * 21
    # Only the admissions reach Python; every decode step stays in C.
    assert python_calls[0] == NUM_REQUESTS
