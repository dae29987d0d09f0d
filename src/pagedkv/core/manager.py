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

from pagedkv.core import validation
from pagedkv.core.cached_tokens import estimate_cached_tokens
from pagedkv.core.components import (
    AllocateCall,
    EventPublisher,
    ManagerComponent,
    hook_users,
)
from pagedkv.core.config import CacheConfig
from pagedkv.core.coordinator import ComputedBlocks
from pagedkv.core.factory import build_parts
from pagedkv.core.hashing import HashExtras
from pagedkv.core.manager_queries import ManagerQueries
from pagedkv.core.manager_surface import ManagerSurface
from pagedkv.core.metrics import HitRateWindow, LookupCounters
from pagedkv.core.request import Request, RequestLike
from pagedkv.core.specs import KVCacheSpec
from pagedkv.errors import ConfigError, InvalidArgumentError

__all__ = ["ComputedBlocks", "KVCacheManager"]

_C = TypeVar("_C", bound=ManagerComponent)


class KVCacheManager(ManagerQueries, ManagerSurface):
    """Block tables, prefix caching and events for every KV-cache group of one model.

    Not thread-safe: one scheduler thread calls it. Every per-request operation costs
    O(blocks it touches), independent of the pool size. Deferred frees, truncated hits
    and blocks to zero: :mod:`pagedkv.core.manager_surface`. Features attach as
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
        self.held_outside = {}
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
        self._step_started = hook_users(self.components, "step_started")
        self._after_lookup = hook_users(self.components, "after_lookup")
        self._before_allocate = hook_users(self.components, "before_allocate")
        self._allocate_hit = hook_users(self.components, "allocate_hit")
        self._after_allocate = hook_users(self.components, "after_allocate")
        self._before_free = hook_users(self.components, "before_free")
        self._component_events = hook_users(self.components, "take_events")
        self._component_state = hook_users(self.components, "debug_state")
        self._component_checks = hook_users(self.components, "check_invariants")
        self.publisher: EventPublisher | None = None
        if config.kv_events is not None:
            self.publisher = config.kv_events.make_publisher(self.prefix_index_snapshot)
        for c in self.components:
            c.bind(self)

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
            for after in self._after_lookup:
                after(request, self._empty_hit)
            return self._empty_hit
        blocks, num_hit = found
        lookups = self.lookups
        if request.num_preemptions:
            lookups.preempted_requests += 1
            lookups.preempted_queries += num_tokens
            lookups.preempted_hits += num_hit
        else:
            lookups.requests += 1
            lookups.queries += num_tokens
            lookups.hits += num_hit
            self.hit_rate_window.observe(num_tokens, num_hit)
        hit = ComputedBlocks(blocks, num_hit, self.issuer_token, request.request_id,
                             self.pool.index_generation, (num_hit, *map(tuple, blocks)))
        for after in self._after_lookup:
            after(request, hit)
        return hit

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
        if self._before_allocate or self._allocate_hit or self._after_allocate:
            call = AllocateCall(
                num_new_tokens, new_computed_blocks, num_new_computed_tokens,
                num_lookahead_tokens, num_external_computed_tokens, num_encoder_tokens,
                delay_caching, reserved_blocks, has_scheduled_reqs, full_sequence_must_fit)
            return self._allocate_with_components(request, call)
        return self._allocate(
            request, num_new_tokens, new_computed_blocks, num_new_computed_tokens,
            num_lookahead_tokens, num_external_computed_tokens, num_encoder_tokens,
            delay_caching, reserved_blocks, has_scheduled_reqs, full_sequence_must_fit)

    def _allocate_with_components(self, request: RequestLike,
                                  call: AllocateCall) -> tuple[list[int], ...] | None:
        """:meth:`allocate_slots` through the components' hooks: ``before_allocate``, a
        foreign hit to the component that issued it, ``after_allocate``."""
        for before in self._before_allocate:
            before(request)
        hit = call.new_computed_blocks
        if hit is not None and type(hit) is not ComputedBlocks:
            for allocate in self._allocate_hit:
                try:
                    return allocate(request, call)  # type: ignore[no-any-return]
                except NotImplementedError:
                    continue
        new = self._allocate(request, call.num_new_tokens, *list(call.as_kwargs().values()))
        for after in self._after_allocate:
            after(request, hit, new)
        return new

    def _allocate(
        self, request: RequestLike, num_new_tokens: int,
        new_computed_blocks: object, num_new_computed_tokens: int | None,
        num_lookahead_tokens: int, num_external_computed_tokens: int,
        num_encoder_tokens: int, delay_caching: bool, reserved_blocks: int,
        has_scheduled_reqs: bool, full_sequence_must_fit: bool,
    ) -> tuple[list[int], ...] | None:
        """:meth:`allocate_slots` itself (the arguments in its order)."""
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
                or num_computed + num_new_tokens > num_request_tokens
                or num_request_tokens > self.max_model_len
            ) and validation.check_allocate(
                self, request, num_new_tokens, new_computed_blocks,
                (num_new_computed_tokens, num_lookahead_tokens,
                 num_external_computed_tokens, num_encoder_tokens),
                (reserved_blocks, has_scheduled_reqs, full_sequence_must_fit))
        except (AttributeError, TypeError):
            validation.check_allocate(self, request, num_new_tokens, new_computed_blocks,
                                      (num_new_computed_tokens, num_lookahead_tokens,
                                       num_external_computed_tokens, num_encoder_tokens),
                                      (reserved_blocks, has_scheduled_reqs,
                                       full_sequence_must_fit))
            raise
        if new_computed_blocks is not None:
            assert isinstance(new_computed_blocks, ComputedBlocks)  # validated above
            hit: tuple[list[int], ...] | None = new_computed_blocks.block_ids
            local_computed = num_computed + new_computed_blocks.num_computed_tokens
        else:
            hit = None
            local_computed = num_computed
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
        new_blocks = coordinator.allocate(
            rid, hit, num_computed, total_computed, num_tokens, num_encoder_tokens,
            total_computed + num_new_tokens, headroom, local_computed,
        )
        if new_blocks is not None:
            if first:
                self.live_requests[rid] = request
            if not delay_caching:
                coordinator.cache_blocks(request, total_computed + num_new_tokens)
        return new_blocks

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
        for started in self._step_started:
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
        if live is None:
            for before in self._before_free:
                before(request, None)
            return
        if live is not request and type(request) is not str:
            validation.check_free(self, request)
        for before in self._before_free:
            before(request, live)
        del self.live_requests[rid]
        self.coordinator.free(rid)
