"""The façade's allocation: ``allocate_slots``, its rule (what a call may ask, checked in
one place: the cheap pre-test and :func:`check_allocate`), and ``cache_blocks``.

Functions taking the manager; :class:`pagedkv.KVCacheManager` holds each as its method of
the same name. The compiled core's ``DecodeAllocate`` (:mod:`pagedkv.core.fast_paths`)
takes a running request's plain calls and a new request's plain first call (a fresh hit
or none) and hands every other call to :func:`allocate_slots`, so the rule below governs
both cores (the differential machine, ``tests/core/test_kernels_differential.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, cast

from pagedkv.core import validation
from pagedkv.core.components import AllocateCall
from pagedkv.core.coordinator import ComputedBlocks
from pagedkv.core.request import Request, RequestLike
from pagedkv.core.validation import (
    ManagerView,
    check_count,
    check_hashed,
    check_hit,
    check_request_id,
    request_of,
)
from pagedkv.errors import DuplicateRequestError, InvalidArgumentError, InvalidHitError

if TYPE_CHECKING:
    from pagedkv.core.facade_state import Facade

#: The default of the count keywords, tested by identity on the common call (CPython
#: keeps one 0; any other zero, 0.0 or False, takes the checked path).
_ZERO = 0


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
    (a remote prefill; their blocks join the table first, not returned, as vLLM's).
    ``num_encoder_tokens``: encoder length for cross-attention
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
        InvalidArgumentError: the rule in :func:`check_allocate` (types and ranges
            of counts, ``num_computed_tokens``, a prompt past ``max_model_len``, hit
            blocks for a request that already holds blocks).
        DuplicateRequestError: another live request object has this id.
        InvalidHitError: a hit from another manager or request, or stale.
        In every case state is unchanged.
    """
    try:
        rid = request.request_id
        num_computed = request.num_computed_tokens
        if type(request) is Request:  # its own count, the property's len() checked
            num_request_tokens = request._owned_tokens
            tokens_owned = len(request.all_token_ids) == num_request_tokens
        else:
            num_request_tokens = request.num_tokens
            tokens_owned = num_request_tokens == getattr(request, "_owned_tokens",
                                                         num_request_tokens)
        # The common call (a live request, its tokens appended through it, valid counts,
        # every keyword at its default: identity tests) short-circuits on the first
        # three lines; any other call tests each term, then check_allocate's full rule.
        first = (
            self.live_requests.get(rid) is not request or not tokens_owned
            or type(num_new_tokens) is not int or type(num_computed) is not int
            or num_new_tokens <= 0 or num_computed < 0
            or num_request_tokens > self.max_model_len
            or (not (new_computed_blocks is None and num_new_computed_tokens is None
                    and num_lookahead_tokens is _ZERO and reserved_blocks is _ZERO
                    and num_external_computed_tokens is _ZERO and num_encoder_tokens is _ZERO
                    and num_in_flight_tokens is _ZERO and has_scheduled_reqs is True
                    and full_sequence_must_fit is False and lenient_counts is False
                    and num_computed + num_new_tokens <= num_request_tokens)
            and _odd_call(new_computed_blocks, num_new_computed_tokens, num_lookahead_tokens,
                          num_external_computed_tokens, num_encoder_tokens, reserved_blocks,
                          (has_scheduled_reqs, full_sequence_must_fit, lenient_counts),
                          num_in_flight_tokens, num_computed, num_new_tokens, num_request_tokens))
        ) and check_allocate(
            self, request, num_new_tokens, new_computed_blocks,
            (num_new_computed_tokens, num_lookahead_tokens,
             num_external_computed_tokens, num_encoder_tokens),
            (reserved_blocks, has_scheduled_reqs, full_sequence_must_fit,
             num_in_flight_tokens, lenient_counts))
    except (AttributeError, TypeError):
        check_allocate(self, request, num_new_tokens, new_computed_blocks,
                       (num_new_computed_tokens, num_lookahead_tokens,
                        num_external_computed_tokens, num_encoder_tokens),
                       (reserved_blocks, has_scheduled_reqs, full_sequence_must_fit,
                        num_in_flight_tokens, lenient_counts))
        raise
    hit, local_computed = None, num_computed
    if new_computed_blocks is not None:
        hit, num_hit = adopted(self, new_computed_blocks, num_new_computed_tokens)
        local_computed += num_hit
    coordinator = self.coordinator
    total_computed = local_computed + num_external_computed_tokens
    num_tokens = min(total_computed + num_new_tokens + num_lookahead_tokens,
                     self.max_model_len)
    watermark = self.watermark_blocks if first and has_scheduled_reqs else 0
    if full_sequence_must_fit and not whole_request_fits(
            self, rid, hit, total_computed, num_request_tokens, num_encoder_tokens, watermark):
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
                end = hashed_end(self, request, end)
            coordinator.cache_blocks(request, end)
    return new_blocks


