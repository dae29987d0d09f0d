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
from typing import Any, TypeVar

from pagedkv.core import fast_paths, validation
from pagedkv.core.block_info import BlockInfo
from pagedkv.core.cached_tokens import estimate_cached_tokens
from pagedkv.core.components import AllocateCall, EventPublisher, Hooks, ManagerComponent
from pagedkv.core.config import CacheConfig
from pagedkv.core.coordinator import ComputedBlocks
from pagedkv.core.factory import build_parts
from pagedkv.core.group_hits import find_hit_per_group
from pagedkv.core.hashing import HashExtras
from pagedkv.core.held_blocks import NO_COPIES, BlockCopies, BlockCopy, HeldBlocks
from pagedkv.core.metrics import HitRateWindow, LookupCounters, PrefixCacheStats
from pagedkv.core.records import BlockStored, KVCacheEvent
from pagedkv.core.request import Request, RequestLike
from pagedkv.core.specs import KVCacheSpec
from pagedkv.errors import (
    ConfigError,
    InvalidArgumentError,
    InvalidHitError,
    UnknownRequestError,
)

__all__ = ["BlockCopies", "BlockCopy", "ComputedBlocks", "KVCacheManager"]

_C = TypeVar("_C", bound=ManagerComponent)


class KVCacheManager:
    """Block tables, prefix caching and events for every KV-cache group of one model.

    Not thread-safe: one scheduler thread calls it. Every per-request operation costs
    O(blocks it touches), independent of the pool size; every method leaves state
    unchanged when it raises. Features attach as
    components (``CacheConfig.retention``, ``observe``, ``host_tier``, ``kv_events``,
    ``components``; :mod:`pagedkv.core.components`) and are reachable as
    ``mgr.retention``, ``mgr.observe``, ``mgr.host`` (``None`` when absent) or, typed,
    ``mgr.component(Kind)``.
    """

    #: The retention component (pins, per-request retention), or None.
    retention: Any
    #: The miss-attribution component, or None.
    observe: Any
    #: The host-tier component, or None.
    host: Any

    def __init__(self, config: CacheConfig) -> None:
        if not isinstance(config, CacheConfig):
            raise InvalidArgumentError(
                f"KVCacheManager takes a CacheConfig, got {type(config).__name__}")
        parts = build_parts(config)
        self.config = config
        self.max_model_len = config.max_model_len
        #: Blocks kept free when admitting a request (see ``CacheConfig.watermark``).
        self.watermark_blocks = int(config.watermark * config.num_blocks)
        self.pool = parts.pool
        #: Where the pool's events go: a buffer with events on, else the null recorder.
        self.recorder = parts.pool.recorder
        self.hasher = parts.hasher
        self.managers = parts.managers
        self.coordinator = parts.coordinator
        #: Whether hits may end inside a block (see :class:`PartialHitCoordinator`).
        self.partial_hits = parts.partial_hits
        #: References the engine holds outside block tables (deferred frees, copies).
        self.held = HeldBlocks(parts.pool)
        #: Block id -> references held outside tables (read-only for callers).
        self.held_outside = self.held.counts
        #: Stamped into every hit this manager issues (see :class:`ComputedBlocks`).
        self.issuer_token = object()
        self._empty_hit = ComputedBlocks(tuple([] for _ in config.groups), 0,
                                         self.issuer_token)
        #: Live requests (holding blocks) by id; read-only for callers.
        self.live_requests: dict[str, RequestLike] = {}
        #: Lookup counters since the last :meth:`make_prefix_cache_stats`.
        self.lookups = LookupCounters()
        self.hit_rate_window = HitRateWindow(config.hit_rate_window_requests)
        #: The attached components, in attach order.
        self.components: tuple[ManagerComponent, ...] = parts.components
        self.retention = self.observe = self.host = None
        for c in self.components:
            if c.name in ("retention", "observe", "host"):
                setattr(self, c.name, c)
        hooks = self._hooks = Hooks(self.components)
        # Hooked entry points only where a component hooks them: without components
        # the class's own methods run, with no test at all.
        if hooks.after_lookup:
            self.get_computed_blocks = self._lookup_with_components  # type: ignore[method-assign]
        #: Whether ``allocate_slots`` is the compiled core's (:mod:`pagedkv.core.fast_paths`).
        self._fast_allocate = False
        if hooks.before_allocate or hooks.allocate_hit or hooks.after_allocate:
            self.allocate_slots = self._allocate_with_components  # type: ignore[method-assign]
        elif (fast := fast_paths.install(self, KVCacheManager.allocate_slots,
                                         KVCacheManager.cache_blocks)) is not None:
            # The compiled core takes a running request's plain calls.
            self.allocate_slots = fast  # type: ignore[method-assign]
            self.cache_blocks = fast.cache_blocks  # type: ignore[method-assign]
            self._fast_allocate = True
        self.publisher: EventPublisher | None = None
        if config.kv_events is not None:
            self.publisher = config.kv_events.make_publisher(self.prefix_index_snapshot)
        for c in self.components:
            c.bind(self)

    def __getstate__(self) -> dict[str, Any]:
        """Copy and pickle state: the compiled ``allocate_slots`` is built again, not copied."""
        state = dict(self.__dict__)
        if self._fast_allocate:
            del state["allocate_slots"], state["cache_blocks"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._fast_allocate:
            fast = fast_paths.install(self, KVCacheManager.allocate_slots,
                                      KVCacheManager.cache_blocks)
            self._fast_allocate = fast is not None
            if fast is not None:
                self.allocate_slots = fast  # type: ignore[method-assign]
                self.cache_blocks = fast.cache_blocks  # type: ignore[method-assign]

    def component(self, kind: type[_C]) -> _C:
        """The attached component of class ``kind`` (typed access to ``mgr.retention``
        and its siblings).

        Raises:
            ConfigError: no component of that class is attached; the config field that
                attaches it is named in the message.
        """
        for c in self.components:
            if isinstance(c, kind):
                return c
        raise ConfigError(
            f"this manager has no {kind.__name__} component; attach it through its "
            "CacheConfig field (retention=, observe=, host_tier= or components=)")

    @classmethod
    def from_spec(cls, spec: KVCacheSpec, **fields: Any) -> KVCacheManager:
        """A manager for a model with one KV-cache group; the keywords are any
        :class:`CacheConfig` fields (``num_blocks`` and ``max_model_len`` required).

        >>> from pagedkv import FullAttentionSpec
        >>> spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128,
        ...                          dtype_bytes=2)
        >>> KVCacheManager.from_spec(spec, num_blocks=100, max_model_len=2048).num_free_blocks
        99

        Raises:
            InvalidArgumentError: an unknown field, or a missing required one.
        """
        missing = sorted({"num_blocks", "max_model_len"} - set(fields))
        if missing:
            raise InvalidArgumentError(f"from_spec needs {missing} (CacheConfig fields)")
        return cls(CacheConfig.with_fields(groups=(spec,), **fields))

    # ---------------------------------------------------------------- requests

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        block_hashes: Sequence[bytes] | None = None,
        hash_extras: HashExtras | None = None,
        retention: object = None,
    ) -> Request:
        """A :class:`Request` whose block hashes use this manager's hash settings;
        ``retention`` applies to its blocks when freed (managers with retention only).

        Raises:
            InvalidArgumentError: a bad id, token ids, hashes, extras or retention, or a
                prompt longer than ``max_model_len``.
            DuplicateRequestError: a live request has this id.
        """
        validation.check_new_request(self, request_id, prompt_token_ids, block_hashes,
                                     hash_extras)
        if retention is not None:
            validation.check_request_retention(request_id, retention)
        return Request(request_id, prompt_token_ids, hasher=self.hasher,
                       block_hashes=block_hashes, hash_extras=hash_extras,
                       retention=retention)

    # ---------------------------------------------------------------- lookup

    def get_computed_blocks(self, request: RequestLike) -> ComputedBlocks:
        """The longest cached prefix of ``request`` valid for every group.

        At most ``num_tokens - 1`` tokens hit, so a fully cached prompt still recomputes
        its last token (the engine needs its logits); the hit is block aligned. Records
        lookup statistics (preempted re-lookups apart). Does not change the pool: the hit
        blocks are claimed only by :meth:`allocate_slots`.

        Raises:
            InvalidArgumentError: not a request, or longer than ``max_model_len``.
        """
        try:
            num_tokens = request.num_tokens
        except AttributeError:
            validation.check_lookup(self, request)
            raise
        if num_tokens > self.max_model_len:
            validation.check_lookup(self, request)
        found = self.coordinator.find_longest_cache_hit(request.block_hashes, num_tokens - 1)
        if found is None:  # caching off: no lookup, nothing counted
            return self._empty_hit
        blocks, num_hit = found
        self._count_lookup(request, num_tokens, num_hit)
        return ComputedBlocks(blocks, num_hit, self.issuer_token, request.request_id,
                              self.pool.index_generation, (num_hit, *map(tuple, blocks)))

    def _lookup_with_components(self, request: RequestLike) -> ComputedBlocks:
        """:meth:`get_computed_blocks`, then each component's ``after_lookup``."""
        hit = KVCacheManager.get_computed_blocks(self, request)
        for after in self._hooks.after_lookup:
            after(request, hit)
        return hit

    def lookup_prefix(self, request: RequestLike, max_hit_tokens: int | None = None, *,
                      record_stats: bool = True) -> ComputedBlocks:
        """:meth:`get_computed_blocks` bounded at ``max_hit_tokens`` (default
        ``num_tokens - 1``; an engine may lower it, e.g. to replay a window's tokens).
        ``record_stats=False`` leaves the lookup statistics to :meth:`record_lookup`, for
        engines that count a request once, when it is admitted (vLLM 0.33). Components'
        ``after_lookup`` hooks run as for :meth:`get_computed_blocks`.

        Raises:
            InvalidArgumentError: not a request, longer than ``max_model_len``, or
                ``max_hit_tokens`` not an int in ``[0, num_tokens]``.
        """
        limit = self._lookup_limit(request, max_hit_tokens)
        found = self.coordinator.find_longest_cache_hit(request.block_hashes, limit)
        if found is None:
            return self._empty_hit
        blocks, num_hit = found
        if record_stats:
            self.record_lookup(request, num_hit)
        hit = ComputedBlocks(blocks, num_hit, self.issuer_token, request.request_id,
                             self.pool.index_generation, (num_hit, *map(tuple, blocks)))
        for after in self._hooks.after_lookup:
            after(request, hit)
        return hit

    def _lookup_limit(self, request: RequestLike, max_hit_tokens: int | None) -> int:
        """The checked request and the longest hit a lookup may return (default
        ``num_tokens - 1``); raises as the lookups document."""
        validation.check_lookup(self, request)
        num_tokens = request.num_tokens
        limit = num_tokens - 1 if max_hit_tokens is None else validation.check_count(
            "max_hit_tokens", max_hit_tokens)
        if limit > num_tokens:
            raise InvalidArgumentError(
                f"max_hit_tokens={limit} is more than the request's {num_tokens} tokens")
        return limit

    def lookup_prefix_per_group(self, request: RequestLike, max_hit_tokens: int | None = None,
                                *, reference_group: int = 0) -> ComputedBlocks:
        """Each group's own longest hit within ``max_hit_tokens`` (default
        ``num_tokens - 1``), the groups looked up independently (vLLM 0.33's
        ``find_longest_cache_hit_per_group``, :mod:`pagedkv.core.group_hits`): under
        block pressure a hybrid model's groups hit at different depths. The result's
        ``group_tokens`` holds each group's length and ``num_computed_tokens`` the
        ``reference_group``'s (a KV connector restoring the other groups' state adopts
        that many tokens). :meth:`allocate_slots` adopts it only when no group's hit is
        longer than the reference's (``InvalidHitError`` otherwise). Records no lookup
        statistics (:meth:`record_lookup`) and runs no ``after_lookup`` hook: the groups
        do not agree on it. No state change.

        Raises:
            InvalidArgumentError: not a request, longer than ``max_model_len``,
                ``max_hit_tokens`` not an int in ``[0, num_tokens]``, or
                ``reference_group`` not a group index.
        """
        limit = self._lookup_limit(request, max_hit_tokens)
        groups = len(self.config.groups)
        if type(reference_group) is not int or not 0 <= reference_group < groups:
            raise InvalidArgumentError(
                f"reference_group must be a group index in [0, {groups}), got "
                f"{reference_group!r}")
        if not self.config.enable_caching:
            return self._empty_hit
        blocks, lengths = find_hit_per_group(self.coordinator, request.block_hashes,
                                             max(limit, 0))
        n = lengths[reference_group]
        return ComputedBlocks(blocks, n, self.issuer_token, request.request_id,
                              self.pool.index_generation, (n, *map(tuple, blocks)), lengths)

    def record_lookup(self, request: RequestLike, num_hit_tokens: int) -> None:
        """Count one lookup of ``request`` that hit ``num_hit_tokens`` tokens in the
        prefix-cache statistics (:meth:`make_prefix_cache_stats`, the hit-rate window),
        as :meth:`get_computed_blocks` does itself (preempted requests apart).

        Raises:
            InvalidArgumentError: not a request, or a count outside ``[0, num_tokens]``.
        """
        validation.check_lookup(self, request)
        num_tokens = request.num_tokens
        hits = validation.check_count("num_hit_tokens", num_hit_tokens)
        if hits > num_tokens:
            raise InvalidArgumentError(
                f"num_hit_tokens={hits} is more than the request's {num_tokens} tokens")
        self._count_lookup(request, num_tokens, hits)

    def _count_lookup(self, request: RequestLike, num_tokens: int, hits: int) -> None:
        """The prefix-cache statistics of one checked lookup (preempted requests apart)."""
        lookups = self.lookups
        if request.num_preemptions:
            lookups.preempted_requests += 1
            lookups.preempted_queries += num_tokens
            lookups.preempted_hits += hits
        else:
            lookups.requests += 1
            lookups.queries += num_tokens
            lookups.hits += hits
            self.hit_rate_window.observe(num_tokens, hits)

    def estimate_cached_tokens(self, request: RequestLike) -> int:
        """Tokens of ``request`` already in registered blocks: per prefix-cached group the
        tokens up to its last registered block, the minimum over groups (vLLM's method of
        this name; see :mod:`pagedkv.core.cached_tokens`). 0 for a request holding no blocks.

        Reads only: no statistics, no LRU touch, no events (``debug_state()`` unchanged).

        Raises:
            InvalidArgumentError: not a request.
        """
        validation.check_estimate(request)
        return estimate_cached_tokens(self.managers, self.pool, request)

    # ---------------------------------------------------------------- allocation

    def allocate_slots(
        self,
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
            hit, num_hit = self._adopted(new_computed_blocks, num_new_computed_tokens)
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

    def _adopted(self, hit: object, num_tokens: int | None
                 ) -> tuple[tuple[list[int], ...], int]:
        """The hit's tables and tokens as adopted: cut to ``num_tokens`` when that is
        shorter (``lenient_counts``, validated by the caller)."""
        assert isinstance(hit, ComputedBlocks)  # validated by allocate_slots
        if num_tokens is not None and num_tokens < hit.num_computed_tokens:
            return self.coordinator.truncate(hit.block_ids, num_tokens), num_tokens
        return hit.block_ids, hit.num_computed_tokens

    def _allocate_with_components(self, request: RequestLike, num_new_tokens: int,
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
        new = KVCacheManager.allocate_slots(self, request, num_new_tokens, **kwargs)
        for after in hooks.after_allocate:
            after(request, hit, new)
        return new

    def cache_blocks(self, request: RequestLike, num_computed_tokens: int) -> None:
        """Register the request's full blocks within its first ``num_computed_tokens``
        tokens (after a delayed allocation whose KV has now arrived).

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
            InvalidArgumentError: a bad count, or more tokens than the request has slots.
        """
        validation.check_cache_blocks(self, request, num_computed_tokens)
        self.coordinator.cache_blocks(request, min(num_computed_tokens, request.num_tokens))

    def new_step_starts(self) -> None:
        """Tell the manager a scheduler step begins (call once per step, before scheduling;
        vLLM's ``new_step_starts``). A Mamba state registered in this step cannot be hit
        again before the next one (its KV is written by the step that registered it)."""
        self.coordinator.new_step_starts()
        for started in self._hooks.step_started:
            started()

    def free(self, request: RequestLike | str) -> None:
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

    # ---------------------------------------------------------------- deferred frees

    def pop_blocks_for_free(self, request: RequestLike | str) -> list[int]:
        """Forget the request (its id is free again) but keep its blocks referenced: its
        tables in group order, each without leading null blocks (vLLM 0.33's method).
        Release them with :meth:`release_blocks` **last first** (``reversed(...)``) once
        nothing writes them, so the tail is evicted first, as :meth:`free` would queue
        them. ``[]`` for a request the manager does not track.

        Raises:
            InvalidArgumentError: neither a request nor a str.
            DuplicateRequestError: a request object whose id another live request holds.
        """
        rid = validation.check_free(self, request)
        live = self.live_requests.get(rid)
        if live is None:
            return []
        for before in self._hooks.before_free:
            before(request, live)
        del self.live_requests[rid]
        blocks = self.coordinator.pop_blocks_for_free(rid)
        self.held.hold(blocks)
        return blocks

    def release_blocks(self, block_ids: Sequence[int]) -> None:
        """Drop one held reference to each of ``block_ids`` in the order given (the first
        is evicted first once free): blocks :meth:`pop_blocks_for_free` returned (pass them
        reversed) or retained for a copy (:meth:`take_block_copies`). Null blocks skipped.

        Raises:
            InvalidArgumentError: not a list of ints, or an id not held (that many times)
                outside block tables; nothing is released.
        """
        self.held.release(block_ids)

    def take_block_copies(self) -> BlockCopies:
        """The block copies (copy on write of sub-block hits) queued since the last call,
        in group order, and the blocks they keep referenced (source and copy of each):
        run the copies, then pass ``retained`` to :meth:`release_blocks` (vLLM 0.33's
        ``take_kv_cache_block_copies``). Full attention 16 + Mamba 16, hash block 4: a
        request adopting a 24-token hit whose full-attention block 1 is ``b`` and Mamba
        state ``s`` gets copies ``b -> c1``, ``s -> c2``, retained ``(b, c1, s, c2)``.
        """
        pairs = self.coordinator.take_copies()
        return self.held.hold_copies(pairs) if pairs else NO_COPIES

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
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

    def finalize_partial_tail_offloads(self, request_id: str, num_computed_tokens: int,
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

    def truncate_computed_blocks(self, hit: ComputedBlocks,
                                 num_computed_tokens: int) -> ComputedBlocks:
        """``hit`` cut at ``num_computed_tokens`` (vLLM 0.33's method): each group keeps
        its first ``num_computed_tokens // block_size`` blocks (see
        ``Coordinator.truncate``). Nothing is claimed; the result is checked like any hit
        when adopted (a group left without the blocks its next token reads raises
        :class:`~pagedkv.errors.InvalidHitError` then).

        Raises:
            InvalidHitError: ``hit`` was not issued by this manager.
            InvalidArgumentError: not an int in ``[0, hit tokens]``, or not a multiple of
                every caching group's block size.
        """
        if not isinstance(hit, ComputedBlocks) or hit.issuer is not self.issuer_token:
            raise InvalidHitError(
                "truncate_computed_blocks takes a hit get_computed_blocks returned on this "
                f"manager, got {type(hit).__name__}")
        n = validation.check_count("num_computed_tokens", num_computed_tokens)
        if n > hit.num_computed_tokens:
            raise InvalidArgumentError(
                f"cannot truncate a {hit.num_computed_tokens}-token hit to {n} tokens; "
                "truncation only shortens a hit")
        blocks = self.coordinator.truncate(hit.block_ids, n)
        return ComputedBlocks(blocks, n, self.issuer_token, hit.request_id)

    def take_new_block_ids(self) -> list[int]:
        """The attention blocks allocated since the last call, group by group, for the
        engine to zero (``CacheConfig.zero_new_blocks``; on by default with a Mamba group,
        as vLLM's ``needs_kv_cache_zeroing``). Call once per step."""
        return self.coordinator.take_new_block_ids()

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Record the request's blocks from token ``start_token`` on again in every zeroed
        group (e.g. blocks a failed KV load left unwritten), as vLLM 0.33.

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
            InvalidArgumentError: ``start_token`` not an int >= 0 or not a multiple of a
                zeroed group's block size.
        """
        self.require_live(request_id)
        start = validation.check_count("start_token", start_token)
        self.coordinator.record_for_zeroing(request_id, start)

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
        """The tables clipped to the blocks covering the first ``num_computed_tokens``
        tokens (attention groups; Mamba and cross-attention tables whole), as vLLM's method.
        Block 4, table ``[1, 2, 3]``, 5 tokens -> ``[1, 2]``.

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        self.require_live(request_id)
        return self.coordinator.block_ids_for_computed_tokens(request_id, num_computed_tokens)

    def get_num_cached_blocks(self, request_id: str) -> list[int]:
        """Per group, how many leading blocks of the request's table are registered (or
        were adopted from a hit): the point its next registration starts from.

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        self.require_live(request_id)
        return [m.num_cached_blocks.get(request_id, 0) for m in self.managers]

    def get_num_common_prefix_blocks(self, request_id: str,
                                     num_running_requests: int) -> list[int]:
        """Per group, the leading blocks of ``request_id`` shared by all running requests
        (cascade attention); 0 for kinds that do not support it.

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        self.require_live(request_id)
        validation.check_count("num_running_requests", num_running_requests)
        return self.coordinator.num_common_prefix_blocks(request_id, num_running_requests)

    def remove_skipped_blocks(self, request_id: str, num_processed_tokens: int) -> None:
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

    def block_info(self, block_id: int) -> BlockInfo:
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

    def get_cached_block(self, block_hash: bytes, groups: Sequence[int]) -> list[int] | None:
        """The cached block registered under ``block_hash`` in each of ``groups``, or
        ``None`` when any group has none (vLLM 0.33's ``BlockPool.get_cached_block``).
        Reads only: no LRU touch, no statistics.

        Raises:
            InvalidArgumentError: not bytes, or a group that does not exist.
        """
        if type(block_hash) is not bytes:
            raise InvalidArgumentError(f"block_hash must be bytes, got {block_hash!r}")
        out: list[int] = []
        index = self.pool.index
        for g in groups:
            if type(g) is not int or not 0 <= g < len(index):
                raise InvalidArgumentError(
                    f"group {g!r} does not exist; this manager has {len(index)} groups")
            b = index[g].get(block_hash)
            if b is None:
                return None
            out.append(b)
        return out

    def has_request(self, request_id: str) -> bool:
        """Whether the request holds blocks (allocated and not freed yet). O(1)."""
        return request_id in self.live_requests

    def require_live(self, request_id: str) -> None:
        """Raise :class:`UnknownRequestError` unless the request holds blocks. O(1)."""
        if type(request_id) is not str or request_id not in self.live_requests:
            raise UnknownRequestError(
                f"unknown request {request_id!r}: it was never allocated or is already "
                "freed; call allocate_slots for it first")

    @property
    def num_free_blocks(self) -> int:
        """Free blocks, cached ones (eviction candidates) included."""
        return self.pool.free_queue.num_free

    @property
    def usage(self) -> float:
        """Fraction of non-null blocks in use (ref count > 0)."""
        return 1.0 - self.pool.free_queue.num_free / (self.pool.num_blocks - 1)

    @property
    def num_evicted_blocks(self) -> int:
        """Cached blocks evicted so far."""
        return self.pool.num_evicted_blocks

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookup statistics since the previous call (then starts a new interval)."""
        return self.lookups.take()

    # ---------------------------------------------------------------- cache control

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, only when no block is in use; returns whether it
        happened (then the hit-rate window is cleared too)."""
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

    # ---------------------------------------------------------------- events

    def take_events(self) -> list[KVCacheEvent]:
        """The events buffered since the last call (empty when events are off): the
        device's, then each component's own (a host tier's, medium ``"CPU"``)."""
        events = self.recorder.take()
        for take in self._hooks.take_events:
            events += take()
        return events

    def publish_events(self) -> int:
        """Hand the events since the last call to the publisher (``CacheConfig.kv_events``)
        and return how many there were. Call once per step, also when nothing happened
        (snapshot requests are answered then). Never blocks: the publisher drops and
        counts batches past its queue. Without a publisher the events are discarded."""
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

    def debug_state(self) -> dict[str, Any]:
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

    def check_invariants(self) -> None:
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
