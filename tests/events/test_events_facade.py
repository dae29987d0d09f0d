"""Events configured through the façade: CacheConfig(kv_events=...) publishes on
127.0.0.1, a subscriber mirrors the manager's prefix index exactly."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
from pagedkv.events.config import KVEventsConfig
from pagedkv.events.subscriber import Subscriber, index_counts


def test_facade_publishes_and_a_subscriber_mirrors_the_index(rng) -> None:
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=4, dtype_bytes=2)
    cfg = KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                         topic="kv@test@model")
    mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=24, max_model_len=256,
                                     kv_events=cfg))
    sub = Subscriber()
    try:
        assert mgr.publisher is not None
        sub.add_publisher("p0", mgr.publisher.last_endpoint,
                          replay_endpoint=mgr.publisher.last_replay_endpoint,
                          topic="kv@test@model")
        running = []
        for step in range(120):
            if rng.random() < 0.5 or not running:
                prefix = rng.choice([[1, 2, 3, 4, 5, 6, 7, 8], [9] * 8, []])
                req = mgr.new_request(f"r{step}", prefix + [rng.randrange(50) for _ in range(6)])
                hit = mgr.get_computed_blocks(req)
                if mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                                      new_computed_blocks=hit) is not None:
                    req.num_computed_tokens = req.num_tokens
                    running.append(req)
            else:
                mgr.free(running.pop(rng.randrange(len(running))))
            mgr.publish_events()
            sub.poll(0.0)
        for req in running:
            mgr.free(req)
        deadline = time.monotonic() + 5.0
        want = index_counts(mgr.prefix_index_snapshot())
        while time.monotonic() < deadline:
            mgr.publish_events()
            sub.poll(0.01)
            if sub.mirror.blocks("p0") == want and not sub.status("p0").repairing:
                break
        assert sub.mirror.blocks("p0") == want
        assert want  # the run cached something
    finally:
        sub.close()
        mgr.close()
        mgr.close()
