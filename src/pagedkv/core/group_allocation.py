"""A coordinator's allocation group by group: the plan of the compiled admission
(:func:`admission_plan`, run by :func:`pagedkv.core.kernels_hybrid.admit_groups`), the
running request's growth (:func:`grow_running`) and the full-sequence gate's count
(:func:`full_sequence_blocks`). Each is called by
:class:`~pagedkv.core.coordinator_base.Coordinator` with itself or its managers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.core.kernels_hybrid import ADMIT_CHUNK, ADMIT_FULL, ADMIT_METHODS, ADMIT_WINDOW
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.managers.chunked_local import ChunkedLocalManager
from pagedkv.core.managers.full import FullAttentionManager
from pagedkv.core.managers.mamba import MambaAlignManager
from pagedkv.core.managers.sliding_window import SlidingWindowManager
from pagedkv.core.prefix_index import PrefixIndex

__all__ = ["ADMIT_MAX_GROUPS", "admission_plan", "full_sequence_blocks", "grow_running"]


#: The methods an admission calls; a manager that rebinds one on itself is left out.
_ADMIT_METHODS = frozenset({"get_num_blocks_to_allocate", "claimed_hit_blocks",
                            "save_new_computed_blocks", "allocate_new_blocks", "slots_needed"})
#: Groups the compiled admission takes at most.
ADMIT_MAX_GROUPS = 64


def _rebound(manager: Any, name: str) -> bool:
    """Whether ``manager`` holds its own ``name``, not its class's method (read through
    ``getattr``: ``vars`` would turn the instance's shared-key attributes into a plain
    dict and slow every attribute read of the manager). No state change."""
    got = getattr(manager, name, None)
    return (getattr(got, "__self__", None) is not manager
            or getattr(got, "__func__", None) is not getattr(type(manager), name, None))


def admission_plan(managers: Sequence[Any]) -> list[tuple[Any, ...]] | None:
    """The :func:`~pagedkv.core.kernels_hybrid.admit_groups` plan for ``managers`` (one
    entry per group), or None when a group sizes by the encoder (cross attention) or
    rebinds an admission method, or there are more than :data:`ADMIT_MAX_GROUPS` groups.
    Full attention, sliding window and chunked local (those exact classes: a subclass may
    change a rule) run by the kernel's own rules, every other kind through its methods.
    No state change."""
    kinds = {FullAttentionManager: ADMIT_FULL, SlidingWindowManager: ADMIT_WINDOW,
             ChunkedLocalManager: ADMIT_CHUNK}
    if len(managers) > ADMIT_MAX_GROUPS:
        return None
    plan: list[tuple[Any, ...]] = []
    for m in managers:
        if any(_rebound(m, name) for name in _ADMIT_METHODS) or (
                type(m).slots_needed is not SingleTypeManager.slots_needed):
            return None
        kind = kinds.get(type(m), ADMIT_METHODS)
        span = (m.sliding_window if kind == ADMIT_WINDOW
                else m.attention_chunk_size if kind == ADMIT_CHUNK else 0)
        plan.append((kind, m, m.req_to_blocks, m.num_cached_blocks, m.block_size, span,
                     bool(m.ignores_lookahead)))
    return plan


def full_sequence_blocks(managers: Sequence[Any], caps: Sequence[int | None],
                         request_id: str, table_hit: Sequence[list[int]],
                         total_computed_tokens: int, num_tokens: int,
                         num_encoder_tokens: int) -> int:
    """The body of :meth:`~pagedkv.core.coordinator_base.Coordinator.num_blocks_for_full_sequence`:
    each group's need for ``num_tokens`` slots, capped at its admission cap ``caps[g]``."""
    n = 0
    for g, m in enumerate(managers):
        slots = num_tokens if m.ignores_lookahead else m.slots_needed(
            num_tokens, num_encoder_tokens)
        cap = caps[g]
        if cap is not None and slots > cap * m.block_size:
            slots = cap * m.block_size
        n += m.get_num_blocks_to_allocate(request_id, slots, table_hit[g],
                                          total_computed_tokens)
    return n