def _odd_call(hit: object, new_computed: object, lookahead: object, external: object,
              encoder: object, reserved: object, flags: tuple[object, object, object],
              in_flight: object, computed: int, num_new: int, num_tokens: int) -> bool:
    """The rest of ``allocate_slots``' pre-test, for a call with a keyword off its
    default: whether any term needs :func:`check_allocate`'s full rule (a hit, counts
    of another type or out of range, flags that are not bools, tokens past the
    request's unless ``lenient_counts``). ``flags``: ``has_scheduled_reqs``,
    ``full_sequence_must_fit``, ``lenient_counts``. No state change."""
    has_scheduled, must_fit, lenient = flags
    return bool(
        hit is not None or new_computed is not None
        or type(external) is not int or type(encoder) is not int or external or encoder
        or type(lookahead) is not int or lookahead < 0
        or type(reserved) is not int or reserved < 0
        or type(has_scheduled) is not bool or type(must_fit) is not bool
        or type(lenient) is not bool or (computed + num_new > num_tokens and not lenient)
        or (in_flight and (type(in_flight) is not int
                           or not 0 < in_flight <= computed)))


def whole_request_fits(self: Facade, rid: str, hit: tuple[list[int], ...] | None,
                       total_computed: int, num_request_tokens: int, num_encoder_tokens: int,
                       watermark: int) -> bool:
    """``full_sequence_must_fit``'s gate: the pool could hold the whole request (its
    ``num_tokens`` up to ``max_model_len``, hit blocks counted) plus ``watermark``."""
    need = self.coordinator.num_blocks_for_full_sequence(
        rid, hit, total_computed, min(num_request_tokens, self.max_model_len),
        num_encoder_tokens)
    return need + watermark <= self.pool.free_queue.num_free


def hashed_end(self: Facade, request: RequestLike, end: int) -> int:
    """Under ``lenient_counts``, where registration stops: at ``end``, the request's own
    tokens and its hashed blocks, whichever comes first."""
    return min(end, request.num_tokens, len(request.block_hashes) * self.pool.hash_block_size)


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


# ---------------------------------------------------------------- the rule
# What an allocate_slots call may ask; allocate_slots runs check_allocate whenever its
# pre-test (the common call: a live request, plain counts) does not pass.

def _refuse_headroom(reserved: object, has_scheduled: object, must_fit: object) -> None:
    """Raise for the first of ``allocate_slots``' headroom arguments that is wrong."""
    if type(must_fit) is not bool:
        raise InvalidArgumentError(
            f"full_sequence_must_fit must be a bool, got {must_fit!r}"
        )
    if type(reserved) is not int or reserved < 0:
        check_count("reserved_blocks", reserved)
    if type(has_scheduled) is not bool:
        raise InvalidArgumentError(
            f"has_scheduled_reqs must be a bool, got {has_scheduled!r}; pass whether other "
            "requests are scheduled in this step"
        )


