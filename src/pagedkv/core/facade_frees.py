"""The façade's frees, deferred frees, step boundary and cache control: what an engine
calls when a request finishes or is preempted (``free``; preemption is a free followed by
a new first allocation with ``num_preemptions`` counted), when a step starts, and to drop
cached prefixes.

Functions taking the manager; :class:`pagedkv.KVCacheManager` holds each as its method of
the same name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pagedkv.core import validation
from pagedkv.core.coordinator_base import Coordinator
from pagedkv.core.held_blocks import NO_COPIES, BlockCopies
from pagedkv.core.request import Request, RequestLike

if TYPE_CHECKING:
    from pagedkv.core.facade_state import Facade


def new_step_starts(self: Facade) -> None:
    """Tell the manager a scheduler step begins (call once per step, before scheduling;
    vLLM's ``new_step_starts``). A Mamba state registered in this step cannot be hit
    again before the next one (its KV is written by the step that registered it)."""
    self.coordinator.new_step_starts()
    for started in self._hooks.step_started:
        started()


def free(self: Facade, request: RequestLike | str) -> None:
    """Release every block of the request, tail first; its id is free again. Freeing a
    request the manager does not track (e.g. aborted before its first allocation) does
    nothing. With retention, the request's ``retention`` is applied to its blocks.

    Raises:
        InvalidArgumentError: neither a request nor a str, or a retention that is not
            a RequestRetention (nothing freed).
        DuplicateRequestError: a request object whose id another live request holds.
    """
    try:
        rid = request if isinstance(request, str) else request.request_id
        live = self.live_requests.get(rid)
    except (AttributeError, TypeError):
        validation.check_free(self, request)
        raise
    before_free = self._hooks.before_free
    if live is None:
        for before in before_free:
            before(request, None)
        return
    if live is not request and type(request) is not str:
        validation.check_free(self, request)
    for before in before_free:
        before(request, live)
    del self.live_requests[rid]
    self.coordinator.free(rid)


def pop_blocks_for_free(self: Facade, request: RequestLike | str) -> list[int]:
    """Forget the request (its id is free again) but keep its blocks referenced: its
    tables in group order, each without leading null blocks (vLLM 0.33's method).
    Release them with :meth:`release_blocks` **last first** (``reversed(...)``) once
    nothing writes them, so the tail is evicted first, as :meth:`free` would queue
    them. ``[]`` for a request the manager does not track.

    Raises:
        InvalidArgumentError: neither a request nor a str.
        DuplicateRequestError: a request object whose id another live request holds.
    """
    live_requests = self.live_requests
    if type(request) is str:
        rid = request
        live = live_requests.get(rid)
    else:  # a live Request object needs no checks (its id is the one it was admitted by)
        live = live_requests.get(request.request_id) if type(request) is Request else None
        if live is None or live is not request:
            rid = validation.check_free(self, request)
            live = live_requests.get(rid)
        else:
            rid = request.request_id
    if live is None:
        return []
    for before in self._hooks.before_free:
        before(request, live)
    del self.live_requests[rid]
    blocks = self.coordinator.pop_blocks_for_free(rid)
    self.held.hold(blocks)
    return blocks


def release_blocks(self: Facade, block_ids: Sequence[int]) -> None:
    """Drop one held reference to each of ``block_ids`` in the order given (the first
    is evicted first once free): blocks :meth:`pop_blocks_for_free` returned (pass them
    reversed) or retained for a copy (:meth:`take_block_copies`). Null blocks skipped.

    Raises:
        InvalidArgumentError: not a list of ints, or an id not held (that many times)
            outside block tables; nothing is released.
    """
    self.held.release(block_ids)


def take_block_copies(self: Facade) -> BlockCopies:
    """The block copies (copy on write of sub-block hits) queued since the last call,
    in group order, and the blocks they keep referenced (source and copy of each):
    run the copies, then pass ``retained`` to :meth:`release_blocks` (vLLM 0.33's
    ``take_kv_cache_block_copies``). Full attention 16 + Mamba 16, hash block 4: a
    request adopting a 24-token hit whose full-attention block 1 is ``b`` and Mamba
    state ``s`` gets copies ``b -> c1``, ``s -> c2``, retained ``(b, c1, s, c2)``.
    """
    coordinator = self.coordinator
    if type(coordinator).take_copies is _NEVER_COPIES:  # no sub-block hits: no call
        return NO_COPIES
    pairs = coordinator.take_copies()
    return self.held.hold_copies(pairs) if pairs else NO_COPIES


#: The base coordinator's ``take_copies``: none queued, ever (no sub-block hits).
_NEVER_COPIES = Coordinator.take_copies


def take_boundary_state_offloads(self: Facade) -> dict[str, list[tuple[int, int, int]]]:
    """The Mamba states registered since the last call, for a KV connector to copy by
    block id (vLLM 0.33's ``take_boundary_state_offloads``): request id -> ``(group,
    block id, boundary tokens)`` in group order, then registration order; a sub-block
    state appears as the copy its producer's next allocation made. Empty unless
    ``CacheConfig.record_boundary_states``; records of freed requests are dropped. The
    blocks are not held (see :mod:`pagedkv.core.managers.boundary_states`)."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    for m in self.coordinator.managers:
        if m.offloads is not None:
            for rid, group, block, num_tokens in m.offloads.take():
                out.setdefault(rid, []).append((group, block, num_tokens))
    return out


def finalize_partial_tail_offloads(self: Facade, request_id: str, num_computed_tokens: int,
                                   num_in_flight_tokens: int = 0
                                   ) -> list[tuple[int, int, int]]:
    """When a request ends: each Mamba group's sub-block state the request registered
    itself and still holds in its own block, as ``(group, block id, boundary
    tokens)`` -- only when exactly the boundary is computed and nothing is in flight
    (vLLM 0.33's ``finalize_partial_tail_offloads``). Forgets those states either
    way; ``[]`` without ``record_boundary_states``."""
    out: list[tuple[int, int, int]] = []
    for m in self.coordinator.managers:
        if m.offloads is not None:
            found = m.offloads.finalize(request_id, num_computed_tokens,
                                        num_in_flight_tokens)
            if found is not None:
                out.append(found)
    return out


def take_new_block_ids(self: Facade) -> list[int]:
    """The attention blocks allocated since the last call, group by group, for the
    engine to zero (``CacheConfig.zero_new_blocks``; on by default with a Mamba group,
    as vLLM's ``needs_kv_cache_zeroing``). Call once per step."""
    return self.coordinator.take_new_block_ids()


def record_blocks_for_zeroing(self: Facade, request_id: str, start_token: int) -> None:
    """Record the request's blocks from token ``start_token`` on again in every zeroed
    group (e.g. blocks a failed KV load left unwritten), as vLLM 0.33.

    Raises:
        UnknownRequestError: the manager holds no blocks for this request.
        InvalidArgumentError: ``start_token`` not an int >= 0 or not a multiple of a
            zeroed group's block size.
    """
    if type(request_id) is not str or request_id not in self.live_requests:
        self.require_live(request_id)  # raises
    if type(start_token) is not int or start_token < 0:
        validation.check_count("start_token", start_token)  # raises
    self.coordinator.record_for_zeroing(request_id, start_token)


def reset_prefix_cache(self: Facade) -> bool:
    """Forget every cached prefix, only when no block is in use; returns whether it
    happened (then the hit-rate window is cleared too)."""
    ok = self.pool.reset_prefix_cache()
    if ok:
        self.hit_rate_window.reset()
    return ok


def evict_blocks(self: Facade, block_ids: Sequence[int]) -> None:
    """Drop the given blocks from the prefix index (in-use blocks stay allocated).

    Raises:
        InvalidArgumentError: an id outside the pool; nothing is evicted.
    """
    self.pool.evict_blocks(block_ids)
