"""Fixtures for the event tests: a synthetic engine, and publishers/subscribers on 127.0.0.1
that are always closed at teardown."""

from __future__ import annotations

import os
import random

import pytest

from pagedkv.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored

LOCAL_ANY_PORT = "tcp://127.0.0.1:*"  # bound on loopback only, on a free port


class FakeEngine:
    """A prefix index that emits the events a block pool would, for tests without the core.

    Each cached block copy is ``(digest, parent digest, tokens, group)``; two copies of one
    digest model two requests that filled identical blocks.
    """

    def __init__(self, rng: random.Random, *, block_size: int = 4, num_groups: int = 1) -> None:
        self.rng = rng
        self.block_size = block_size
        self.num_groups = num_groups
        self.copies: list[tuple[bytes, bytes | None, list[int], int]] = []
        self.events: list = []

    def _stored(self, chain, group):
        hashes = [digest for digest, _, _ in chain]
        tokens = [t for _, _, block_tokens in chain for t in block_tokens]
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=chain[0][1],
            token_ids=tokens,
            block_size=self.block_size,
            lora_id=None,
            medium=MEDIUM_GPU,
            lora_name=None,
            extra_keys=None,
            group_idx=group,
            kv_cache_spec_kind="full_attention",
        )

    def store(self, num_blocks: int = 0, *, duplicate: bool = False) -> None:
        rng = self.rng
        group = rng.randrange(self.num_groups)
        if duplicate and self.copies:
            digest, parent, tokens, group = rng.choice(self.copies)
            self.copies.append((digest, parent, tokens, group))
            self.events.append(self._stored([(digest, parent, tokens)], group))
            return
        parent = rng.choice(self.copies)[0] if self.copies and rng.random() < 0.5 else None
        chain = []
        for _ in range(num_blocks or rng.randint(1, 4)):
            digest = rng.randbytes(32)
            tokens = [rng.randrange(50_000) for _ in range(self.block_size)]
            chain.append((digest, parent, tokens))
            self.copies.append((digest, parent, tokens, group))
            parent = digest
        self.events.append(self._stored(chain, group))

    def evict(self) -> None:
        if self.copies:
            digest, _, _, group = self.copies.pop(self.rng.randrange(len(self.copies)))
            self.events.append(BlockRemoved([digest], MEDIUM_GPU, group))

    def reset(self) -> None:
        self.copies.clear()
        self.events.append(AllBlocksCleared())

    def random_step(self) -> None:
        for _ in range(self.rng.randint(0, 3)):
            roll = self.rng.random()
            if roll < 0.55:
                self.store()
            elif roll < 0.6:
                self.store(duplicate=True)
            elif roll < 0.995:
                self.evict()
            else:
                self.reset()

    def take_events(self) -> list:
        events, self.events = self.events, []
        return events

    def snapshot(self) -> list[BlockStored]:
        return [self._stored([(d, p, t)], g) for d, p, t, g in self.copies]


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
