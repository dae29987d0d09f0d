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

from pagedkv.core import (
    facade_allocation,
    facade_events,
    facade_frees,
    facade_lookups,
    facade_queries,
    fast_paths,
    validation,
)
from pagedkv.core.components import EventPublisher, Hooks, ManagerComponent
from pagedkv.core.config import CacheConfig
from pagedkv.core.coordinator import ComputedBlocks
from pagedkv.core.factory import build_parts
from pagedkv.core.hashing import HashExtras
from pagedkv.core.held_blocks import BlockCopies, BlockCopy, HeldBlocks
from pagedkv.core.metrics import HitRateWindow, LookupCounters
from pagedkv.core.request import Request, RequestLike
from pagedkv.core.specs import KVCacheSpec
from pagedkv.errors import (
    ConfigError,
    InvalidArgumentError,
)

__all__ = ["BlockCopies", "BlockCopy", "ComputedBlocks", "KVCacheManager"]

_C = TypeVar("_C", bound=ManagerComponent)


class KVCacheManager:
    """Block tables, prefix caching and events for every KV-cache group of one model.

    Not thread-safe: one scheduler thread calls it. Every per-request operation costs
    O(blocks it touches), independent of the pool size; every method leaves state
    unchanged when it raises. The façade names no feature: features attach as
    components (``CacheConfig.components`` and the config's shortcut fields;
    :mod:`pagedkv.core.components`) and are reached, typed, by
    ``mgr.component(Kind)`` (or :meth:`find_component`). Each component is also an
    attribute named by its ``name``; the shortcut fields' (``mgr.retention``,
    ``mgr.observe``, ``mgr.host``, ``None`` when absent; see
    :meth:`CacheConfig.shortcut_attributes`) are kept for callers, untyped.
    """

    # Shortcuts kept for callers (many use them): the components of the config's shortcut
    # fields, as attributes (None when absent). Declared for the type checker only; the
    # façade sets them from CacheConfig.shortcut_attributes(), naming no feature itself.
    # Typed code uses mgr.component(Kind).
    retention: Any
    observe: Any
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
        # Each component is reachable as the attribute its name gives (the config's
        # shortcut attributes are None when their component is absent).
        for name in config.shortcut_attributes():
            setattr(self, name, None)
        for c in self.components:
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
        else:
            self._install_fast()
        self.publisher: EventPublisher | None = None
        if config.kv_events is not None:
            self.publisher = config.kv_events.make_publisher(self.prefix_index_snapshot)
        for c in self.components:
            c.bind(self)

    def _install_fast(self) -> None:
        """Put the compiled core's entries (:mod:`pagedkv.core.fast_paths`) in front of
        ``allocate_slots`` and ``cache_blocks``, and of ``get_computed_blocks`` and ``free``
        where no component hooks them and the layout lets them run in C."""
        hooks = self._hooks
        fast = fast_paths.install(
            self, facade_allocation.allocate_slots, facade_allocation.cache_blocks,
            lookup_function=None if hooks.after_lookup else facade_lookups.get_computed_blocks,
            free_function=None if hooks.before_free else facade_frees.free)
        self._fast_allocate = fast is not None
        if fast is None:
            return
        # The compiled core takes a running request's plain calls.
        self.allocate_slots = fast  # type: ignore[method-assign]
        self.cache_blocks = fast.cache_blocks  # type: ignore[method-assign]
        if getattr(fast, "takes_lookups", False):
            self.get_computed_blocks = fast.get_computed_blocks  # type: ignore[method-assign]
        if getattr(fast, "takes_frees", False):
            self.free = fast.free  # type: ignore[method-assign]

    #: The attributes the compiled entries rebind (rebuilt on copy and pickle, not copied).
    _FAST_ENTRIES = ("allocate_slots", "cache_blocks", "get_computed_blocks", "free")

    def __getstate__(self) -> dict[str, Any]:
        """Copy and pickle state: the compiled entries are built again, not copied."""
        state = dict(self.__dict__)
        if self._fast_allocate:
            fast = state["allocate_slots"]
            for name in self._FAST_ENTRIES:
                entry = state.get(name)
                if entry is fast or getattr(entry, "__self__", None) is fast:
                    del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._fast_allocate:
            self._install_fast()

    def component(self, kind: type[_C]) -> _C:
        """The attached component of class ``kind``: the typed way to a feature, e.g.
        ``mgr.component(RetentionControl).pin_prefix(...)``.

        Raises:
            ConfigError: no component of that class is attached; the message says how to
                attach one.
        """
        found = self.find_component(kind)
        if found is None:
            raise ConfigError(
                f"this manager has no {kind.__name__} component; attach it through "
                "CacheConfig (its components= field, or the feature's own field)")
        return found

    def find_component(self, kind: type[_C]) -> _C | None:
        """The attached component of class ``kind``, or ``None``. O(components)."""
        for c in self.components:
            if isinstance(c, kind):
                return c
        return None

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
        # The common call passes every check's first test (an exact non-empty str id not
        # live, a list or tuple prompt that fits, exact HashExtras or none, no hashes and
        # no retention): the Request at once. Any other call: the checks, then the same.
        kind = type(prompt_token_ids)
        if (type(request_id) is str and request_id and block_hashes is None
                and retention is None and (kind is list or kind is tuple)
                and request_id not in self.live_requests
                and len(prompt_token_ids) <= self.max_model_len
                and (hash_extras is None or type(hash_extras) is HashExtras)):
            return Request(request_id, prompt_token_ids, hasher=self.hasher,
                           hash_extras=hash_extras)
        validation.check_new_request(self, request_id, prompt_token_ids, block_hashes,
                                     hash_extras)
        if retention is not None:
            validation.check_request_retention(request_id, retention)
        return Request(request_id, prompt_token_ids, hasher=self.hasher,
                       block_hashes=block_hashes, hash_extras=hash_extras,
                       retention=retention)




































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

    # ---------------------------------------------------------------- the façade's calls
    # Each is a function taking the manager, in the module of its concern (documented
    # there); the class holds it as a method.

    # lookups (pagedkv.core.facade_lookups)
    get_computed_blocks = facade_lookups.get_computed_blocks
    _lookup_with_components = facade_lookups.lookup_with_components
    lookup_prefix = facade_lookups.lookup_prefix
    _lookup_limit = facade_lookups.lookup_limit
    lookup_prefix_per_group = facade_lookups.lookup_prefix_per_group
    record_lookup = facade_lookups.record_lookup
    _count_lookup = facade_lookups.count_lookup
    estimate_cached_tokens = facade_lookups.estimate_cached_tokens
    truncate_computed_blocks = facade_lookups.truncate_computed_blocks
    get_cached_block = facade_lookups.get_cached_block

    # allocation (pagedkv.core.facade_allocation)
    allocate_slots = facade_allocation.allocate_slots
    _allocate_with_components = facade_allocation.allocate_with_components
    cache_blocks = facade_allocation.cache_blocks

    # frees, preemption, steps, cache control (pagedkv.core.facade_frees)
    new_step_starts = facade_frees.new_step_starts
    free = facade_frees.free
    pop_blocks_for_free = facade_frees.pop_blocks_for_free
    release_blocks = facade_frees.release_blocks
    take_block_copies = facade_frees.take_block_copies
    take_boundary_state_offloads = facade_frees.take_boundary_state_offloads
    finalize_partial_tail_offloads = facade_frees.finalize_partial_tail_offloads
    take_new_block_ids = facade_frees.take_new_block_ids
    record_blocks_for_zeroing = facade_frees.record_blocks_for_zeroing
    reset_prefix_cache = facade_frees.reset_prefix_cache
    evict_blocks = facade_frees.evict_blocks

    # queries and checks (pagedkv.core.facade_queries)
    get_block_ids = facade_queries.get_block_ids
    get_block_ids_for_computed_tokens = facade_queries.get_block_ids_for_computed_tokens
    get_num_cached_blocks = facade_queries.get_num_cached_blocks
    get_num_common_prefix_blocks = facade_queries.get_num_common_prefix_blocks
    remove_skipped_blocks = facade_queries.remove_skipped_blocks
    block_info = facade_queries.block_info
    has_request = facade_queries.has_request
    require_live = facade_queries.require_live
    make_prefix_cache_stats = facade_queries.make_prefix_cache_stats
    debug_state = facade_queries.debug_state
    check_invariants = facade_queries.check_invariants

    # events (pagedkv.core.facade_events)
    take_events = facade_events.take_events
    publish_events = facade_events.publish_events
    close = facade_events.close
    prefix_index_snapshot = facade_events.prefix_index_snapshot
