"""The compiled core's per-step entry point: ``allocate_slots`` for a running request in C.

An engine calls :meth:`pagedkv.KVCacheManager.allocate_slots` once per running request per
scheduler step, most often as ``allocate_slots(request, 1)`` for a decode token. On a
manager where that call can only take the plain path — one full-attention group with
prefix caching on (:class:`~pagedkv.core.coordinator_simple.UnitaryCoordinator`), no
component hooking the allocation, one hash block per block — :func:`install` puts the
compiled core's ``DecodeAllocate`` (``pagedkv/_csrc/ccore_fast.h``) in front of the
method, as the manager's own ``allocate_slots`` attribute. It takes the calls with
exactly two positional arguments from a request this manager already holds, with counts
that are plain ints in range, and optionally an engine's counting as keywords
(``num_in_flight_tokens``, an int in ``[0, num_computed_tokens]``; ``lenient_counts``, a
bool: new tokens may run past the request's, blocks register only as far as the request
has tokens and block hashes — vLLM 0.33's async scheduling), and does what the Python
method does on them: grow the table (the pool's ``get_new_blocks``), register the blocks
that became full (the coordinator's ``cache_blocks``), or return ``None`` when the pool
is short. It also takes a request's first call — ``allocate_slots(request, n)`` or with
``new_computed_blocks=hit`` as :meth:`~pagedkv.KVCacheManager.get_computed_blocks` issued
it, unchanged since (``pagedkv/_csrc/ccore_admit.h``) — when the group takes blocks by
:class:`~pagedkv.core.managers.base.SingleTypeManager`'s own rules and the pool has no
eviction policy or listener: the capacity check with the watermark, the hit's claim, the
new table, new blocks and registration (without a Python call when the pool's recorder
hears nothing: ``pagedkv/_csrc/ccore_lookup.h``). On the same managers it stands in for
``get_computed_blocks`` and ``free`` too (``takes_lookups``, ``takes_frees``), unless a
component hooks them. Every other
call, before anything changes, goes to the Python method, which validates it and raises
the documented errors. So both cores give the same results, the same state and the same
errors; the pure core (``PAGEDKV_PURE=1``) never installs it. The same object's
``cache_blocks`` method stands in for the manager's ``cache_blocks`` (vLLM's async
scheduler calls it for every running request every step): the checks and the "did a
block become full" test in C.

Every other coordinator that runs :class:`~pagedkv.core.coordinator_base.Coordinator`'s
own allocation and registration (several groups, sliding window, chunked local, Mamba,
mixed block sizes) gets ``GroupsAllocate`` (``pagedkv/_csrc/ccore_groups.h``) instead: the
same contract for a running request's step with any of the façade's keywords a running
request's step carries, with the windows' and Mamba align's release, every group's
capacity check and growth (Mamba align's too), zeroing and registration in C (through the
index's kernel where a group registers by the base rule:
:func:`~pagedkv.core.group_allocation.compiled_registration`), and a new request's
plain first call (its hit, the full-sequence gate, every group's admission:
``pagedkv/_csrc/ccore_hybrid_first.h``) (docs/architecture.md "Compiled kernels"). It
calls the pool through ``PoolOps`` (its take, touch and free in C,
``ccore_pool_ops.h``), tells an exact :class:`EventBuffer` of a registered run through
``BufferStored`` (``ccore_buffer_stored.h``) and, when no component hooks the free and
the coordinator frees by its plan, is the manager's ``free`` too
(``ccore_groups_free.h``). Which of the three ``allocate_slots`` a manager has is decided
here, once, at construction.

>>> from pagedkv import FullAttentionSpec, KVCacheManager, Request
>>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
>>> mgr = KVCacheManager.from_spec(spec, num_blocks=8, max_model_len=64)
>>> req = Request("r", [1, 2, 3], hasher=mgr.hasher)
>>> mgr.allocate_slots(req, 3)          # first call: compiled too, if compiled
([1],)
>>> req.num_computed_tokens = 3
>>> req.append_output_tokens(4)
>>> mgr.allocate_slots(req, 1)          # a running request: the fast path, if compiled
([],)
>>> req.num_computed_tokens = 4         # one token in flight, counted as computed
>>> mgr.allocate_slots(req, 1, num_in_flight_tokens=1, lenient_counts=True)
([2],)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from pagedkv.core import native
from pagedkv.core.coordinator_base import ComputedBlocks, Coordinator
from pagedkv.core.coordinator_simple import UnitaryCoordinator
from pagedkv.core.group_allocation import compiled_registration
from pagedkv.core.hashing import event_extra_keys
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.managers.chunked_local import ChunkedLocalManager
from pagedkv.core.managers.full import FullAttentionManager
from pagedkv.core.managers.mamba import MambaAlignManager
from pagedkv.core.managers.sliding_window import SlidingWindowManager
from pagedkv.core.metrics import HitRateWindow, LookupCounters
from pagedkv.core.pool import BlockPool
from pagedkv.core.prefix_index import PrefixIndex
from pagedkv.core.recorder import EventBuffer, EventRecorder
from pagedkv.core.records import MEDIUM_GPU, BlockStored
from pagedkv.core.request import Request

#: ``GroupsAllocate``'s kinds (``pagedkv/_csrc/ccore_groups.h``): how a group grows (its
#: table by ``ceil(tokens / block_size)`` in C, or through its manager's methods) and how
#: it drops blocks (none, a sliding window or a chunk in C, or its manager's method);
#: a Mamba align group's growth and release in C (``*_STATE``, ccore_hybrid_step.h).
GROW_PLAIN, GROW_METHOD, GROW_STATE = 0, 1, 2
DROP_NONE, DROP_WINDOW, DROP_CHUNK, DROP_METHOD, DROP_STATE = 0, 1, 2, 3, 4

__all__ = ["install"]


def install(mgr: Any, function: Callable[..., Any],
            cache_function: Callable[..., Any] | None = None,
            lookup_function: Callable[..., Any] | None = None,
            free_function: Callable[..., Any] | None = None) -> Any:
    """The compiled ``allocate_slots`` for ``mgr`` (a :class:`pagedkv.KVCacheManager`, built
    up to its components), or ``None`` when the compiled core is not in use or ``mgr`` has
    anything the fast path does not cover. Every call it does not take goes to
    ``function(mgr, ...)`` (the class's Python method). With ``cache_function`` (the
    class's ``cache_blocks``) its ``cache_blocks`` attribute is the compiled
    ``cache_blocks``: a held request's call with a plain count, within its slots, is
    checked in C and reaches the coordinator only when a block became full; every other
    call goes to ``cache_function(mgr, ...)``. It holds ``mgr`` by a weak reference, so
    the manager's attributes make no reference cycle.

    On one full-attention group, with ``lookup_function`` (the class's
    ``get_computed_blocks``, given when no component hooks the lookup) its
    ``get_computed_blocks`` takes a pagedkv Request's lookup in C when the group finds hits
    by full attention's own rule (``takes_lookups``), and with ``free_function`` (the
    class's ``free``, given when no component hooks the free) its ``free`` frees in C when
    the group and coordinator free by the base rule (``takes_frees``); on a plain pool a
    first call's take and registration run without Python calls when the pool's recorder
    hears nothing and registers by the index's own rule (``pagedkv/_csrc/ccore_lookup.h``).
    Every call these do not cover goes to the Python function."""
    ccore = native.active()
    coordinator = mgr.coordinator
    if ccore is None:
        return None
    if type(coordinator) is not UnitaryCoordinator:
        return _install_groups(ccore, mgr, function, cache_function, free_function,
                               lookup_function)
    m = coordinator.managers[0]
    if (m.drops_blocks or not m.grows_plainly or not m.cacheable
            or not m.registers_whole_blocks_only() or m.caps_registration_itself
            or m.hash_lookahead_tokens or coordinator.cache_alignment_tokens != 1):
        return _install_groups(ccore, mgr, function, cache_function, free_function,
                               lookup_function)
    fast: Callable[..., Any] = ccore.DecodeAllocate(
        function=function, manager=mgr, live_requests=mgr.live_requests, tables=m.req_to_blocks,
        num_cached=m.num_cached_blocks, pool=coordinator.pool,
        cache_blocks=coordinator.cache_blocks, zeroing=coordinator.zeroing,
        request_type=Request, block_size=m.block_size, max_model_len=mgr.max_model_len,
        hash_block_size=coordinator.pool.hash_block_size, cache_function=cache_function,
        hit_type=ComputedBlocks if _admits_plainly(m) else None,
        lookup_function=lookup_function if _looks_up_plainly(m) else None,
        free_function=free_function if _frees_plainly(coordinator, m) else None,
        group=m.group, null_recorder=EventRecorder,
        fast_register=_registers_plainly(coordinator, m))
    return fast


def _looks_up_plainly(m: SingleTypeManager) -> bool:
    """Whether ``m`` finds hits by full attention's own rule over its own hashes (one
    hash block per block, the last hit kept), so the lookup may run in C."""
    return (type(m).find_longest_cache_hit is FullAttentionManager.find_longest_cache_hit
            and not m.drop_last_hit and m.hash_stride == 1
            and ComputedBlocks._fields == _HIT_FIELDS and _admits_plainly(m))


def _frees_plainly(coordinator: Any, m: SingleTypeManager) -> bool:
    """Whether the coordinator and ``m`` free by the base rule (table and count dropped,
    blocks freed last first), so the free may run in C."""
    return (type(coordinator).free is Coordinator.free
            and type(m).free is SingleTypeManager.free)


def _registers_plainly(coordinator: Any, m: SingleTypeManager) -> bool:
    """Whether a first call's registration is the index's own loop with nothing around
    it (the coordinator's and the group's rules as written, every position reachable, one
    hash block per block), so it may run in C when the recorder hears nothing."""
    kind = type(m)
    return (_admits_plainly(m) and m.hash_stride == 1
            and getattr(coordinator.cache_blocks, "__func__", None) is Coordinator.cache_blocks
            and not coordinator.num_reprefillable_tokens and not coordinator._capped_at_hashes
            and kind.cache_blocks in (FullAttentionManager.cache_blocks,
                                      SingleTypeManager.cache_blocks)
            and kind.reachable_mask is SingleTypeManager.reachable_mask
            and type(coordinator.pool.prefix).cache_full_blocks is PrefixIndex.cache_full_blocks
            and coordinator.pool.cache_full_blocks == coordinator.pool.prefix.cache_full_blocks
            and type(coordinator.pool).get_new_blocks is BlockPool.get_new_blocks)


#: ComputedBlocks' fields in the order the compiled lookup builds them (ccore_admit.h).
_HIT_FIELDS = ("block_ids", "num_computed_tokens", "issuer", "request_id", "generation",
               "fingerprint", "group_tokens")


#: The group's methods a request's first allocation runs (UnitaryCoordinator.allocate's
#: general branch); the compiled admission (``ccore_admit.h``) does what these bases do.
_ADMISSION_STEPS = ("get_num_blocks_to_allocate", "slots_needed", "claimed_hit_blocks",
                    "save_new_computed_blocks", "allocate_new_blocks")


def _admits_plainly(m: SingleTypeManager) -> bool:
    """Whether ``m`` takes a new request's blocks by :class:`SingleTypeManager`'s own
    rules, so ``DecodeAllocate`` may take first calls too (with or without a hit)."""
    kind = type(m)
    return all(getattr(kind, name) is getattr(SingleTypeManager, name)
               for name in _ADMISSION_STEPS)


def _group_kinds(m: SingleTypeManager) -> tuple[Any, ...]:
    """``GroupsAllocate``'s entry for group ``m``: grow kind, drop kind, whether it ignores
    lookahead, block size, window or chunk tokens, the manager, its tables (and a Mamba
    align group's containers: :func:`_state_kinds`)."""
    drop, tokens = DROP_NONE, 0
    if m.drops_blocks:
        rule = type(m).remove_skipped_blocks
        if rule is SlidingWindowManager.remove_skipped_blocks:
            drop, tokens = DROP_WINDOW, m.sliding_window  # type: ignore[attr-defined]
        elif rule is ChunkedLocalManager.remove_skipped_blocks:
            drop, tokens = DROP_CHUNK, m.attention_chunk_size  # type: ignore[attr-defined]
        else:
            drop = DROP_METHOD
    grow = GROW_PLAIN if m.grows_plainly else GROW_METHOD
    if isinstance(m, MambaAlignManager):
        return _state_kinds(m, grow, drop)
    return (grow, drop, int(m.ignores_lookahead), m.block_size, tokens, m, m.req_to_blocks)


def _state_kinds(m: MambaAlignManager, grow: int, drop: int) -> tuple[Any, ...]:
    """A Mamba align group's entry: growth and release in C where its class keeps the
    align rules (kernels_hybrid_step), with the containers they mutate."""
    kind = type(m)
    if (kind.remove_skipped_blocks is MambaAlignManager.remove_skipped_blocks
            and m.drops_blocks):
        drop = DROP_STATE
    if (kind.allocate_new_blocks is MambaAlignManager.allocate_new_blocks
            and kind.get_num_blocks_to_allocate is MambaAlignManager.get_num_blocks_to_allocate
            and m.ignores_lookahead):
        grow = GROW_STATE
    state = (m._released, m._last_state, m._allocated, m._partial)
    return (grow, drop, int(m.ignores_lookahead), m.block_size, 0, m, m.req_to_blocks, state)


def _install_groups(ccore: Any, mgr: Any, function: Callable[..., Any],
                    cache_function: Callable[..., Any] | None,
                    free_function: Callable[..., Any] | None = None,
                    lookup_function: Callable[..., Any] | None = None) -> Any:
    """The compiled ``allocate_slots`` for a coordinator that runs
    :meth:`Coordinator.allocate` / ``_grow`` / :meth:`Coordinator.cache_blocks` as written
    (several groups, windows, Mamba, mixed block sizes), or ``None``: a coordinator with
    its own allocation (sub-block hits, no prefix caching), re-prefillable tokens or hash
    lookahead (registration capped elsewhere), or no ``cache_function``. With
    ``free_function`` (the class's ``free``, given when no component hooks the free) its
    ``free`` frees in C when the coordinator frees by its plan (:func:`_free_plan`), and
    with ``lookup_function`` (the class's ``get_computed_blocks``, given when no
    component hooks the lookup) its ``get_computed_blocks`` runs the coordinator's compiled
    lookup without the façade's frame (:func:`_lookup_kernel`, ``takes_lookups``)."""
    coordinator = mgr.coordinator
    kind = type(coordinator)
    own_allocate = kind.allocate is not Coordinator.allocate and not (
        kind is UnitaryCoordinator and coordinator.managers[0].grows_plainly)
    if (own_allocate or cache_function is None or kind._grow is not Coordinator._grow
            # the registration in effect, an instance's rebinding (the EAGLE drop's) too
            or getattr(coordinator.cache_blocks, "__func__", None) is not Coordinator.cache_blocks
            or coordinator.num_reprefillable_tokens or coordinator._capped_at_hashes):
        return None
    registrar, registration = compiled_registration(coordinator)
    if registrar is not None and registrar[4] is not None:
        registrar = (*registrar[:4], _stored(ccore, coordinator.pool.prefix.recorder))
    plan = tuple((bs, m, m.req_to_blocks, cached, reg)
                 for (m, bs, cached, _caps), reg in zip(coordinator._cache_plan, registration,
                                                       strict=True))
    fast: Callable[..., Any] = ccore.GroupsAllocate(
        function=function, cache_function=cache_function, manager=mgr,
        live_requests=mgr.live_requests, pool=coordinator.pool, zeroing=coordinator.zeroing,
        new_block_ids=coordinator.new_block_ids, request_type=Request,
        groups=tuple(_group_kinds(m) for m in coordinator.managers), cache_plan=plan,
        max_model_len=mgr.max_model_len, hash_block_size=coordinator.pool.hash_block_size,
        cache_alignment=coordinator.cache_alignment_tokens, registrar=registrar,
        pool_ops=_pool_ops(ccore, coordinator.pool),
        free_function=free_function, free_plan=_free_plan(ccore, coordinator))
    find = _lookup_kernel(ccore, coordinator) if lookup_function is not None else None
    if find is not None:
        fast.set_lookup(ccore.HybridLookup(  # type: ignore[attr-defined]
            function=lookup_function, manager=mgr, request_type=Request, find=find,
            max_model_len=mgr.max_model_len, window_type=HitRateWindow,
            prefix_type=PrefixIndex, counters_type=LookupCounters))
    return fast


def _lookup_kernel(ccore: Any, coordinator: Any) -> Any:
    """The coordinator's lookup kernel when its ``lookup_request`` is the compiled
    ``lookup_request`` over it (``functools.partial``, as the coordinators install it),
    so ``get_computed_blocks`` may run it in C (``pagedkv/_csrc/ccore_hybrid_lookup.h``);
    else None."""
    bound = coordinator.lookup_request
    if (type(bound) is not partial or bound.func is not ccore.lookup_request
            or len(bound.args) != 1 or bound.keywords):
        return None
    return bound.args[0]


def _free_plan(ccore: Any, coordinator: Any) -> list[Any] | None:
    """The coordinator's free plan (``Coordinator.free``'s, which runs the compiled
    ``free_groups`` over it) when its free is the base rule as written, else None (the
    Python free runs)."""
    # (Its bound method's function, not vars(coordinator): reading an instance's __dict__
    # makes CPython keep it as a dict, and every later attribute read slower.)
    if (getattr(coordinator.free, "__func__", None) is not Coordinator.free
            or coordinator._free_groups is not ccore.free_groups):
        return None
    plan: list[Any] | None = coordinator._free_plan
    return plan


def _stored(ccore: Any, recorder: Any) -> Any:
    """The registration's stored call for ``recorder``: ``BufferStored``
    (``pagedkv/_csrc/ccore_buffer_stored.h``, :meth:`EventBuffer.stored`'s steps in C)
    for an exact :class:`EventBuffer`, else the recorder's own ``stored``."""
    if type(recorder) is not EventBuffer:
        return recorder.stored
    return ccore.BufferStored(recorder, BlockStored, MEDIUM_GPU, event_extra_keys)


#: BlockPool's methods the compiled allocation calls on the pool (``PoolOps``).
_POOL_OPS = ("get_new_blocks", "touch", "free_blocks")


def _pool_ops(ccore: Any, pool: BlockPool) -> Any:
    """``PoolOps`` over ``pool`` (``pagedkv/_csrc/ccore_pool_ops.h``: its take, touch and
    free as C methods, the same steps as the Python ones) when the pool's class keeps
    :class:`BlockPool`'s, else ``None`` (the pool's own methods are called)."""
    kind = type(pool)
    if any(getattr(kind, name) is not getattr(BlockPool, name) for name in _POOL_OPS):
        return None
    return ccore.PoolOps(pool)
