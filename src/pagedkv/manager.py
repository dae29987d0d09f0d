"""The façade an engine calls once per scheduler step.

Typical step for one request::

    hit = mgr.get_computed_blocks(req)                     # prefix-cache lookup
    new = mgr.allocate_slots(req, num_new_tokens, new_computed_blocks=hit)
    if new is None: ...                                    # no room: preempt or wait
    req.num_computed_tokens += hit.num_computed_tokens + num_new_tokens   # after the step
    ...
    mgr.free(req)                                          # finished or preempted

Token line of ``allocate_slots`` (block size 4)::

    | computed | new computed | new | lookahead |
    | <------- total computed ----> |
    | <-------------- num tokens needing a slot ----------> |

``allocate_slots(req, 5, new_computed_blocks=hit)`` on a fresh 13-token request whose
first 8 tokens hit: total computed = 8, slots for 8 + 5 = 13 tokens -> 4 blocks, two of
them the hit blocks, so two new blocks are returned; the three full blocks are registered
in the prefix index (the first two already were).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pagedkv.coordinator import (
    Coordinator,
    HybridCoordinator,
    NoPrefixCacheCoordinator,
    UnitaryCoordinator,
)
from pagedkv.errors import InvalidArgumentError, UnknownRequestError
from pagedkv.events.config import KVEventsConfig
from pagedkv.events.records import BlockStored, KVCacheEvent
from pagedkv.hashing import HASH_ALGOS, BlockHasher, LoRA, MultiModalItem
from pagedkv.managers import SingleTypeManager, manager_class_for
from pagedkv.metrics import HitRateWindow, PrefixCacheStats
from pagedkv.pool import BlockPool, GroupInfo, HashedRequest
from pagedkv.request import Request
from pagedkv.specs import KVCacheSpec, SlidingWindowSpec

if TYPE_CHECKING:
    from pagedkv.events.publisher import ZmqEventPublisher

__all__ = ["CacheConfig", "ComputedBlocks", "KVCacheManager", "RequestLike"]


class RequestLike(HashedRequest, Protocol):
    """What the manager reads from a request. :class:`pagedkv.Request` has all of it; an
    engine can adapt its own request type instead."""

    @property
    def request_id(self) -> str: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def num_preemptions(self) -> int: ...


class ComputedBlocks(NamedTuple):
    """A prefix-cache hit: block ids per group and the number of hit tokens."""

    block_ids: tuple[list[int], ...]
    num_computed_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """Everything a :class:`KVCacheManager` needs.

    ``groups``: one layer spec per KV-cache group (the planner produces them).
    ``hash_block_size``: block size hashes are computed at; default the smallest group
    block size (every group block size must be a multiple of it).
    ``drop_last_hit``: speculative decoding whose draft head needs the last block's hidden
    states; the last hit block is dropped so it is recomputed.
    ``hash_memo_blocks``: how many recently hashed blocks the hasher remembers so repeated
    prefixes are not re-hashed (0: off); see :class:`pagedkv.BlockHasher`.
    ``kv_events``: publish KV-cache events over ZeroMQ in vLLM's wire format (implies
    ``enable_events``; needs the ``events`` extra); see :meth:`KVCacheManager.publish_events`.
    """

    groups: tuple[KVCacheSpec, ...]
    num_blocks: int
    max_model_len: int
    enable_caching: bool = True
    hash_algo: str = "sha256_cbor"
    hash_block_size: int | None = None
    secret_seed: bytes | None = None
    enable_events: bool = False
    drop_last_hit: bool = False
    hit_rate_window_requests: int = 1000
    kv_events: KVEventsConfig | None = None
    hash_memo_blocks: int = 16384

    def __post_init__(self) -> None:
        if not self.groups:
            raise InvalidArgumentError("CacheConfig.groups needs at least one layer spec")
        if not isinstance(self.max_model_len, int) or self.max_model_len <= 0:
            raise InvalidArgumentError(
                f"max_model_len must be a positive int, got {self.max_model_len!r}"
            )
        if self.hash_algo not in HASH_ALGOS:
            raise InvalidArgumentError(
                f"unknown hash_algo {self.hash_algo!r}; choose one of {HASH_ALGOS}"
            )


class KVCacheManager:
    """Block tables, prefix caching and events for every KV-cache group of one model.

    Not thread-safe: one scheduler thread calls it. Every per-request operation costs
    O(blocks it touches), independent of the pool size.
    """

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        specs = list(config.groups)
        hash_bs = config.hash_block_size or min(s.block_size for s in specs)
        self.max_model_len = config.max_model_len
        self.enable_caching = config.enable_caching
        self.pool = BlockPool(
            config.num_blocks,
            enable_caching=config.enable_caching,
            hash_block_size=hash_bs,
            groups=[
                GroupInfo(
                    s.block_size,
                    s.kind,
                    s.sliding_window if isinstance(s, SlidingWindowSpec) else None,
                )
                for s in specs
            ],
            enable_events=config.enable_events or config.kv_events is not None,
        )
        self.hasher = BlockHasher(hash_bs, algo=config.hash_algo, secret_seed=config.secret_seed,
                                  memo_blocks=config.hash_memo_blocks)
        self.managers: list[SingleTypeManager] = [
            manager_class_for(s)(s, self.pool, g, drop_last_hit=config.drop_last_hit)
            for g, s in enumerate(specs)
        ]
        self._droppers = [m for m in self.managers if m.drops_blocks]
        self.coordinator: Coordinator
        if not config.enable_caching:
            self.coordinator = NoPrefixCacheCoordinator(self.managers)
        elif len(self.managers) == 1:
            self.coordinator = UnitaryCoordinator(self.managers)
        else:
            self.coordinator = HybridCoordinator(self.managers)
        self._empty_hit = ComputedBlocks(tuple([] for _ in specs), 0)
        self._stats = [0, 0, 0, 0, 0, 0]
        self.hit_rate_window = HitRateWindow(config.hit_rate_window_requests)
        self.publisher: ZmqEventPublisher | None = None
        if config.kv_events is not None:
            from pagedkv.events.publisher import ZmqEventPublisher

            self.publisher = ZmqEventPublisher(
                config.kv_events, snapshot_fn=self.prefix_index_snapshot
            )

    @classmethod
    def from_spec(
        cls, spec: KVCacheSpec, *, num_blocks: int, max_model_len: int, **options: object
    ) -> KVCacheManager:
        """A manager for a model with one KV-cache group (``options``: CacheConfig fields)."""
        return cls(
            CacheConfig(
                groups=(spec,),
                num_blocks=num_blocks,
                max_model_len=max_model_len,
                **options,  # type: ignore[arg-type]
            )
        )

    # ---------------------------------------------------------------- requests

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        block_hashes: Sequence[bytes] | None = None,
        lora: LoRA | None = None,
        mm_items: Sequence[MultiModalItem] = (),
        cache_salt: str | None = None,
        prompt_embeds: Sequence[bytes] | None = None,
    ) -> Request:
        """A :class:`Request` whose block hashes use this manager's hash settings."""
        return Request(
            request_id,
            prompt_token_ids,
            hasher=self.hasher,
            block_hashes=block_hashes,
            lora=lora,
            mm_items=mm_items,
            cache_salt=cache_salt,
            prompt_embeds=prompt_embeds,
        )

    # ---------------------------------------------------------------- lookup

    def get_computed_blocks(self, request: RequestLike) -> ComputedBlocks:
        """The longest cached prefix of ``request`` valid for every group.

        At most ``num_tokens - 1`` tokens hit, so a fully cached prompt still recomputes
        its last token (the engine needs its logits); the hit is block aligned. Records
        lookup statistics (preempted re-lookups apart). Does not change the pool: the hit
        blocks are claimed only by :meth:`allocate_slots`.
        """
        if not self.enable_caching:
            return self._empty_hit
        num_tokens = request.num_tokens
        blocks, num_hit = self.coordinator.find_longest_cache_hit(
            request.block_hashes, num_tokens - 1
        )
        stats = self._stats
        if request.num_preemptions:
            stats[3] += 1
            stats[4] += num_tokens
            stats[5] += num_hit
        else:
            stats[0] += 1
            stats[1] += num_tokens
            stats[2] += num_hit
            self.hit_rate_window.observe(num_tokens, num_hit)
        return ComputedBlocks(blocks, num_hit)

    # ---------------------------------------------------------------- allocation

    def allocate_slots(
        self,
        request: RequestLike,
        num_new_tokens: int,
        *,
        new_computed_blocks: ComputedBlocks | None = None,
        num_new_computed_tokens: int | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        num_encoder_tokens: int = 0,
        delay_caching: bool = False,
    ) -> tuple[list[int], ...] | None:
        """Give ``request`` slots for ``num_new_tokens`` more tokens.

        ``new_computed_blocks`` (from :meth:`get_computed_blocks`, first call of a request
        only) is adopted as the start of its block table; ``num_new_computed_tokens``
        defaults to its token count. ``num_lookahead_tokens``: extra slots for speculative
        tokens. ``num_external_computed_tokens``: tokens whose KV arrives from elsewhere
        (a remote prefill). ``num_encoder_tokens``: encoder length for cross-attention
        groups. ``delay_caching``: do not register full blocks yet (their KV is not there
        yet); call :meth:`cache_blocks` when it is.

        Order: check capacity for every group at once (counting the blocks that fell out
        of windows as freed), free those blocks, claim every group's hit blocks, then
        allocate and register blocks that became full. Claiming all hits before any group
        allocates means one group's allocation can never evict another group's hit.

        Returns:
            The newly allocated block ids per group, or ``None`` when there are not enough
            free blocks, in which case **no state changed**.

        Raises:
            InvalidArgumentError: negative counts, nothing to allocate, or hit blocks for a
                request that already holds blocks. State is unchanged.
        """
        rid = request.request_id
        if num_new_computed_tokens is None:
            num_new_computed_tokens = (
                new_computed_blocks.num_computed_tokens if new_computed_blocks else 0
            )
        if (
            num_new_tokens < 0
            or num_new_computed_tokens < 0
            or num_lookahead_tokens < 0
            or num_external_computed_tokens < 0
            or num_encoder_tokens < 0
        ):
            raise InvalidArgumentError(
                f"request {rid!r}: token counts must be >= 0 (num_new_tokens={num_new_tokens}, "
                f"num_new_computed_tokens={num_new_computed_tokens}, num_lookahead_tokens="
                f"{num_lookahead_tokens}, num_external_computed_tokens="
                f"{num_external_computed_tokens}, num_encoder_tokens={num_encoder_tokens})"
            )
        if num_new_tokens == 0 and not num_external_computed_tokens and not num_lookahead_tokens:
            raise InvalidArgumentError(
                f"request {rid!r}: allocate_slots needs num_new_tokens > 0 (or external or "
                "lookahead tokens); there is nothing to allocate"
            )
        managers = self.managers
        hit = new_computed_blocks.block_ids if new_computed_blocks else self._empty_hit.block_ids
        if new_computed_blocks is not None and any(hit) and rid in managers[0].req_to_blocks:
            raise InvalidArgumentError(
                f"request {rid!r} already holds blocks; prefix-cache hit blocks can only "
                "be given to its first allocate_slots call"
            )
        num_computed = request.num_computed_tokens
        local_computed = num_computed + num_new_computed_tokens
        max_len = self.max_model_len
        total_computed = min(local_computed + num_external_computed_tokens, max_len)
        num_tokens = min(total_computed + num_new_tokens + num_lookahead_tokens, max_len)
        pool = self.pool

        num_needed = 0
        num_freed = 0
        slots = [m.slots_needed(num_tokens, num_encoder_tokens) for m in managers]
        for g, m in enumerate(managers):
            if m.drops_blocks:
                num_freed += m.num_skipped_blocks_to_free(rid, num_computed)
            num_needed += m.get_num_blocks_to_allocate(rid, slots[g], hit[g], total_computed)
        if num_needed > pool.free_queue.num_free + num_freed:
            return None

        for m in self._droppers:
            m.remove_skipped_blocks(rid, num_computed)
        if new_computed_blocks and self.enable_caching:
            # Claim every group's hit before any group allocates: an allocation takes
            # blocks from the front of the free queue and would evict an unclaimed hit.
            for g, m in enumerate(managers):
                pool.touch(m.claimed_hit_blocks(hit[g], total_computed))
        new_blocks = []
        for g, m in enumerate(managers):
            m.save_new_computed_blocks(rid, hit[g], total_computed)
            new_blocks.append(m.allocate_new_blocks(rid, slots[g]))

        if self.enable_caching and not delay_caching:
            num_cache = min(total_computed + num_new_tokens, request.num_tokens)
            for m in managers:
                if m.cacheable:
                    m.cache_blocks(request, rid, num_cache)
        return tuple(new_blocks)

    def cache_blocks(self, request: RequestLike, num_computed_tokens: int) -> None:
        """Register the request's full blocks within its first ``num_computed_tokens``
        tokens (after a delayed allocation whose KV has now arrived).

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        rid = request.request_id
        self._require_known(rid)
        if self.enable_caching:
            for m in self.managers:
                if m.cacheable:
                    m.cache_blocks(request, rid, min(num_computed_tokens, request.num_tokens))

    def free(self, request: RequestLike | str) -> None:
        """Release every block of the request, tail first. Freeing a request the manager
        does not track (e.g. aborted before its first allocation) does nothing."""
        rid = request if isinstance(request, str) else request.request_id
        for m in self.managers:
            m.free(rid)

    # ---------------------------------------------------------------- queries

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table per group (copies; the null block is 0).

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        self._require_known(request_id)
        return tuple(list(m.req_to_blocks[request_id]) for m in self.managers)

    def get_num_common_prefix_blocks(
        self, request_id: str, num_running_requests: int
    ) -> list[int]:
        """Per group, the leading blocks of ``request_id`` shared by all running requests
        (cascade attention); 0 for kinds that do not support it.

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        self._require_known(request_id)
        return [m.get_num_common_prefix_blocks(request_id, num_running_requests)
                for m in self.managers]

    def has_request(self, request_id: str) -> bool:
        return request_id in self.managers[0].req_to_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.free_queue.num_free

    @property
    def usage(self) -> float:
        """Fraction of non-null blocks in use."""
        return self.pool.usage

    @property
    def num_evicted_blocks(self) -> int:
        """Cached blocks evicted so far."""
        return self.pool.num_evicted_blocks

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookup statistics since the previous call (then starts a new interval)."""
        stats = PrefixCacheStats(*self._stats)
        self._stats = [0, 0, 0, 0, 0, 0]
        return stats

    # ---------------------------------------------------------------- cache control

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; only possible when no block is in use.

        Returns whether it happened. Also clears the hit-rate window.
        """
        ok = self.pool.reset_prefix_cache()
        if ok:
            self.hit_rate_window.reset()
        return ok

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """Drop the given blocks from the prefix index (in-use blocks stay allocated).

        Raises:
            InvalidArgumentError: an id outside the pool; nothing is evicted.
        """
        self.pool.evict_blocks(block_ids)

    def take_events(self) -> list[KVCacheEvent]:
        """The KV-cache events buffered since the last call (empty when events are off)."""
        return self.pool.take_events()

    def publish_events(self) -> int:
        """Hand the events buffered since the last call to the ZeroMQ publisher (configured
        by ``CacheConfig.kv_events``) and return how many there were.

        Call once per scheduler step, also when nothing happened: snapshot requests from
        subscribers are answered on this call. Never blocks: a slow or absent subscriber
        costs nothing here (the publisher drops and counts batches past its queue).
        Without a publisher the events are simply taken and discarded.
        """
        events = self.pool.take_events()
        if self.publisher is not None:
            self.publisher.publish(events)
        return len(events)

    def close(self) -> None:
        """Release the event publisher's sockets and thread (if any). Idempotent."""
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None

    def prefix_index_snapshot(self) -> list[BlockStored]:
        """Stored events recreating the current prefix index (events must be on)."""
        return self.pool.prefix_index_snapshot()

    # ---------------------------------------------------------------- checks

    def _require_known(self, request_id: str) -> None:
        if request_id not in self.managers[0].req_to_blocks:
            raise UnknownRequestError(
                f"unknown request {request_id!r}: it was never allocated or is already freed; "
                "call allocate_slots for it first"
            )

    def debug_state(self) -> dict[str, Any]:
        """A deep copy of all state (pool, block tables, statistics), for tests and bug
        reports: two equal dumps mean the manager would behave identically. O(num_blocks)."""
        return {
            "pool": self.pool.debug_state(),
            "block_tables": [
                {rid: list(b) for rid, b in m.req_to_blocks.items()} for m in self.managers
            ],
            "num_cached_blocks": [dict(m.num_cached_blocks) for m in self.managers],
            "stats": list(self._stats),
            "hit_rate_window": (self.hit_rate_window.queries, self.hit_rate_window.hits,
                                self.hit_rate_window.num_requests),
        }

    def check_invariants(self) -> None:
        """Walk all state: the pool, each group, and that every block's ref count equals
        the number of block tables holding it. O(num_blocks + held blocks)."""
        pool = self.pool
        pool.check_invariants()
        counts = [0] * pool.num_blocks
        tracked: set[str] | None = None
        for m in self.managers:
            m.check_invariants()
            ids = set(m.req_to_blocks)
            assert tracked is None or ids == tracked, "groups track different requests"
            tracked = ids
            for b in m.iter_held_blocks():
                counts[b] += 1
        for b in range(1, pool.num_blocks):
            assert pool.ref_cnt[b] == counts[b], (
                f"block {b}: ref count {pool.ref_cnt[b]}, held by {counts[b]} block tables"
            )
