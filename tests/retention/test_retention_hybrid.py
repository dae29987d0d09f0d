"""Retention on a hybrid model (full attention with block 8 + sliding window with block 4,
hashes at 4): random traffic with priorities, pins and quotas keeps every invariant, and
pinned prefixes keep hitting in both groups."""

from __future__ import annotations

import contextlib
import random

from retention_support import FakeClock

from pagedkv import (
    CacheConfig,
    FullAttentionSpec,
    HashExtras,
    KVCacheManager,
    SlidingWindowSpec,
)
from pagedkv.errors import PinBudgetError
from pagedkv.retention import RequestRetention, RetentionConfig, TokenRangeRetention

HEADS = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}


def test_hybrid_random_traffic_with_retention_keeps_invariants() -> None:
    clock = FakeClock()
    mgr = KVCacheManager(CacheConfig(
        groups=(FullAttentionSpec(block_size=8, **HEADS),
                SlidingWindowSpec(block_size=4, sliding_window=8, **HEADS)),
        num_blocks=60, max_model_len=256,
        retention=RetentionConfig(clock=clock, pin_budget_fraction=0.3,
                                  tenant_quota_blocks={"t1": 6}),
    ))
    assert mgr.retention is not None
    rng = random.Random(3)
    system = list(range(500, 532))
    retentions = [None, RequestRetention(
        ranges=(TokenRangeRetention(token_end=32, priority=80, duration_s=2.5),),
        decode_priority=5)]
    lease = mgr.retention.pin_prefix(mgr.new_request("p", system + [1]), ttl_s=50.0)
    running = []
    for i in range(300):
        clock.now += rng.random()
        if running and rng.random() < 0.45:
            mgr.free(running.pop(rng.randrange(len(running))))
        else:
            salt = rng.choice([None, "t1"])
            tokens = (system if salt is None and rng.random() < 0.5 else [i * 100]) + [
                rng.randrange(4) for _ in range(rng.randrange(1, 30))]
            req = mgr.new_request(f"r{i}", tokens, retention=rng.choice(retentions),
                                  hash_extras=HashExtras(cache_salt=salt) if salt else None)
            hit = mgr.get_computed_blocks(req)
            new = mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                                     new_computed_blocks=hit)
            if new is not None:
                req.num_computed_tokens = req.num_tokens
                running.append(req)
        if i % 40 == 0:
            with contextlib.suppress(PinBudgetError):  # over budget: no pin
                mgr.retention.pin_prefix(mgr.new_request("q", [i * 100] * 9), ttl_s=3.0)
        mgr.check_invariants()
        if clock.now < 50.0 and i > 5:
            probe = mgr.new_request("probe", system + [9])
            assert mgr.get_computed_blocks(probe).num_computed_tokens == 32, f"step {i}"
    assert not lease.active
