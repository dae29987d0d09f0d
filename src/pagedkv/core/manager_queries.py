"""Read-only queries, cache control and checks of :class:`pagedkv.KVCacheManager`
(mixed into it; the allocation path is in :mod:`pagedkv.core.manager`).

Worked case (full attention, block 4, 10 usable blocks, one 10-token request holding
three blocks, the first two full and cached):

>>> from pagedkv import FullAttentionSpec, KVCacheManager
>>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
>>> mgr = KVCacheManager.from_spec(spec, num_blocks=11, max_model_len=64)
>>> r = mgr.new_request("r", list(range(10)))
>>> mgr.allocate_slots(r, 10, new_computed_blocks=mgr.get_computed_blocks(r))
([1, 2, 3],)
>>> mgr.get_block_ids("r"), mgr.get_block_ids_for_computed_tokens("r", 5)
(([1, 2, 3],), ([1, 2],))
>>> mgr.num_free_blocks, round(mgr.usage, 2)
(7, 0.3)
>>> mgr.reset_prefix_cache()  # blocks are in use
False
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.core import validation
from pagedkv.core.coordinator import Coordinator, PartialHitCoordinator
from pagedkv.core.records import BlockStored, KVCacheEvent
from pagedkv.errors import UnknownRequestError

if TYPE_CHECKING:
    from pagedkv.core.components import EventPublisher
    from pagedkv.core.managers import SingleTypeManager
    from pagedkv.core.metrics import HitRateWindow, LookupCounters, PrefixCacheStats
    from pagedkv.core.pool import BlockPool
    from pagedkv.core.recorder import EventRecorder
    from pagedkv.core.request import RequestLike

__all__ = ["ManagerQueries"]


class ManagerQueries:
    """Mixed into :class:`pagedkv.KVCacheManager` (module docstring). Every method leaves
    state unchanged when it raises."""

    coordinator: Coordinator
    pool: BlockPool
    managers: list[SingleTypeManager]
    live_requests: dict[str, RequestLike]
    held_outside: dict[int, int]
    lookups: LookupCounters
    hit_rate_window: HitRateWindow
    recorder: EventRecorder
    publisher: EventPublisher | None
    _component_events: tuple[Callable[[], list[KVCacheEvent]], ...]
    _component_state: tuple[Callable[[dict[str, Any]], None], ...]
    _component_checks: tuple[Callable[[], None], ...]

    # ---------------------------------------------------------------- queries

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table per group (copies; the null block is 0).

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        self.require_live(request_id)
        return self.coordinator.block_ids(request_id)

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """The request's tables clipped to the blocks covering its first
        ``num_computed_tokens`` tokens (attention groups; Mamba and cross-attention tables
        whole), as vLLM's method of this name. Block 4, table ``[1, 2, 3]``, 5 tokens ->
        ``[1, 2]``.

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        self.require_live(request_id)
        return self.coordinator.block_ids_for_computed_tokens(request_id, num_computed_tokens)

    def get_num_common_prefix_blocks(
        self, request_id: str, num_running_requests: int
    ) -> list[int]:
        """Per group, the leading blocks of ``request_id`` shared by all running requests
        (cascade attention); 0 for kinds that do not support it.

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        self.require_live(request_id)
        validation.check_count("num_running_requests", num_running_requests)
        return self.coordinator.num_common_prefix_blocks(request_id, num_running_requests)

    def has_request(self, request_id: str) -> bool:
        """Whether the request holds blocks (allocated and not freed yet). O(1)."""
        return request_id in self.live_requests

    @property
    def num_free_blocks(self) -> int:
        """Free blocks, cached ones (eviction candidates) included."""
        return self.pool.free_queue.num_free

    @property
    def usage(self) -> float:
        """Fraction of non-null blocks in use (ref count > 0)."""
        pool = self.pool
        return 1.0 - pool.free_queue.num_free / (pool.num_blocks - 1)

    @property
    def num_evicted_blocks(self) -> int:
        """Cached blocks evicted so far."""
        return self.pool.num_evicted_blocks

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookup statistics since the previous call (then starts a new interval)."""
        return self.lookups.take()

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
        """The KV-cache events buffered since the last call (empty when events are off):
        the device's, then each component's own (a host tier's, medium ``"CPU"``)."""
        events = self.recorder.take()
        for take in self._component_events:
            events += take()
        return events

    def publish_events(self) -> int:
        """Hand the events buffered since the last call to the ZeroMQ publisher (configured
        by ``CacheConfig.kv_events``) and return how many there were.

        Call once per scheduler step, also when nothing happened: snapshot requests from
        subscribers are answered on this call. Never blocks: a slow or absent subscriber
        costs nothing here (the publisher drops and counts batches past its queue).
        Without a publisher the events are simply taken and discarded.
        """
        events = self.take_events()
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
        return self.recorder.snapshot(self.pool.block_hash, self.pool.block_group)

    # ---------------------------------------------------------------- checks

    def require_live(self, request_id: str) -> None:
        """Raise :class:`UnknownRequestError` unless the request holds blocks. O(1)."""
        if type(request_id) is not str or request_id not in self.live_requests:
            raise UnknownRequestError(
                f"unknown request {request_id!r}: it was never allocated or is already freed; "
                "call allocate_slots for it first"
            )

    def debug_state(self) -> dict[str, Any]:
        """A deep copy of all state (pool, block tables, statistics), for tests and bug
        reports: two equal dumps mean the manager would behave identically. O(num_blocks)."""
        state = {
            "pool": self.pool.debug_state(),
            "block_tables": [
                {rid: list(b) for rid, b in m.req_to_blocks.items()} for m in self.managers
            ],
            "num_cached_blocks": [dict(m.num_cached_blocks) for m in self.managers],
            "live_requests": list(self.live_requests),
            "held_outside": dict(self.held_outside),
            "new_block_ids": [list(ids) for ids in self.coordinator.new_block_ids],
            "stats": self.lookups.snapshot(),
            "hit_rate_window": (self.hit_rate_window.queries, self.hit_rate_window.hits,
                                self.hit_rate_window.num_requests),
        }
        for add in self._component_state:
            add(state)
        return state

    def check_invariants(self) -> None:
        """Walk all state: the pool, each group, and that every block's ref count equals
        the number of block tables holding it. O(num_blocks + held blocks)."""
        self.pool.check_invariants()
        held = dict(self.held_outside)
        if isinstance(self.coordinator, PartialHitCoordinator):
            for b in self.coordinator.iter_pending_copy_blocks():
                held[b] = held.get(b, 0) + 1
        self.coordinator.check_invariants(held)
        assert self.coordinator.request_ids() == self.live_requests.keys(), (
            "the live requests and the requests holding block tables differ")
        for check in self._component_checks:
            check()