def _refuse_live(rid: str, same_object: bool) -> NoReturn:
    """Raise for a live request id given again: by another object, or with hit blocks."""
    if not same_object:
        raise DuplicateRequestError(
            f"request id {rid!r} belongs to another live request object; ids must be unique "
            "among live requests (free the other one first)"
        )
    raise InvalidArgumentError(
        f"request {rid!r} already holds blocks; prefix-cache hit blocks can only "
        "be given to its first allocate_slots call"
    )


def _engine_counts(headroom: tuple[object, ...], computed: int, rid: str) -> bool:
    """Checks ``num_in_flight_tokens`` (an int in ``[0, computed]``) and
    ``lenient_counts`` (a bool) from ``headroom`` (defaults 0 and False); returns the
    latter."""
    in_flight = check_count("num_in_flight_tokens", headroom[3] if len(headroom) > 3 else 0)
    if in_flight > computed:
        raise InvalidArgumentError(
            f"request {rid!r}: num_in_flight_tokens={in_flight} but only {computed} tokens "
            "are computed; in-flight tokens are part of num_computed_tokens")
    lenient = headroom[4] if len(headroom) > 4 else False
    if type(lenient) is not bool:
        raise InvalidArgumentError(f"lenient_counts must be a bool, got {lenient!r}")
    return lenient


def _check_lenient(mgr: ManagerView, req: RequestLike, rid: str, hit: object,
                   counts: tuple[int, object, int], live: object) -> bool:
    """The rest of :func:`check_allocate` under ``lenient_counts`` (an engine's own
    counting, ``docs/vllm.md``): a shorter ``num_new_computed_tokens``
    than the hit is allowed (the façade cuts the hit), counts past the request's tokens
    and computed tokens without blocks are."""
    num_hit, new_computed, _num_new = counts
    n = check_count("num_new_computed_tokens", new_computed)
    if n > num_hit:
        raise InvalidArgumentError(
            f"request {rid!r}: num_new_computed_tokens={n} but the hit holds only "
            f"{num_hit} tokens")
    if hit is not None and bool(num_hit or any(cast(ComputedBlocks, hit).block_ids)):
        check_hit(mgr, req, rid, cast(ComputedBlocks, hit))
    return live is None


def check_allocate(
    mgr: ManagerView,
    request: object,
    num_new_tokens: object,
    hit: object,
    counts: tuple[object, object, object, object],
    headroom: tuple[object, ...] = (0, True, False),
) -> bool:
    """All checks of :meth:`KVCacheManager.allocate_slots`; ``counts`` are
    ``num_new_computed_tokens`` (``None``: the hit's), ``num_lookahead_tokens``,
    ``num_external_computed_tokens`` and ``num_encoder_tokens``; ``headroom`` is
    ``(reserved_blocks, has_scheduled_reqs)``: an int >= 0 and a bool.

    Returns:
        Whether this is the request's first allocation (it holds no blocks yet).

    Raises:
        InvalidArgumentError, DuplicateRequestError, InvalidHitError: the rules of the
            module docstring.
    """
    # Each test is a cheap guard; the diagnosing helpers run only when one fails.
    req = cast("RequestLike", request)
    try:
        rid = req.request_id
        computed = req.num_computed_tokens
        num_tokens = req.num_tokens
    except AttributeError:
        request_of(request)
        raise
    if type(rid) is not str or not rid:
        check_request_id(rid)
    c = _checked_counts(rid, num_new_tokens, hit, counts)
    reserved, has_scheduled = headroom[0], headroom[1]
    must_fit = headroom[2] if len(headroom) > 2 else False
    if (type(must_fit) is not bool or type(reserved) is not int or reserved < 0
            or type(has_scheduled) is not bool):
        _refuse_headroom(reserved, has_scheduled, must_fit)
    live = mgr.live_requests.get(rid)
    has_hit = hit is not None and bool(c.num_hit or any(cast(ComputedBlocks, hit).block_ids))
    if live is not None and (live is not request or has_hit):
        _refuse_live(rid, live is request)
    if type(computed) is not int or computed < 0:
        check_count(f"request {rid!r}: num_computed_tokens", computed)
    if num_tokens > mgr.max_model_len:
        raise InvalidArgumentError(
            f"request {rid!r} has {num_tokens} tokens, more than max_model_len="
            f"{mgr.max_model_len}; finish it at max_model_len"
        )
    check_hashed(req, rid, num_tokens)
    if _engine_counts(headroom, computed, rid):  # lenient_counts
        return _check_lenient(mgr, req, rid, hit, (c.num_hit, c.new_computed, c.num_new),
                              live)
    _check_strict(mgr, req, hit if has_hit else None, live, c, computed)
    return live is None


