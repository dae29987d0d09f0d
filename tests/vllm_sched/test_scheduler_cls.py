"""vLLM 0.33's own schedulers built through ``SchedulerConfig(scheduler_cls=...)`` with
pagedkv's classes, stepped beside the stock schedulers: the same tokens scheduled, the
same block ids, the same prefix hits and preemptions, step by step (sync and async;
shared prefixes, a pool small enough to preempt, a sliding-window group)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (pip install 'pagedkv[vllm]')")

from vllm_sched_support import build_scheduler, make_requests, run


def _classes(async_scheduling: bool) -> tuple[type, type]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler

    if async_scheduling:
        return AsyncScheduler, PagedKVAsyncScheduler
    return Scheduler, PagedKVScheduler


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("window", [32, None, "mamba"], ids=["full+swa", "full", "full+mamba"])
@pytest.mark.parametrize("num_blocks", [400, 28], ids=["roomy", "preempting"])
def test_pagedkv_schedules_exactly_as_the_stock_scheduler(
        tmp_path: Path, async_scheduling: bool, window: int | str | None,
        num_blocks: int) -> None:
    stock_cls, paged_cls = _classes(async_scheduling)
    layout = ({"window": None, "mamba": True} if window == "mamba"
              else {"window": window})
    stock = build_scheduler(tmp_path, stock_cls, async_scheduling=async_scheduling,
                            num_blocks=num_blocks, **layout)
    paged = build_scheduler(tmp_path, paged_cls, async_scheduling=async_scheduling,
                            num_blocks=num_blocks, **layout)
    from pagedkv.vllm import VLLMKVCacheManager

    assert isinstance(paged.kv_cache_manager, VLLMKVCacheManager)
    assert not isinstance(stock.kv_cache_manager, VLLMKVCacheManager)
    want = run(stock, make_requests(10), overlap=async_scheduling)
    got = run(paged, make_requests(10), overlap=async_scheduling)
    for i, (a, b) in enumerate(zip(want.steps, got.steps, strict=False)):
        assert b == a, f"step {i} differs"
    assert len(got.steps) == len(want.steps)
    hits = sum(n for s in want.steps for n, _ in s.get("new", {}).values())
    assert hits > 0, "the workload must hit the prefix cache"
    if num_blocks == 28:
        assert any(s.get("preempted") for s in want.steps), "the small pool must preempt"
    paged.kv_cache_manager.pagedkv.check_invariants()


def test_the_class_path_string_resolves_to_pagedkv(tmp_path: Path) -> None:
    s = build_scheduler(tmp_path, "pagedkv.vllm.PagedKVScheduler", async_scheduling=False,
                        num_blocks=100)
    assert type(s.kv_cache_manager).__name__ == "VLLMKVCacheManager"
    assert s.kv_cache_manager.pagedkv.num_free_blocks == 99
