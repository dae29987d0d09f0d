"""The manager's ``block_pool`` as vLLM's own code and tests use it beyond reads:
``get_new_blocks``, ``touch``, ``free_blocks`` and copies queued on a group's
``_pending_cow_copies`` — the same scenario on vLLM's stock scheduler and on pagedkv's,
the same observations (ref counts, free blocks, copies, deferred frees)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (pip install 'pagedkv[vllm]')")

from vllm_sched_support import build_scheduler, make_requests

from pagedkv.vllm.harness import schedule


def _sides() -> tuple[type, type]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from pagedkv.vllm import PagedKVAsyncScheduler

    return AsyncScheduler, PagedKVAsyncScheduler


def _deferred_copy_scenario(s: Any) -> list[Any]:
    """vLLM's deferred-free case: a copy queued from outside rides the next step; its
    endpoints (held only by the copy) stay out of the free queue until that step's output
    is processed, even when the pool is otherwise exhausted."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

    s.defer_block_free = True
    pool = s.kv_cache_manager.block_pool
    group = s.kv_cache_manager.coordinator.single_type_managers[0]
    seen: list[Any] = []
    s.add_request(make_requests(1, shared=0, max_tokens=5)[0])
    src, dst = pool.get_new_blocks(2)
    seen.append((src.ref_cnt, dst.ref_cnt, pool.get_num_free_blocks()))
    group._pending_cow_copies.append((src, dst))
    out0, mro0 = schedule(s, 0)
    assert out0.kv_cache_block_copies == [KVCacheBlockCopy(src.block_id, dst.block_id)]
    rest = pool.get_new_blocks(pool.get_num_free_blocks())
    seen.append((len(rest), pool.get_num_free_blocks()))
    with pytest.raises(ValueError, match="Cannot get 1 free blocks from the pool"):
        pool.get_new_blocks(1)
    out1, _ = schedule(s, 1)
    seen.append((src.ref_cnt, dst.ref_cnt, bool(s.deferred_frees)))
    s.update_from_output(out0, mro0)
    seen.append((src.ref_cnt, dst.ref_cnt, bool(s.deferred_frees), pool.get_num_free_blocks()))
    # touch: a free block leaves the free queue; free_blocks gives it back.
    pool.touch([src, pool.null_block])
    seen.append((src.ref_cnt, pool.get_num_free_blocks()))
    pool.free_blocks([src])
    seen.append((src.ref_cnt, pool.get_num_free_blocks()))
    pool.free_blocks(rest)
    seen.append(pool.get_num_free_blocks())
    return seen


def test_deferred_copy_endpoints_as_vllm(tmp_path: Path) -> None:
    stock_cls, paged_cls = _sides()
    got = [_deferred_copy_scenario(build_scheduler(tmp_path, cls, async_scheduling=True,
                                                   num_blocks=64, window=None))
           for cls in (stock_cls, paged_cls)]
    assert got[1] == got[0]
    # Held by the copy only until step 0 is processed; then both are free again.
    assert got[1][2] == (1, 1, True)
    assert got[1][3][:3] == (0, 0, False)
    assert got[1][4][0] == 1 and got[1][5][0] == 0