class _Counts(NamedTuple):
    """``allocate_slots``' counts as checked so far (:func:`_checked_counts`)."""

    num_new: int
    num_hit: int
    new_computed: object
    lookahead: object
    external: object


def _checked_counts(rid: str, num_new_tokens: object, hit: object,
                    counts: tuple[object, object, object, object]) -> _Counts:
    """The checks of ``num_new_tokens``, the hit's type and ``counts`` (as
    :func:`check_allocate` takes them)."""
    if type(num_new_tokens) is not int or num_new_tokens < 0:
        check_count("num_new_tokens", num_new_tokens)
    new_computed, lookahead, external, encoder = counts
    if hit is not None and not isinstance(hit, ComputedBlocks):
        raise InvalidHitError(
            f"request {rid!r}: new_computed_blocks must be the ComputedBlocks that "
            f"get_computed_blocks returned, got {type(hit).__name__}"
        )
    num_hit = hit.num_computed_tokens if hit is not None else 0
    if new_computed is None:
        new_computed = num_hit
    # A zero of another type (0.0, False) is checked too: taken as none, it failed later,
    # inside the pool, with the request half allocated.
    if (lookahead or external or encoder or new_computed != num_hit
            or type(lookahead) is not int or type(external) is not int
            or type(encoder) is not int):
        check_count("num_new_computed_tokens", new_computed)
        lookahead = check_count("num_lookahead_tokens", lookahead)
        external = check_count("num_external_computed_tokens", external)
        check_count("num_encoder_tokens", encoder)
    return _Counts(cast(int, num_new_tokens), num_hit, new_computed, lookahead, external)


def _check_strict(mgr: ManagerView, req: RequestLike, hit: object, live: object,
                  c: _Counts, computed: int) -> None:
    """The rest of :func:`check_allocate` without ``lenient_counts``; ``hit`` only when
    it holds blocks or tokens."""
    rid, num_tokens = req.request_id, req.num_tokens
    num_hit, new_computed, num_new = c.num_hit, c.new_computed, c.num_new
    external, lookahead = c.external, c.lookahead
    if live is None and computed:
        raise InvalidArgumentError(
            f"request {rid!r} holds no blocks (new, or freed) but num_computed_tokens="
            f"{computed}; set it to 0 before allocating again (its KV is gone)"
        )
    if new_computed != num_hit:
        raise InvalidArgumentError(
            f"request {rid!r}: num_new_computed_tokens={new_computed} but the hit holds "
            f"{num_hit} tokens; leave it out (it defaults to the hit's)"
        )
    if num_new == 0 and not external and not lookahead and not num_hit:
        # (a hit alone may be adopted: vLLM 0.33's replay-only chunk)
        raise InvalidArgumentError(
            f"request {rid!r}: allocate_slots needs num_new_tokens > 0 (or a hit, external "
            "or lookahead tokens); there is nothing to allocate"
        )
    if hit is not None:
        check_hit(mgr, req, rid, cast(ComputedBlocks, hit))
    if computed + num_hit + cast(int, external) + num_new > num_tokens:
        raise InvalidArgumentError(
            f"request {rid!r}: {computed} computed + {num_hit} hit + {external} external + "
            f"{num_new} new tokens is more than its {num_tokens} tokens; append the tokens "
            "first (lookahead slots go in num_lookahead_tokens)"
        )