def grow_running(
    coord: Any,
    request_id: str,
    num_tokens: int,
    num_encoder_tokens: int,
    num_tokens_main_model: int | None,
    headroom_blocks: int,
    total_computed_tokens: int,
) -> tuple[list[int], ...] | None:
    """``coord.allocate`` (:class:`~pagedkv.core.coordinator_base.Coordinator`) for a
    request that already holds blocks and adopts no hit (a running request's next chunk
    or decode step, the common call), after the window release: the same capacity check
    and growth.

    NOTE: inlined for speed: in groups whose manager grows plainly (full attention,
    sliding window, chunked local) the table grows to ``ceil(num_tokens /
    block_size)`` blocks right here, without the four per-group method calls of
    ``allocate`` (they would do the same: no hit to claim or save). Other groups
    (Mamba, cross attention, sinks) go through their methods."""
    plan = coord._grow_plan
    main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
    counts: list[int] = []  # plain groups: blocks to add; the others: their slots
    num_needed = 0
    for m, bs, tables in plan:
        if tables is not None:
            n = -(-num_tokens // bs) - len(tables[request_id])
            counts.append(n)
        else:
            slots = main if m.ignores_lookahead else m.slots_needed(
                num_tokens, num_encoder_tokens)
            n = m.get_num_blocks_to_allocate(request_id, slots, [], total_computed_tokens)
            counts.append(slots)
        if n > 0:
            num_needed += n
    pool = coord.pool
    if num_needed + headroom_blocks > pool.free_queue.num_free:
        return None
    out: list[list[int]] = []
    zeroing = coord.zeroing
    for g, (m, _bs, tables) in enumerate(plan):
        if tables is not None:
            n = counts[g]
            if n <= 0:
                out.append([])
                continue
            new = pool.get_new_blocks(n)
            tables[request_id].extend(new)
        else:
            new = m.allocate_new_blocks(request_id, counts[g])
        if zeroing[g] and new:
            coord.new_block_ids[g].extend(b for b in new if b)
        out.append(new)
    return tuple(out)


#: How a caching group registers in the compiled ``GroupsAllocate`` (ccore_groups.h):
#: through its ``cache_blocks``, by :meth:`SingleTypeManager.cache_blocks`'s rule in C, or
#: by :meth:`MambaAlignManager.cache_blocks`'s in C, or by
#: :meth:`FullAttentionManager.cache_blocks`'s over several hash blocks per block (its
#: whole blocks in C, its method when the prompt's tail may need a partial entry).
CACHE_METHOD, CACHE_PLAIN, CACHE_STATE, CACHE_TAIL = 0, 1, 2, 3
#: A sliding window's masked rule (SlidingWindowManager.reachable_mask, its positions
#: left out) through PrefixIndex._register_masked's loop in C.
CACHE_MASKED = 4


def compiled_registration(coord: Any) -> tuple[Any, list[Any]]:
    """What the compiled ``GroupsAllocate`` needs to register a running request's blocks
    without a Python call (the recorder's ``stored`` aside): ``(registrar, entries)``.
    ``registrar``: (the prefix index, whose ``_index_register`` kernel it calls,
    ``block_hash``, ``block_group``, the rehash eviction, the recorder's ``stored`` or
    None when it hears nothing). Per entry of ``coord._cache_plan``: ``(kind, stride,
    group, index, duplicates, registered, counts, drop_last_hit)``, or None (its
    ``cache_blocks`` runs). ``(None, [None, ...])`` when the pool registers by rules of
    its own (an eviction policy, another index). No state change."""
    pool = coord.pool
    prefix = getattr(pool, "prefix", None)
    plan = coord._cache_plan
    if (not isinstance(prefix, PrefixIndex)
            or type(prefix).cache_full_blocks is not PrefixIndex.cache_full_blocks
            or pool.cache_full_blocks != prefix.cache_full_blocks
            or prefix.policy is not None):
        return None, [None] * len(plan)
    recorder = prefix.recorder
    registrar = (prefix, prefix.block_hash, prefix.block_group,
                 prefix._evict_rehashed, recorder.stored if recorder.hears_stored else None)
    return registrar, [_registration(m, cached, prefix) for m, _bs, cached, _caps in plan]


def _registration(m: SingleTypeManager, cached: Any, prefix: PrefixIndex) -> Any:
    """Group ``m``'s registration entry (:func:`compiled_registration`), or None."""
    kind = type(m)
    # A sliding window's mask is None for every range once its run covers a segment of
    # the hit alignment (SlidingWindowManager.reachable_mask): it registers every block.
    every_block = kind.reachable_mask is SingleTypeManager.reachable_mask or (
        kind.reachable_mask is SlidingWindowManager.reachable_mask
        and m.reachable_mask(0, 1) is None)
    if not every_block:
        return _masked_registration(m, cached, prefix)
    rule = kind.cache_blocks
    registered: set[bytes] = set()
    if rule is FullAttentionManager.cache_blocks and m.hash_stride > 1:
        how = CACHE_TAIL
    elif cached is None:
        return None
    elif rule is SingleTypeManager.cache_blocks or (
            rule is FullAttentionManager.cache_blocks and m.hash_stride == 1):
        how = CACHE_PLAIN
    elif rule is MambaAlignManager.cache_blocks and isinstance(m, MambaAlignManager):
        how, registered = CACHE_STATE, m._registered_this_step
    else:
        return None
    stride = prefix.groups[m.group].block_size // prefix.hash_block_size
    return (how, stride, m.group, prefix.index[m.group], prefix.duplicates[m.group],
            registered, m.num_cached_blocks, m.drop_last_hit)


def _masked_registration(m: SingleTypeManager, cached: Any, prefix: PrefixIndex) -> Any:
    """A sliding window group's entry when its mask leaves positions out and it registers
    by the base rule through the index's own masked loop: ``CACHE_MASKED`` with the
    mask's ``(per_segment, first, shift)`` (SlidingWindowManager.reachable_mask: position
    ``i`` registered iff ``i >= shift`` and ``(i - shift) % per_segment >= first``), or
    None (its ``cache_blocks`` runs)."""
    kind = type(m)
    if (not isinstance(m, SlidingWindowManager) or cached is None
            or kind.reachable_mask is not SlidingWindowManager.reachable_mask
            or kind.cache_blocks is not SingleTypeManager.cache_blocks
            or type(prefix)._register_masked is not PrefixIndex._register_masked):
        return None
    per_segment = m.hit_alignment_tokens // m.block_size
    first = per_segment - m.num_run_blocks
    stride = prefix.groups[m.group].block_size // prefix.hash_block_size
    return (CACHE_MASKED, stride, m.group, prefix.index[m.group], prefix.duplicates[m.group],
            set(), m.num_cached_blocks, m.drop_last_hit, per_segment, first,
            int(m.drop_last_hit))


def free_plan(managers: Sequence[SingleTypeManager]) -> list[Any] | None:
    """The :func:`~pagedkv.core.kernels_hybrid_step.free_groups` plan of ``managers``:
    per group its tables, counts and the per-request containers its free forgets; None
    when a group frees by rules of its own (then each group's ``free`` runs). Read once,
    at construction (a Mamba group's boundary-state offloads are set before). No state
    change."""
    plan: list[Any] = []
    for m in managers:
        rule = type(m).free
        if rule is SingleTypeManager.free:
            plan.append((m.req_to_blocks, m.num_cached_blocks, (), ()))
        elif (rule is MambaAlignManager.free and isinstance(m, MambaAlignManager)
              and m.offloads is None
              and type(m)._forget is MambaAlignManager._forget):
            plan.append((m.req_to_blocks, m.num_cached_blocks,
                         (m._last_state, m._released, m._partial), (m._allocated,)))
        else:
            return None
    return plan
