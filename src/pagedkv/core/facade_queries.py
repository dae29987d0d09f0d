"""The façade's read-only queries and its checks: block tables, per-block facts,
``debug_state`` (equal dumps mean identical behaviour) and ``check_invariants``.

Functions taking the manager; :class:`pagedkv.KVCacheManager` holds each as its method of
the same name. None changes state except ``make_prefix_cache_stats`` (starts a new
interval) and ``remove_skipped_blocks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagedkv.core import validation
from pagedkv.core.block_info import BlockInfo
from pagedkv.core.metrics import PrefixCacheStats
from pagedkv.errors import InvalidArgumentError, UnknownRequestError

if TYPE_CHECKING:
    from pagedkv.core.facade_state import Facade


def get_block_ids(self: Facade, request_id: str) -> tuple[list[int], ...]:
    """The request's block table per group (copies; the null block is 0).

    Raises:
        UnknownRequestError: the manager holds no blocks for this request.
    """
    self.require_live(request_id)
    return self.coordinator.block_ids(request_id)


def get_block_ids_for_computed_tokens(self: Facade, request_id: str,
                                      num_computed_tokens: int) -> tuple[list[int], ...]:
    """The tables clipped to the blocks covering the first ``num_computed_tokens``
    tokens (attention groups; Mamba and cross-attention tables whole), as vLLM's method.
    Block 4, table ``[1, 2, 3]``, 5 tokens -> ``[1, 2]``.

    Raises:
        UnknownRequestError: the manager holds no blocks for this request.
    """
    self.require_live(request_id)
    return self.coordinator.block_ids_for_computed_tokens(request_id, num_computed_tokens)


def get_num_cached_blocks(self: Facade, request_id: str) -> list[int]:
    """Per group, how many leading blocks of the request's table are registered (or
    were adopted from a hit): the point its next registration starts from.

    Raises:
        UnknownRequestError: the manager holds no blocks for this request.
    """
    self.require_live(request_id)
    return [m.num_cached_blocks.get(request_id, 0) for m in self.managers]


def get_num_common_prefix_blocks(self: Facade, request_id: str,
                                 num_running_requests: int) -> list[int]:
    """Per group, the leading blocks of ``request_id`` shared by all running requests
    (cascade attention); 0 for kinds that do not support it.

    Raises:
        UnknownRequestError: the manager holds no blocks for this request.
    """
    self.require_live(request_id)
    validation.check_count("num_running_requests", num_running_requests)
    return self.coordinator.num_common_prefix_blocks(request_id, num_running_requests)


def remove_skipped_blocks(self: Facade, request_id: str, num_processed_tokens: int) -> None:
    """Free the request's sliding-window and chunked-local blocks (and Mamba states)
    that no token after the first ``num_processed_tokens`` reads; their positions
    become the null block. Pass processed tokens only, never tokens a running step
    still computes (:meth:`allocate_slots` does this itself, see its
    ``num_in_flight_tokens``). No effect on full attention.

    Raises:
        UnknownRequestError: the manager holds no blocks for this request.
        InvalidArgumentError: not an int >= 0.
    """
    self.require_live(request_id)
    n = validation.check_count("num_processed_tokens", num_processed_tokens)
    self.coordinator.remove_skipped_blocks(request_id, n)


def block_info(self: Facade, block_id: int) -> BlockInfo:
    """What the pool knows of one block (read only). O(1).

    Raises:
        InvalidArgumentError: not a block id of this pool.
    """
    b = validation.check_count("block_id", block_id)
    pool = self.pool
    if b >= pool.num_blocks:
        raise InvalidArgumentError(
            f"block {b} is not in this pool of {pool.num_blocks} blocks")
    return BlockInfo(pool.ref_cnt[b], pool.block_hash[b], pool.block_group[b], b == 0)


def has_request(self: Facade, request_id: str) -> bool:
    """Whether the request holds blocks (allocated and not freed yet). O(1)."""
    return request_id in self.live_requests


def require_live(self: Facade, request_id: str) -> None:
    """Raise :class:`UnknownRequestError` unless the request holds blocks. O(1)."""
    if type(request_id) is not str or request_id not in self.live_requests:
        raise UnknownRequestError(
            f"unknown request {request_id!r}: it was never allocated or is already "
            "freed; call allocate_slots for it first")


def make_prefix_cache_stats(self: Facade) -> PrefixCacheStats:
    """Lookup statistics since the previous call (then starts a new interval)."""
    return self.lookups.take()


def debug_state(self: Facade) -> dict[str, Any]:
    """A deep copy of all state (pool, tables, statistics, components), for tests and
    bug reports: equal dumps mean identical behaviour. O(num_blocks)."""
    state = {
        "pool": self.pool.debug_state(),
        "block_tables": [{rid: list(b) for rid, b in m.req_to_blocks.items()}
                         for m in self.managers],
        "num_cached_blocks": [dict(m.num_cached_blocks) for m in self.managers],
        "live_requests": list(self.live_requests),
        "held_outside": dict(self.held.counts),
        "new_block_ids": [list(ids) for ids in self.coordinator.new_block_ids],
        "stats": self.lookups.snapshot(),
        "hit_rate_window": (self.hit_rate_window.queries, self.hit_rate_window.hits,
                            self.hit_rate_window.num_requests),
    }
    for add in self._hooks.debug_state:
        add(state)
    return state


def check_invariants(self: Facade) -> None:
    """Walk all state: the pool, each group, every block's ref count equals the tables
    and outside references holding it, and each component's checks.
    O(num_blocks + held blocks)."""
    self.pool.check_invariants()
    held = dict(self.held.counts)
    for b in self.coordinator.iter_pending_copy_blocks():
        held[b] = held.get(b, 0) + 1
    self.coordinator.check_invariants(held)
    assert self.coordinator.request_ids() == self.live_requests.keys(), (
        "the live requests and the requests holding block tables differ")
    for check in self._hooks.check_invariants:
        check()
