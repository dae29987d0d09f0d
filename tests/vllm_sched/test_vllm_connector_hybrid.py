"""A KV connector's calls on a Mamba hybrid, vLLM 0.33's manager beside pagedkv's
adapter: each group's own hit (``get_computed_blocks_for_connector`` and the
coordinator's ``find_longest_cache_hit_per_group``), the boundary states offered to the
connector (``take_boundary_state_offloads``), and the multi-module MTP block-size rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (pip install 'pagedkv[vllm]')")

from vllm_sched_support import build_scheduler

BS = 16


def _pair(tmp_path: Path) -> tuple[Any, Any]:
    from vllm.v1.core.sched.scheduler import Scheduler

    from pagedkv.vllm import PagedKVScheduler

    stock = build_scheduler(tmp_path, Scheduler, async_scheduling=False, num_blocks=60,
                            window=None, mamba=True)
    paged = build_scheduler(tmp_path, PagedKVScheduler, async_scheduling=False,
                            num_blocks=60, window=None, mamba=True)
    return stock.kv_cache_manager, paged.kv_cache_manager


def _request(rid: str, num_blocks: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    return Request(request_id=rid, prompt_token_ids=list(range(1, num_blocks * BS + 1)),
                   sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                   block_hasher=get_request_block_hasher(BS, sha256))


def _seed(mgr: Any, num_blocks: int) -> dict[str, list[tuple[int, int, int]]]:
    """One block per step (every Mamba boundary registered); the states offered."""
    req = _request("fill", num_blocks)
    blocks, _n, _b = mgr.get_computed_blocks(req)
    offers: dict[str, list[tuple[int, int, int]]] = {}
    for i in range(num_blocks):
        assert mgr.allocate_slots(req, BS, new_computed_blocks=blocks if i == 0 else None)
        req.num_computed_tokens += BS
        for rid, found in mgr.take_boundary_state_offloads().items():
            offers.setdefault(rid, []).extend(found)
        mgr.new_step_starts()
    mgr.free(req)
    return offers


def _connector_lookup(mgr: Any, num_blocks: int) -> tuple[Any, ...]:
    req = _request("replay", num_blocks)
    blocks, n, boundary, diverged = mgr.get_computed_blocks_for_connector(req)
    _, per_group = mgr.coordinator.find_longest_cache_hit_per_group(
        req.block_hashes, req.num_tokens - 1)
    return blocks.get_block_ids(), n, boundary, diverged, tuple(per_group)


@pytest.mark.parametrize(("evict", "replay_blocks", "expected"), [
    # Mamba deeper than full attention: the hit every group agrees on.
    ((("fa", 2), ("fa", 3), ("mamba", 1), ("mamba", 2)), 5, (16, False, (32, 64))),
    # Full attention deeper: its hit, flagged.
    ((("mamba", 1), ("mamba", 2), ("mamba", 3)), 6, (64, True, (64, 16))),
    ((), 6, (64, False, (64, 64))),  # every group agrees
])
def test_connector_lookups_and_offers_equal_vllms(tmp_path: Path, evict: Any,
                                                   replay_blocks: int,
                                                   expected: tuple[Any, ...]) -> None:
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

    stock, paged = _pair(tmp_path)
    assert isinstance(paged.coordinator, HybridKVCacheCoordinator)
    assert paged.coordinator.full_attention_group_id == stock.coordinator.full_attention_group_id
    offers = [_seed(m, 4) for m in (stock, paged)]
    assert offers[0] == offers[1] and len(offers[0]["fill"]) == 4
    mamba = [block for _g, block, _n in offers[0]["fill"]]
    for m in (stock, paged):
        m.block_pool.evict_blocks({mamba[i] for kind, i in evict if kind == "mamba"})
    _evict_full_attention(stock, paged, [i for kind, i in evict if kind == "fa"])
    want = _connector_lookup(stock, replay_blocks)
    got = _connector_lookup(paged, replay_blocks)
    assert got == want
    assert (got[1], got[3], got[4]) == expected
    paged.pagedkv.check_invariants()


def _evict_full_attention(stock: Any, paged: Any, positions: list[int]) -> None:
    """Evict the full-attention blocks at ``positions`` of the seeded prompt (looked up by
    hash, as the pools hold the same ids)."""
    req = _request("fa-probe", 4)
    ids = []
    for i in positions:
        found = stock.block_pool.get_cached_block(req.block_hashes[i], [0])
        assert found is not None
        ids.append(found[0].block_id)
        assert paged.block_pool.get_cached_block(req.block_hashes[i], [0])[0].block_id == (
            found[0].block_id)
    for m in (stock, paged):
        m.block_pool.evict_blocks(set(ids))


def test_mtp_needs_a_scheduler_block_at_least_its_lookahead() -> None:
    from types import SimpleNamespace

    from pagedkv.errors import ConfigError
    from pagedkv.vllm.layout import check_prefill_lookahead

    groups = SimpleNamespace(kv_cache_groups=[SimpleNamespace(is_eagle_group=True)])
    with pytest.raises(ConfigError, match=r"scheduler_block_size \(=4\) >= "
                                          r"num_speculative_tokens \(=5\)"):
        check_prefill_lookahead(groups, 4, 5, eagle_drop=False, enable_caching=True)
    check_prefill_lookahead(groups, 4, 5, eagle_drop=False, enable_caching=False)
    check_prefill_lookahead(groups, 8, 5, eagle_drop=False, enable_caching=True)
    plain = SimpleNamespace(kv_cache_groups=[SimpleNamespace(is_eagle_group=False)])
    check_prefill_lookahead(plain, 4, 5, eagle_drop=False, enable_caching=True)
    with pytest.raises(ConfigError):
        check_prefill_lookahead(plain, 4, 5, eagle_drop=True, enable_caching=True)
