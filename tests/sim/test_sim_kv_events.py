"""The simulated engine publishes its KV-cache events live (``--kv-events-endpoint``): a
subscriber on 127.0.0.1 ends with exactly the manager's prefix index."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from pagedkv.events.config import KVEventsConfig
from pagedkv.events.subscriber import Subscriber, index_counts
from pagedkv.sim import EngineSimulator, SchedulerConfig
from pagedkv.sim.generators import system_prompts


def test_simulated_engine_events_mirror_its_index() -> None:
    wl = system_prompts(num_groups=3, questions_per_group=8, system_tokens=64,
                        question_tokens=20, output_tokens=8)
    cfg = SchedulerConfig(
        arrivals="at-once",
        kv_events=KVEventsConfig(endpoint="tcp://127.0.0.1:*",
                                 replay_endpoint="tcp://127.0.0.1:*", topic="kv@sim@m"),
    )
    sim = EngineSimulator(wl, block_size=16, num_blocks=40, config=cfg)  # evicts: 40 < need
    publisher = sim.manager.publisher
    assert publisher is not None
    sub = Subscriber()
    try:
        sub.add_publisher("sim", publisher.last_endpoint,
                          replay_endpoint=publisher.last_replay_endpoint, topic="kv@sim@m")
        # Empty steps until the subscriber is synced: requests are served on publish.
        deadline = time.monotonic() + 5.0
        while not sub.status("sim").synced and time.monotonic() < deadline:
            sim.manager.publish_events()
            sub.poll(0.01)
        assert sub.status("sim").synced
        result = sim.run()
        assert result.evicted_blocks > 0
        want = index_counts(sim.manager.prefix_index_snapshot())
        deadline = time.monotonic() + 5.0
        while sub.mirror.blocks("sim") != want and time.monotonic() < deadline:
            sub.poll(0.01)
        assert sub.mirror.blocks("sim") == want
        assert want
    finally:
        sub.close()
