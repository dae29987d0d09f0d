"""Building a manager's parts from a :class:`~pagedkv.core.config.CacheConfig`, in one place.

Order (each step needs the ones before it, nothing writes into a part afterwards):

1. the event recorder for the config (null, buffer, or lookahead buffer);
2. every component spec's ``attach``, in ``config.component_specs()`` order (the config's
   shortcut fields, then ``config.components``): each may wrap the recorder, add pool listeners, or
   set the eviction policy (:mod:`pagedkv.core.components`);
3. the pool with that recorder, policy and listeners;
4. the hasher, one manager per group (:func:`~pagedkv.core.managers.manager_class_for`,
   partial-hit and lookahead variants), the coordinator
   (:func:`~pagedkv.core.coordinator.make_coordinator`) with its zeroing and admission
   caps.

>>> from pagedkv.core.specs import FullAttentionSpec, SlidingWindowSpec
>>> full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
>>> swa = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2,
...                         sliding_window=1024)
>>> parts = build_parts(CacheConfig(groups=(full, swa), num_blocks=64, max_model_len=4096))
>>> type(parts.coordinator).__name__, [type(m).__name__ for m in parts.managers]
('HybridCoordinator', ['FullAttentionManager', 'SlidingWindowManager'])
>>> parts.coordinator.admission_cap_blocks  # SWA: window + max_model_len in flight, blocks
[None, 257]
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.core.components import ManagerBuild, ManagerComponent
from pagedkv.core.config import CacheConfig
from pagedkv.core.coordinator import Coordinator, make_coordinator
from pagedkv.core.hashing import BlockHasher
from pagedkv.core.hashing_lookahead import (
    LookaheadBlockHasher,
    LookaheadEventBuffer,
    apply_to_managers,
)
from pagedkv.core.managers import SingleTypeManager, manager_class_for
from pagedkv.core.managers.boundary_states import BoundaryStateOffloads
from pagedkv.core.partial_hits import partial_hits_enabled
from pagedkv.core.pool import BlockPool
from pagedkv.core.recorder import EventBuffer, EventRecorder, GroupInfo

__all__ = ["ManagerParts", "build_parts"]


@dataclass(frozen=True, slots=True)
class ManagerParts:
    """Everything a façade holds, built and wired."""

    pool: BlockPool
    hasher: BlockHasher
    managers: list[SingleTypeManager]
    coordinator: Coordinator
    partial_hits: bool
    components: tuple[ManagerComponent, ...]


def _recorder(config: CacheConfig, groups: list[GroupInfo], hash_bs: int) -> EventRecorder:
    if not config.events_on:
        return EventRecorder()
    if config.num_hash_lookahead_tokens:
        return LookaheadEventBuffer(groups, hash_bs, config.num_hash_lookahead_tokens)
    return EventBuffer(groups, hash_bs)


def build_parts(config: CacheConfig) -> ManagerParts:
    """The parts of a façade for ``config`` (module docstring). O(num_blocks)."""
    specs = list(config.groups)
    hash_bs = config.hash_block_size or min(s.block_size for s in specs)
    groups = [GroupInfo(s.block_size, s.event_kind, s.event_sliding_window) for s in specs]
    build = ManagerBuild(config, groups, hash_bs, _recorder(config, groups, hash_bs))
    components = tuple(spec.attach(build) for spec in config.component_specs())
    pool = BlockPool(config.num_blocks, enable_caching=config.enable_caching,
                     hash_block_size=hash_bs, groups=groups, recorder=build.recorder,
                     policy=build.policy, listeners=build.listeners)
    lookahead = config.num_hash_lookahead_tokens
    hasher: BlockHasher
    if lookahead:
        hasher = LookaheadBlockHasher(hash_bs, lookahead_tokens=lookahead,
                                      algo=config.hash_algo, secret_seed=config.secret_seed,
                                      memo_blocks=config.hash_memo_blocks)
    else:
        hasher = BlockHasher(hash_bs, algo=config.hash_algo, secret_seed=config.secret_seed,
                             memo_blocks=config.hash_memo_blocks)
    classes = [manager_class_for(s, enable_caching=config.enable_caching) for s in specs]
    partial = config.enable_caching and partial_hits_enabled(
        specs, classes, hash_bs, drop_last_hit=config.drop_last_hit)
    if partial:
        classes = [c.partial_hit_class or c for c in classes]
    managers: list[SingleTypeManager] = [
        cls(s, pool, g, drop_last_hit=config.drop_last_hit)
        for g, (cls, s) in enumerate(zip(classes, specs, strict=True))
    ]
    if lookahead:
        apply_to_managers(managers, lookahead)
    if config.vllm_release == "0.32":
        for m in managers:
            m.keep_null_head = True
    if config.record_boundary_states:
        for m in managers:
            if m.records_boundary_states:
                m.offloads = BoundaryStateOffloads(m.group)
    zero = config.zero_new_blocks
    if zero is None:
        zero = any(s.zeroes_kv_by_default for s in specs)
    coordinator = make_coordinator(
        managers, pool, enable_caching=config.enable_caching, partial_hits=partial,
        zeroing=[zero and s.zeroable for s in specs],
        max_model_len=config.max_model_len,
        max_in_flight_tokens=config.max_in_flight_tokens or config.max_model_len,
        num_reprefillable_tokens=max(0, config.num_prefill_lookahead_tokens - 1))
    return ManagerParts(pool, hasher, managers, coordinator, partial, components)
