"""pagedkv's vLLM schedulers build one pool: vLLM's constructor gets pagedkv's manager
where it would build its own, so vLLM's ``KVCacheManager`` and ``BlockPool`` are never
constructed (stock builds one of each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (pip install 'pagedkv[vllm]')")

from vllm_sched_support import build_scheduler, make_requests, run


def _count_constructions(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    from vllm.v1.core import block_pool, kv_cache_manager

    built = {"BlockPool": 0, "KVCacheManager": 0}
    for module, name in ((block_pool, "BlockPool"), (kv_cache_manager, "KVCacheManager")):
        cls = getattr(module, name)
        init = cls.__init__

        def counted(self: Any, *args: Any, _init: Any = init, _name: str = name,
                    **kwargs: Any) -> None:
            built[_name] += 1
            _init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counted)
    return built


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_one_pool_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        async_scheduling: bool) -> None:
    import vllm.v1.core.sched.scheduler as vllm_scheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler
    from pagedkv.vllm.manager import VLLMKVCacheManager

    stock_name = vllm_scheduler.KVCacheManager
    built = _count_constructions(monkeypatch)
    stock_cls = AsyncScheduler if async_scheduling else Scheduler
    build_scheduler(tmp_path, stock_cls, async_scheduling=async_scheduling, num_blocks=64)
    assert built == {"BlockPool": 1, "KVCacheManager": 1}
    paged_cls = PagedKVAsyncScheduler if async_scheduling else PagedKVScheduler
    s = build_scheduler(tmp_path, paged_cls, async_scheduling=async_scheduling,
                        num_blocks=64)
    assert built == {"BlockPool": 1, "KVCacheManager": 1}  # none more
    assert isinstance(s.kv_cache_manager, VLLMKVCacheManager)
    assert vllm_scheduler.KVCacheManager is stock_name  # restored after construction
    run(s, make_requests(4, max_tokens=8), overlap=async_scheduling)
    assert s.kv_cache_manager.pagedkv.num_free_blocks == 63


def test_a_refusal_restores_vllms_name(tmp_path: Path) -> None:
    import vllm.v1.core.sched.scheduler as vllm_scheduler

    from pagedkv.vllm import PagedKVScheduler
    from pagedkv.vllm.layout import UnsupportedLayoutError

    stock_name = vllm_scheduler.KVCacheManager
    with pytest.raises(UnsupportedLayoutError, match="additional_config"):
        build_scheduler(tmp_path, PagedKVScheduler, async_scheduling=False, num_blocks=64,
                        additional_config={"pagedkv": {"nonsense": 1}})
    assert vllm_scheduler.KVCacheManager is stock_name


def test_another_schedulers_manager_stays_vllms(monkeypatch: pytest.MonkeyPatch) -> None:
    # While a pagedkv scheduler is being built, a manager asked for with another
    # kv_cache_config (another scheduler's construction) is built by vLLM's own name.
    import vllm.v1.core.sched.scheduler as vllm_scheduler

    from pagedkv.vllm.scheduler import _pagedkv_built_in_place

    def stock(**kwargs: Any) -> tuple[str, Any]:
        return ("stock", kwargs["kv_cache_config"])

    monkeypatch.setattr(vllm_scheduler, "KVCacheManager", stock)

    class Building:
        kv_cache_config = object()

    other = object()
    with _pagedkv_built_in_place(Building()):
        assert vllm_scheduler.KVCacheManager(kv_cache_config=other) == ("stock", other)
    assert vllm_scheduler.KVCacheManager is stock
