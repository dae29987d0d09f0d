"""Fixtures for the event tests: publishers and subscribers on 127.0.0.1 that are always
closed at teardown, and a seeded random generator."""

from __future__ import annotations

import os
import random

import pytest

LOCAL_ANY_PORT = "tcp://127.0.0.1:*"  # bound on loopback only, on a free port


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get("PAGEDKV_TEST_SEED", "1234"))
    return random.Random(seed)


@pytest.fixture
def make_publisher():
    pytest.importorskip("zmq")
    from pagedkv.events.config import KVEventsConfig
    from pagedkv.events.publisher import ZmqEventPublisher

    made = []

    def make(*, snapshot_fn=None, replay=True, **config):
        cfg = KVEventsConfig(
            endpoint=LOCAL_ANY_PORT,
            replay_endpoint=LOCAL_ANY_PORT if replay else None,
            **config,
        )
        publisher = ZmqEventPublisher(cfg, snapshot_fn=snapshot_fn)
        made.append(publisher)
        return publisher

    yield make
    for publisher in made:
        publisher.close()


@pytest.fixture
def make_subscriber():
    pytest.importorskip("zmq")
    from pagedkv.events.subscriber import Subscriber

    made = []

    def make(**kwargs):
        subscriber = Subscriber(**kwargs)
        made.append(subscriber)
        return subscriber

    yield make
    for subscriber in made:
        subscriber.close()
