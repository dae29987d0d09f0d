"""Event sources for the event tests: a synthetic prefix index, and a small engine loop
driving the real KVCacheManager."""

from __future__ import annotations

import random

from pagedkv import FullAttentionSpec, KVCacheManager, SlidingWindowSpec
from pagedkv.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored


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


class ManagerEngine:
    """A toy continuous-batching loop over the real manager: admit prompts that share
    prefixes, decode, finish, preempt when blocks run out, and now and then reset the
    prefix cache. Exposes ``take_events`` / ``snapshot`` like :class:`FakeEngine`."""

    def __init__(self, rng: random.Random, *, hybrid: bool = False, num_blocks: int = 64):
        self.rng = rng
        kw = {"block_size": 4, "num_kv_heads": 2, "head_size": 8, "dtype_bytes": 2}
        if hybrid:
            from pagedkv import CacheConfig

            groups = (FullAttentionSpec(**kw), SlidingWindowSpec(sliding_window=8, **kw))
            self.mgr = KVCacheManager(
                CacheConfig(
                    groups=groups,
                    num_blocks=num_blocks,
                    max_model_len=256,
                    enable_events=True,
                )
            )
        else:
            self.mgr = KVCacheManager.from_spec(
                FullAttentionSpec(**kw),
                num_blocks=num_blocks,
                max_model_len=256,
                enable_events=True,
            )
        self.prefixes = [[rng.randrange(1000) for _ in range(rng.randint(4, 24))] for _ in range(6)]
        self.running: dict[str, object] = {}
        self.num_admitted = 0

    def _admit(self) -> None:
        rng = self.rng
        prompt = list(rng.choice(self.prefixes)) + [
            rng.randrange(1000) for _ in range(rng.randint(1, 12))
        ]
        request = self.mgr.new_request(f"r{self.num_admitted}", prompt)
        self.num_admitted += 1
        hit = self.mgr.get_computed_blocks(request)
        new = self.mgr.allocate_slots(
            request, len(prompt) - hit.num_computed_tokens, new_computed_blocks=hit
        )
        if new is None:
            return
        request.num_computed_tokens = len(prompt)
        self.running[request.request_id] = request

    def _decode(self, request) -> None:
        request.append_output_tokens([self.rng.randrange(1000)])
        if self.mgr.allocate_slots(request, 1) is None:  # preempt
            self.mgr.free(request)
            del self.running[request.request_id]
            return
        request.num_computed_tokens += 1

    def random_step(self) -> None:
        rng = self.rng
        if rng.random() < 0.01:
            self.reset()
            return
        if rng.random() < 0.6:
            self._admit()
        for request in list(self.running.values()):
            if request.num_tokens >= 200 or rng.random() < 0.1:
                self.mgr.free(request)
                del self.running[request.request_id]
            else:
                self._decode(request)

    def reset(self) -> None:
        """Finish every running request, then reset the prefix cache."""
        for request in list(self.running.values()):
            self.mgr.free(request)
        self.running.clear()
        assert self.mgr.reset_prefix_cache()

    def store(self) -> None:
        self._admit()

    def take_events(self) -> list:
        return self.mgr.take_events()

    def snapshot(self) -> list[BlockStored]:
        return self.mgr.prefix_index_snapshot()
