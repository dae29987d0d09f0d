"""The router weighs blocks a replica holds in host memory (``medium="CPU"`` events from
a real host-tiered manager) against blocks on its device."""

from __future__ import annotations

import pytest

from pagedkv import CacheConfig, FullAttentionSpec, SlidingWindowSpec
from pagedkv.cluster import CacheAware, IndexIngest, MemoryIndex, Replica, ReplicaLoad, Router
from pagedkv.errors import InvalidArgumentError, UnsupportedModelError
from pagedkv.events.wire import wire_hash
from pagedkv.host import HostTierConfig, HostTieredKVCacheManager

BS = 4
SPEC = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype_bytes=2)
A = list(range(21))            # 5 full blocks + 1 token
B = list(range(100, 133))      # 8 full blocks + 1 token: pushes A out to host memory


def _step(mgr: HostTieredKVCacheManager, rid: str, tokens: list[int]) -> None:
    req = mgr.new_request(rid, tokens)
    hit = mgr.host.lookup(req)
    assert mgr.allocate_slots(req, len(tokens) - hit.num_computed_tokens,
                              new_computed_blocks=hit) is not None
    for plan in mgr.host.take_store_plans():
        mgr.host.complete_store(plan, True)
    for load in mgr.host.take_load_plans():
        mgr.host.complete_load(load, True)
    req.num_computed_tokens = len(tokens)
    mgr.free(req)
    mgr.check_invariants()


def test_router_weighs_host_blocks_from_a_real_host_tier() -> None:
    cfg = CacheConfig(groups=(SPEC,), num_blocks=10, max_model_len=256, enable_events=True)
    host_mgr = HostTieredKVCacheManager(cfg, HostTierConfig(num_blocks=16))
    ingest = IndexIngest(MemoryIndex(model="m"))
    _step(host_mgr, "a", A)
    _step(host_mgr, "b", B)          # A's 5 blocks: evicted from the device, stored on CPU
    ingest.apply("h", host_mgr.take_events())
    hashes = [wire_hash(h) for h in host_mgr.new_request("probe", A).block_hashes]
    host, gpu = Replica(pod="h"), Replica(pod="g")
    ingest.index.update(gpu, added=[(0, h, "GPU") for h in hashes[:2]], removed=[])

    plain = Router(ingest.index, specs=[SPEC], policy=CacheAware())
    assert plain.hit_tokens(hashes, len(A)) == {host: 20, gpu: 8}
    assert host_mgr.host.lookup(host_mgr.new_request("probe2", A)).num_host_tokens == 20

    weighted = Router(ingest.index, specs=[SPEC], policy=CacheAware(), host_tier_weight=0.25)
    assert weighted.hit_tokens(hashes, len(A)) == {host: 5, gpu: 8}
    loads = {host: ReplicaLoad(), gpu: ReplicaLoad()}
    assert plain.route(hashes, num_tokens=len(A), loads=loads).replica == host
    assert weighted.route(hashes, num_tokens=len(A), loads=loads).replica == gpu
    # weight 1: a host block is as good as a device block
    same = Router(ingest.index, specs=[SPEC], policy=CacheAware(), host_tier_weight=1.0)
    assert same.hit_tokens(hashes, len(A)) == plain.hit_tokens(hashes, len(A))


def test_device_prefix_then_host_continuation() -> None:
    index, r = MemoryIndex(model="m"), Replica(pod="r")
    index.update(r, added=[(0, 1, "GPU"), (0, 2, "GPU"), (0, 3, "CPU"), (0, 4, "CPU"),
                           (0, 5, "GPU")], removed=[])
    router = Router(index, specs=[SPEC], policy=CacheAware(), host_tier_weight=0.5)
    # device prefix 2 blocks; any-tier prefix 5 blocks: 8 + 0.5 * 12 tokens
    assert router.hit_tokens([1, 2, 3, 4, 5], 21) == {r: 14}
    # weight 0: only the device prefix counts
    zero = Router(index, specs=[SPEC], policy=CacheAware(), host_tier_weight=0.0)
    assert zero.hit_tokens([1, 2, 3, 4, 5], 21) == {r: 8}


@pytest.mark.parametrize("weight", [-0.1, 1.5, "half"])
def test_bad_weights_are_refused(weight: object) -> None:
    with pytest.raises(InvalidArgumentError, match="host_tier_weight"):
        Router(MemoryIndex(model="m"), specs=[SPEC], policy=CacheAware(),
               host_tier_weight=weight)  # type: ignore[arg-type]


def test_weights_need_any_tier_and_full_attention() -> None:
    with pytest.raises(InvalidArgumentError, match="tier=None"):
        Router(MemoryIndex(model="m"), specs=[SPEC], policy=CacheAware(), tier="GPU",
               host_tier_weight=0.5)
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype_bytes=2,
                            sliding_window=8)
    with pytest.raises(UnsupportedModelError, match="full-attention"):
        Router(MemoryIndex(model="m"), specs=[SPEC, swa], policy=CacheAware(),
               host_tier_weight=0.5)
