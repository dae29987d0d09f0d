"""Router answers equal each replica's own get_computed_blocks (full attention and hybrid),
policies, tenant salts, and the fallback when Redis is down."""

from __future__ import annotations

import logging
import random

import pytest
from cluster_engines import SharedPrefixEngine, model_specs, shared_prefixes

from pagedkv import FullAttentionSpec, HashExtras, KVCacheManager
from pagedkv.cluster import (
    CacheAware,
    IndexIngest,
    LeastLoaded,
    MemoryIndex,
    Replica,
    ReplicaLoad,
    RoundRobin,
    Router,
)
from pagedkv.cluster.hit_rules import PrefixRule, WindowRule, hybrid_hit_blocks
from pagedkv.events.wire import wire_hash


def make_index(kind, request):
    if kind == "memory":
        return MemoryIndex(model="toy")
    from pagedkv.cluster.redis_index import RedisIndex

    return RedisIndex(request.getfixturevalue("redis_client"), model="toy")


def probes(rng):
    out = []
    for prefix in shared_prefixes():
        for cut in (len(prefix), len(prefix) // 2, 3):
            out.append(prefix[:cut] + [rng.randrange(1000) for _ in range(rng.randint(0, 9))])
    return out


def assert_router_matches(engines, router, rng):
    checked = 0
    for prompt in probes(rng):
        expected = {}
        hashes = None
        for replica, engine in engines.items():
            hit, hashes = engine.probe(prompt)
            if hit:
                expected[replica] = hit
        assert router.hit_tokens(hashes, len(prompt)) == expected
        checked += len(expected)
    return checked


@pytest.mark.parametrize("kind", ["memory", "redis"])
@pytest.mark.parametrize("hybrid", [False, True], ids=["full", "full+sliding"])
def test_router_hits_equal_each_replicas_own(kind, hybrid, request):
    rng = random.Random(5)
    index = make_index(kind, request)
    ingest = IndexIngest(index)
    engines = {Replica(pod=f"pod{i}"): SharedPrefixEngine(i, hybrid=hybrid) for i in range(3)}
    router = Router(index, specs=model_specs(hybrid), policy=CacheAware())
    hits = 0
    for round_ in range(4):
        for _ in range(40):
            for replica, engine in engines.items():
                engine.step()
                ingest.apply(replica.pod, engine.mgr.take_events())
        if round_ == 2:
            for replica, engine in engines.items():
                engine.storm()
                ingest.apply(replica.pod, engine.mgr.take_events())
        ingest.check_invariants()
        index.check_invariants()
        hits += assert_router_matches(engines, router, rng)
    assert hits > 20  # the check did see hits
    assert sum(e.mgr.num_evicted_blocks for e in engines.values()) > 200


def test_hybrid_rule_is_not_just_the_prefix():
    rules = (PrefixRule(), WindowRule(run_blocks=2))
    # The window group holds a run ending at 3 only: the hit is 4, not the full 6.
    assert hybrid_hit_blocks(rules, [set(range(6)), {2, 3}], max_blocks=6) == 4
    assert hybrid_hit_blocks(rules, [set(range(6)), set(range(6))], max_blocks=5) == 5
    assert hybrid_hit_blocks(rules, [set(range(6)), set()], max_blocks=6) == 0


def _index_with(hits):
    index = MemoryIndex(model="m")
    for replica, hashes in hits.items():
        index.update(replica, added=[(0, h, "GPU") for h in hashes], removed=[])
    return index


SPECS = [FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)]
A, B, C = (Replica(pod=p) for p in "abc")


def test_policies():
    index = _index_with({B: [1, 2, 3]})
    loads = {A: ReplicaLoad(), B: ReplicaLoad(running_seqs=10), C: ReplicaLoad()}
    # Cache-aware: B saves 12 prefill tokens but carries 10 x 5 = 50 tokens of decode load.
    aware = Router(index, specs=SPECS, policy=CacheAware())
    assert aware.route([1, 2, 3], num_tokens=13, loads=loads).replica == A
    loads[B] = ReplicaLoad(running_seqs=2)
    decision = aware.route([1, 2, 3], num_tokens=13, loads=loads)
    assert (decision.replica, decision.hit_tokens, decision.cost) == (B, 12, 1 + 10)
    least = Router(index, specs=SPECS, policy=LeastLoaded())
    assert least.route([1, 2, 3], num_tokens=13, loads=loads).replica == A
    loads[A] = ReplicaLoad(queued_prefill_tokens=100)
    assert least.route([1, 2, 3], num_tokens=13, loads=loads).replica == C
    rr = Router(index, specs=SPECS, policy=RoundRobin())
    assert [rr.route([], num_tokens=1, loads=loads).replica for _ in range(4)] == [A, B, C, A]


def test_tenant_salt_separates_prefixes():
    mgr = KVCacheManager.from_spec(SPECS[0], num_blocks=32, max_model_len=64,
                                   enable_events=True)
    prompt = list(range(17))
    ingest = IndexIngest(MemoryIndex(model="m"))
    request = mgr.new_request("r", prompt, hash_extras=HashExtras(cache_salt="tenant-1"))
    mgr.allocate_slots(request, len(prompt))
    ingest.apply("a", mgr.take_events())
    router = Router(ingest.index, specs=SPECS, policy=CacheAware())

    def wire(salt=None):
        extras = None if salt is None else HashExtras(cache_salt=salt)
        return [wire_hash(h) for h in mgr.new_request("q", prompt, hash_extras=extras).block_hashes]

    salted, other, plain = wire("tenant-1"), wire("tenant-2"), wire()
    assert router.hit_tokens(salted, 17) == {A: 16}
    assert router.hit_tokens(other, 17) == {} and router.hit_tokens(plain, 17) == {}


def test_fallback_when_redis_is_down_then_recovery(redis_server, caplog):
    from pagedkv.cluster.redis_index import RedisIndex, connect

    index = RedisIndex(connect(redis_server.url), model="m")
    index.update(B, added=[(0, 1, "GPU"), (0, 2, "GPU")], removed=[])
    router = Router(index, specs=SPECS, policy=CacheAware())
    loads = {A: ReplicaLoad(), B: ReplicaLoad(running_seqs=1)}
    assert router.route([1, 2], num_tokens=9, loads=loads).replica == B
    redis_server.stop()
    with caplog.at_level(logging.INFO, logger="pagedkv.cluster"):
        for _ in range(3):
            decision = router.route([1, 2], num_tokens=9, loads=loads)
            assert (decision.replica, decision.policy, decision.degraded) == (
                A, "least-loaded", True)
        assert router.degraded
        redis_server.start()  # empty: persistence is off
        index.update(B, added=[(0, 1, "GPU"), (0, 2, "GPU")], removed=[])
        decision = router.route([1, 2], num_tokens=9, loads=loads)
        assert (decision.replica, decision.degraded) == (B, False)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()
    assert any("reachable again" in r.getMessage() for r in caplog.records)
