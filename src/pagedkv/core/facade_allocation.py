"""The façade's allocation: ``allocate_slots``, its rule (what a call may ask, checked in
one place: the cheap pre-test and :func:`check_allocate`), and ``cache_blocks``.

Functions taking the manager; :class:`pagedkv.KVCacheManager` holds each as its method of
the same name. The compiled core's ``DecodeAllocate`` (:mod:`pagedkv.core.fast_paths`)
takes a running request's plain calls and hands every other call to
:func:`allocate_slots`, so the rule below governs both cores (the differential machine,
``tests/core/test_kernels_differential.py``, compares them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagedkv.core import validation
from pagedkv.core.components import AllocateCall
from pagedkv.core.coordinator import ComputedBlocks
from pagedkv.core.request import RequestLike

if TYPE_CHECKING:
    from pagedkv.core.facade_state import Facade


def allocate_slots(self: Facade,
    request: RequestLike,
    num_new_tokens: int,
    *,
    new_computed_blocks: object = None,
    num_new_computed_tokens: int | None = None,
    num_lookahead_tokens: int = 0,
    num_external_computed_tokens: int = 0,
    num_encoder_tokens: int = 0,
    delay_caching: bool = False,
    reserved_blocks: int = 0,
    has_scheduled_reqs: bool = True,
    full_sequence_must_fit: bool = False,
    num_in_flight_tokens: int = 0,
    lenient_counts: bool = False,
) -> tuple[list[int], ...] | None:
    """Give ``request`` slots for ``num_new_tokens`` more tokens.

    ``new_computed_blocks`` (from :meth:`get_computed_blocks`, first call of a request
    only) is adopted as the start of its block table; ``num_new_computed_tokens``
    defaults to its token count. ``num_lookahead_tokens``: extra slots for speculative
    tokens. ``num_external_computed_tokens``: tokens whose KV arrives from elsewhere
    (a remote prefill). ``num_encoder_tokens``: encoder length for cross-attention
    groups. ``delay_caching``: do not register full blocks yet (their KV is not there
    yet); call :meth:`cache_blocks` when it is. ``reserved_blocks``: free blocks this
    allocation must leave for requests already in flight. ``has_scheduled_reqs``: other
    requests are scheduled this step; then a request's first allocation (it holds no
    blocks: new or preempted) must also leave ``watermark_blocks`` free. Both as vLLM
    0.33: the pool must have ``needed + reserved + watermark`` free blocks.
    ``full_sequence_must_fit``: admit only if the pool could hold the whole request
    (all ``num_tokens``, hit blocks counted, sliding-window and chunked-local groups
    capped at their admission cap, see ``CacheConfig.max_in_flight_tokens``) plus the
    watermark, before anything is released: vLLM 0.33's gate that keeps chunked
    prefill from admitting requests whose later chunks cannot fit.
    ``num_in_flight_tokens``: of ``request.num_computed_tokens``, the tokens a step
    still running computes (an engine that schedules ahead counts them as computed):
    sliding-window and chunked-local blocks are freed only once the *processed* tokens
    (``num_computed_tokens - num_in_flight_tokens``) leave them, since the running
    step may still read them (vLLM 0.33's async scheduling). ``lenient_counts``: an
    engine's own counting, as vLLM 0.33's scheduler keeps it (see
    ``docs/vllm.md``): new tokens may run past the request's tokens
    (draft tokens, output placeholders: slots, never registered), a request holding
    no blocks may already count computed tokens, and ``num_new_computed_tokens`` may
    be shorter than the hit (the hit is cut to it), and blocks are registered only as
    far as the request has block hashes (an engine may hash lazily).

    Order, as vLLM 0.33: free the blocks that fell out of windows (sliding window,
    chunked local: never read again), check capacity for every group at once, claim
    every group's hit blocks, then allocate and register blocks that became full.
    Claiming all hits before any group allocates means one group's allocation can
    never evict another group's hit.

    Returns:
        The newly allocated block ids per group, or ``None`` when there are not enough
        free blocks. A refused allocation **changes nothing except releasing blocks the
        request no longer needs** (those outside its windows; they are freed as on
        any other call, exactly as vLLM does); with full attention only, nothing.

    ``num_lookahead_tokens`` past ``max_model_len`` are capped there (speculative
    tokens that could never be accepted); every other count is checked exactly.

    Raises:
        InvalidArgumentError: the rules in :mod:`pagedkv.core.validation` (types and ranges
            of counts, ``num_computed_tokens``, a prompt past ``max_model_len``, hit
            blocks for a request that already holds blocks).
        DuplicateRequestError: another live request object has this id.
        InvalidHitError: a hit from another manager or request, or stale.
        In every case state is unchanged.
    """
    try:
        rid = request.request_id
        num_computed = request.num_computed_tokens
        num_request_tokens = request.num_tokens
        # The common call (a live request, no hit, no external or encoder tokens, any
        # valid lookahead and headroom) passes these few tests; anything else gets
        # validation.check_allocate's full check.
        first = (
            self.live_requests.get(rid) is not request
            or new_computed_blocks is not None
            or num_new_computed_tokens is not None
            or num_external_computed_tokens or num_encoder_tokens
            or type(num_lookahead_tokens) is not int or num_lookahead_tokens < 0
            or type(reserved_blocks) is not int or reserved_blocks < 0
            or type(has_scheduled_reqs) is not bool
            or type(full_sequence_must_fit) is not bool
            or type(num_new_tokens) is not int or type(num_computed) is not int
            or num_new_tokens <= 0 or num_computed < 0
            or (num_computed + num_new_tokens > num_request_tokens and not lenient_counts)
            or num_request_tokens > self.max_model_len or type(lenient_counts) is not bool
            or num_request_tokens != getattr(request, "_owned_tokens", num_request_tokens)
            or (num_in_flight_tokens and (type(num_in_flight_tokens) is not int
                                         or not 0 < num_in_flight_tokens <= num_computed))
        ) and validation.check_allocate(
            self, request, num_new_tokens, new_computed_blocks,
            (num_new_computed_tokens, num_lookahead_tokens,
             num_external_computed_tokens, num_encoder_tokens),
            (reserved_blocks, has_scheduled_reqs, full_sequence_must_fit,
             num_in_flight_tokens, lenient_counts))
    except (AttributeError, TypeError):
        validation.check_allocate(self, request, num_new_tokens, new_computed_blocks,
                                  (num_new_computed_tokens, num_lookahead_tokens,
                                   num_external_computed_tokens, num_encoder_tokens),
                                  (reserved_blocks, has_scheduled_reqs,
                                   full_sequence_must_fit, num_in_flight_tokens,
                                   lenient_counts))
        raise
    hit, local_computed = None, num_computed
    if new_computed_blocks is not None:
        hit, num_hit = adopted(self, new_computed_blocks, num_new_computed_tokens)
        local_computed += num_hit
    coordinator = self.coordinator
    max_len = self.max_model_len
    total_computed = local_computed + num_external_computed_tokens
    num_tokens = min(total_computed + num_new_tokens + num_lookahead_tokens, max_len)
    watermark = self.watermark_blocks if first and has_scheduled_reqs else 0
    if full_sequence_must_fit and coordinator.num_blocks_for_full_sequence(
        rid, hit, total_computed, min(num_request_tokens, max_len), num_encoder_tokens
    ) + watermark > self.pool.free_queue.num_free:
        return None
    headroom = reserved_blocks + watermark  # watermark: only when admitting
    # Positional on this per-step path (keywords cost ~3 % of an allocation); the
    # order is Coordinator.allocate's: computed, total computed, tokens, encoder
    # tokens, main-model tokens, headroom, local computed.
    # Windows free on the processed tokens only (a running step still reads them).
    processed = num_computed - num_in_flight_tokens if num_in_flight_tokens else num_computed
    new_blocks = coordinator.allocate(
        rid, hit, processed if processed > 0 else 0, total_computed, num_tokens,
        num_encoder_tokens, total_computed + num_new_tokens, headroom, local_computed)
    if new_blocks is not None:
        if first:
            self.live_requests[rid] = request
        if not delay_caching:
            end = total_computed + num_new_tokens
            if lenient_counts:  # only appended tokens, only as far as hashed
                end = min(end, num_request_tokens,
                          len(request.block_hashes) * self.pool.hash_block_size)
            coordinator.cache_blocks(request, end)
    return new_blocks


def adopted(self: Facade, hit: object, num_tokens: int | None
             ) -> tuple[tuple[list[int], ...], int]:
    """The hit's tables and tokens as adopted: cut to ``num_tokens`` when that is
    shorter (``lenient_counts``, validated by the caller)."""
    assert isinstance(hit, ComputedBlocks)  # validated by allocate_slots
    if num_tokens is not None and num_tokens < hit.num_computed_tokens:
        return self.coordinator.truncate(hit.block_ids, num_tokens), num_tokens
    return hit.block_ids, hit.num_computed_tokens


def allocate_with_components(self: Facade, request: RequestLike, num_new_tokens: int,
                              **kwargs: Any) -> tuple[list[int], ...] | None:
    """:meth:`allocate_slots` through the components' hooks: ``before_allocate``, a
    hit object a component issued to that component, ``after_allocate``."""
    hooks = self._hooks
    for before in hooks.before_allocate:
        before(request)
    hit = kwargs.get("new_computed_blocks")
    if hit is not None and type(hit) is not ComputedBlocks:
        call = AllocateCall(num_new_tokens, **kwargs)
        for allocate in hooks.allocate_hit:
            try:
                return allocate(request, call)
            except NotImplementedError:
                continue
    new = allocate_slots(self, request, num_new_tokens, **kwargs)
    for after in hooks.after_allocate:
        after(request, hit, new)
    return new


def cache_blocks(self: Facade, request: RequestLike, num_computed_tokens: int) -> None:
    """Register the request's full blocks within its first ``num_computed_tokens``
    tokens (after a delayed allocation whose KV has now arrived).

    Raises:
        UnknownRequestError: the manager holds no blocks for this request.
        InvalidArgumentError: a bad count, or more tokens than the request has slots.
    """
    validation.check_cache_blocks(self, request, num_computed_tokens)
    self.coordinator.cache_blocks(request, min(num_computed_tokens, request.num_tokens))
