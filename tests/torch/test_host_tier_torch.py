"""The host tier's plans executed on real tensors: logits stay bitwise equal to a run
without caching while prefixes are evicted from the device, stored to host tensors and
loaded back; a skipped or misdirected copy is caught."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pagedkv.torch import ShuffledPlacement
from pagedkv.torch.check import compare_runs, layout_named, run_layout, workload
from pagedkv.torch.host_tier import (
    HostKVTensors,
    HostTierEngine,
    run_layout_with_host,
)


def _shuffled(n: int) -> ShuffledPlacement:
    return ShuffledPlacement(num_blocks=n, seed=3)


def _evicting_workload() -> list[tuple[str, list[int], int]]:
    """Five 48-token prefixes in turn, each with a short suffix: the tight pool (23 blocks)
    cannot keep the five prefixes (30 blocks), so each is evicted before it comes back."""
    prefixes = [[(7 * p + 3 * i + p * p) % 96 for i in range(48)] for p in range(5)]
    return [(f"r{k}", prefixes[k % 5] + [(k * 5 + j) % 96 for j in range(4 + k % 5)], 3)
            for k in range(15)]


@pytest.mark.parametrize("name", ["full", "mla"])
@pytest.mark.parametrize("write_through", [False, True], ids=["on-eviction", "write-through"])
def test_host_tier_logits_bitwise_equal_to_no_caching(name: str, write_through: bool) -> None:
    layout = layout_named(name)
    for requests in (_evicting_workload(), workload()):
        hosted = run_layout_with_host(layout, num_host_blocks=64, placement=_shuffled,
                                      write_through=write_through, requests=requests)
        cold = run_layout(layout, enable_caching=False, requests=requests)
        result = compare_runs(name, hosted.run, cold)
        t = hosted.transfers
        # not vacuous: the device evicted, blocks went to host and came back
        assert result.evicted_blocks > 0 and t.stored_blocks > 0 and t.loaded_blocks > 0
        assert result.computed_tokens_cached < result.computed_tokens_uncached
        assert result.bitwise_equal and result.max_abs_diff == 0.0
        assert result.null_block_untouched


def test_host_tier_loads_more_than_it_would_recompute() -> None:
    """The evicting workload: the host tier turns evictions into hits (more hit tokens
    than prefix caching alone on the same pool)."""
    layout = layout_named("full")
    reqs = _evicting_workload()
    hosted = run_layout_with_host(layout, num_host_blocks=64, requests=reqs)
    device_only = run_layout(layout, enable_caching=True, requests=reqs)
    assert hosted.transfers.loaded_blocks >= 6
    assert hosted.run.stats.hit_tokens > device_only.stats.hit_tokens


class _SkipLoads(HostTierEngine):
    """Confirms loads without copying: the loaded blocks keep their NaN poison."""

    def _copy_in_before_forward(self) -> None:
        for plan in self.tiered.take_load_plans():
            self.tiered.complete_load(plan, True)
            self.transfers.loaded_blocks += plan.num_blocks


class _StoreWrongPage(HostTierEngine):
    """Stores the page after the right one: loads bring back another block's KV."""

    def _store(self, plan: Any) -> None:
        host_ids, pages = self._ids(plan)
        wrong = torch.where(pages + 1 < self.cache.num_blocks, pages + 1, pages - 1)
        self.host.store(wrong, host_ids)
        self.tiered.complete_store(plan, True)
        self.transfers.stored_blocks += int(host_ids.numel())


@pytest.mark.parametrize("broken", [_SkipLoads, _StoreWrongPage])
def test_a_broken_copy_fails_the_comparison(broken: type[HostTierEngine],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import pagedkv.torch.host_tier as ht

    monkeypatch.setattr(ht, "HostTierEngine", broken)
    layout = layout_named("full")
    reqs = _evicting_workload()
    hosted = run_layout_with_host(layout, num_host_blocks=64, requests=reqs)
    cold = run_layout(layout, enable_caching=False, requests=reqs)
    assert hosted.transfers.loaded_blocks > 0
    assert not compare_runs("full", hosted.run, cold).bitwise_equal


def test_host_tensors_mirror_the_device_layout() -> None:
    from pagedkv.torch.tensors import KVCacheTensors

    plan = layout_named("full").plan()
    cache = KVCacheTensors(plan, dtype=torch.float32, fill=0.0)
    host = HostKVTensors(cache, 5, pin=False, fill=0.0)
    host.check_invariants()
    assert host.num_bytes == 5 * plan.page_size_bytes * len(plan.tensors)
    cache.pages[0][3] = 1.5
    host.store(torch.tensor([3]), torch.tensor([4]))
    assert bool((host.pages[0][4] == 1.5).all()) and bool((host.pages[1][4] == 0).all())
    host.load(torch.tensor([4]), torch.tensor([2]))
    assert torch.equal(cache.pages[0][2], cache.pages[0][3])


@pytest.mark.parametrize("name", ["full+sliding", "full+chunked", "full+mamba"])
@pytest.mark.parametrize("write_through", [False, True], ids=["on-eviction", "write-through"])
def test_hybrid_layouts_host_tier_logits_bitwise_equal(name: str, write_through: bool) -> None:
    """Each group by its own host rule (window blocks, the chunk, the Mamba state loaded
    into the live block): logits still bitwise equal to a run without caching."""
    layout = layout_named(name)
    loaded = 0
    for requests in (_evicting_workload(), workload()):
        hosted = run_layout_with_host(layout, num_host_blocks=64, placement=_shuffled,
                                      write_through=write_through, requests=requests)
        result = compare_runs(name, hosted.run,
                              run_layout(layout, enable_caching=False, requests=requests))
        assert result.evicted_blocks > 0 and hosted.transfers.stored_blocks > 0
        assert result.bitwise_equal and result.max_abs_diff == 0.0
        assert result.null_block_untouched
        loaded += hosted.transfers.loaded_blocks
    assert loaded > 0, "no host load: the test exercises nothing"
