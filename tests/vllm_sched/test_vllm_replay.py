"""DeepSeek-V4's layout inside vLLM 0.33's scheduler: fp32 full attention beside a bf16
sliding-window MLA group with bounded prefix replay. The layout maps to pagedkv's
``SlidingWindowMLASpec`` (zeroing on: the two precisions differ); pagedkv's scheduler,
stepped beside the stock one, replays every hit's last window with the same tokens and
block ids, step by step (sync and async, roomy and preempting pools)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (pip install 'pagedkv[vllm]')")

from vllm_sched_support import build_scheduler, make_requests, run

BS, WINDOW = 16, 32


def _groups(swa_block_size: int = BS, extra_retained_tokens: int = 0) -> list[Any]:
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheGroupSpec,
        SlidingWindowMLASpec,
    )

    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    swa = SlidingWindowMLASpec(block_size=swa_block_size, num_kv_heads=1, head_size=64,
                               dtype=torch.bfloat16, sliding_window=WINDOW,
                               bounded_replay=True,
                               extra_retained_tokens=extra_retained_tokens)
    return [KVCacheGroupSpec(["full"], full), KVCacheGroupSpec(["swa"], swa)]


def _config(num_blocks: int, **kw: Any) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheConfig

    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=_groups(**kw))


def test_the_layout_maps_to_sliding_window_mla_with_zeroing() -> None:
    from pagedkv.core.specs_window_mla import SlidingWindowMLASpec
    from pagedkv.vllm.layout import cache_config_for

    cfg = cache_config_for(_config(100), max_model_len=512)
    swa = cfg.groups[1]
    assert isinstance(swa, SlidingWindowMLASpec)
    assert (swa.bounded_replay, swa.sliding_window, swa.prefix_replay_tokens) == (True, 32, 32)
    assert swa.page_size_bytes == BS * 64 * 2
    assert cfg.zero_new_blocks is True  # fp32 beside bf16: vLLM zeroes new blocks


@pytest.mark.parametrize(("kw", "why"), [
    ({"swa_block_size": 32}, "other block sizes"),
    ({"extra_retained_tokens": 3}, "retaining 3 extra tokens"),
])
def test_what_stays_refused_is_named(kw: dict[str, int], why: str) -> None:
    from pagedkv.vllm.layout import UnsupportedLayoutError, cache_config_for

    with pytest.raises(UnsupportedLayoutError, match=why) as err:
        cache_config_for(_config(100, **kw), max_model_len=512)
    assert "\n" not in str(err.value)


def _scheduler(tmp_path: Path, cls: Any, async_scheduling: bool, num_blocks: int) -> Any:
    from vllm.v1.structured_output import StructuredOutputManager

    base = build_scheduler(tmp_path, cls, async_scheduling=async_scheduling,
                           num_blocks=num_blocks, window=None)
    cfg = base.vllm_config
    scheduler = type(base)(vllm_config=cfg, kv_cache_config=_config(num_blocks),
                           block_size=BS, log_stats=True,
                           structured_output_manager=StructuredOutputManager(cfg))
    assert scheduler.prefix_replay_tokens == WINDOW
    return scheduler


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("num_blocks", [400, 28], ids=["roomy", "preempting"])
def test_pagedkv_replays_exactly_as_the_stock_scheduler(
        tmp_path: Path, async_scheduling: bool, num_blocks: int) -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler, VLLMKVCacheManager

    stock_cls, paged_cls = ((AsyncScheduler, PagedKVAsyncScheduler) if async_scheduling
                            else (Scheduler, PagedKVScheduler))
    stock = _scheduler(tmp_path, stock_cls, async_scheduling, num_blocks)
    paged = _scheduler(tmp_path, paged_cls, async_scheduling, num_blocks)
    assert isinstance(paged.kv_cache_manager, VLLMKVCacheManager)
    requests = {"shared": 96, "num_prefixes": 2, "max_tokens": 12 if num_blocks > 100 else 80}
    want = run(stock, make_requests(12, **requests), overlap=async_scheduling)
    got = run(paged, make_requests(12, **requests), overlap=async_scheduling)
    for i, (a, b) in enumerate(zip(want.steps, got.steps, strict=False)):
        assert b == a, f"step {i} differs"
    assert len(got.steps) == len(want.steps)
    # Replayed admissions start at the hit less the window (a 96-token hit: 64).
    starts = [n for s in want.steps for n, _ in s.get("new", {}).values()]
    assert 96 - WINDOW in starts, starts
    if num_blocks == 28:
        assert any(s.get("preempted") for s in want.steps), "the small pool must preempt"
    paged.kv_cache_manager.pagedkv.check_invariants()


@pytest.mark.parametrize("skip", [(), (0,), (0, 1)])
def test_blocks_an_async_load_restores_are_not_zeroed(skip: tuple[int, ...]) -> None:
    """An 80-token local hit plus a 16-token load (96 computed) and 4 new tokens: the
    load's blocks (full attention position 5; window positions 4 and 5, below token 96)
    leave the zeroing list in the groups the load restores; the new tokens' block
    (position 6) is zeroed in every group, and is all the allocation returns."""
    from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
    from pagedkv.core.specs_window_mla import SlidingWindowMLASpec
    from pagedkv.vllm.zeroing import skipping_zeroing

    swa = SlidingWindowMLASpec(block_size=BS, num_kv_heads=1, head_size=64, dtype_bytes=2,
                               sliding_window=WINDOW, bounded_replay=True)
    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype_bytes=4)
    mgr = KVCacheManager(CacheConfig(groups=(full, swa), num_blocks=64, max_model_len=512,
                                     zero_new_blocks=True))
    prompt = list(range(100))
    first = mgr.new_request("first", prompt[:80])
    assert mgr.allocate_slots(first, 80) is not None
    mgr.take_new_block_ids()
    req = mgr.new_request("load", prompt)
    hit = mgr.get_computed_blocks(req)
    assert hit.num_computed_tokens == 80
    with skipping_zeroing(mgr, skip):
        new = mgr.allocate_slots(req, 4, new_computed_blocks=hit,
                                 num_external_computed_tokens=16)
    assert new is not None
    assert mgr.coordinator.skip_zeroing_group_ids == ()  # one allocation only
    zeroed = set(mgr.take_new_block_ids())
    tables = mgr.get_block_ids("load")
    loaded = {0: {tables[0][5]}, 1: {tables[1][4], tables[1][5]}}
    assert new == ([tables[0][6]], [tables[1][6]])
    for g in (0, 1):
        assert tables[g][6] in zeroed
        assert loaded[g].isdisjoint(zeroed) == (g in skip)
    mgr.check_invariants()
