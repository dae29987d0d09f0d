"""Reading block statuses for miss attribution: one group's missing blocks (evicted,
isolated, never seen), and the per-group detail of an explanation built from them.
:class:`pagedkv.observe.attribution.Explainer` builds on :class:`ExplainerBase`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from pagedkv.core.coordinator import (
    HybridCoordinator,
    NoPrefixCacheCoordinator,
    PartialHitCoordinator,
)
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.request import RequestLike
from pagedkv.observe.ghost import GhostRecorder
from pagedkv.observe.reasons import (
    BlockRun,
    ClampCause,
    EvictionRecord,
    GroupExplanation,
    LookupExplanation,
    Reason,
    Segment,
)

if TYPE_CHECKING:
    from pagedkv.core.manager import KVCacheManager

__all__ = ["ExplainerBase", "clamp_cause_for"]

_NEVER_SEEN = Reason.NEVER_SEEN
#: Builds a Segment from a 6-tuple (skips the named tuple's Python-level __new__: several
#: are built per lookup).
_seg = partial(tuple.__new__, Segment)
_HIT = Reason.HIT
_PARTIAL = Reason.PARTIAL_BLOCK

#: (reason, group, cause, eviction): what one position is labelled with while painting.
_Label = tuple[Reason, "int | None", "ClampCause | None", "EvictionRecord | None"]
#: One group's detail as read from the pool: (group, limit, hit ids, scanned runs).
_Status = tuple[int, int, tuple[int, ...], list[tuple[int, int, "_Label | None"]]]
#: Per-table hit block ids and the hit length, as the coordinator returns them.
Found = tuple[tuple[list[int], ...], int]


#: A kind's ``hit_shape`` -> why a group of it shortens a hit (others: GROUP_MISS).
_CAUSE_OF_SHAPE = {
    "window": ClampCause.WINDOW_RUN_NOT_FOUND,
    "chunk": ClampCause.CHUNK_RUN_NOT_FOUND,
    "state": ClampCause.NO_MAMBA_STATE,
    "never": ClampCause.NOT_CACHEABLE,
}


def clamp_cause_for(manager: SingleTypeManager) -> ClampCause:
    """Why a group of this manager's kind shortens a hit (read from its ``hit_shape``)."""
    return _CAUSE_OF_SHAPE.get(manager.hit_shape, ClampCause.GROUP_MISS)


class ExplainerBase:
    """What every explanation reads: the manager's groups and pool, the ghost record; a
    group's block statuses (:meth:`_scan`) and the per-group detail built from them."""

    def __init__(self, manager: KVCacheManager, ghost: GhostRecorder) -> None:
        self.coordinator = coord = manager.coordinator
        self.pool = manager.pool
        self.ghost = ghost
        self.managers = coord.managers
        self.caching_off = isinstance(coord, NoPrefixCacheCoordinator)
        self.hybrid = coord if isinstance(coord, HybridCoordinator) else None
        #: Hits may end inside a block (sub-block hits): the hit is the coordinator's.
        self.partial_hits = isinstance(coord, PartialHitCoordinator)
        self.hash_block_size = manager.pool.hash_block_size
        self.full_groups = [g for g, m in enumerate(self.managers) if m.prefix_closed_hits]
        self.causes = [clamp_cause_for(m) for m in self.managers]
        self.kinds = [m.spec.kind for m in self.managers]
        self.any_drop = any(m.drop_last_hit for m in self.managers)
        self.unitary_full = bool(self.full_groups) and self.hybrid is None
        self.hybrid_lcm = self.hybrid.lcm_block_size if self.hybrid is not None else 1
        self.strides = [m.hash_stride for m in self.managers]
        self.group_ids = range(len(self.managers))
        self.never_labels: list[_Label] = [(Reason.NEVER_SEEN, g, None, None)
                                           for g in self.group_ids]
        # (a group that does not join lookups, SWA-MLA with bounded replay, never limits)
        self.other_groups = [g for g, m in enumerate(self.managers)
                             if g not in self.full_groups and m.joins_lookup]
        #: What a group that shortens the replayed hit is charged with.
        self.replay_labels: list[_Label] = [
            (Reason.HIT_CAP, None, None, None) if g in self.full_groups
            else (Reason.CLAMPED, g, self.causes[g], None) for g in range(len(self.managers))]
        self.never_group = next((g for g, m in enumerate(self.managers)
                                 if not m.cacheable and m.joins_lookup), None)

    # ------------------------------------------------------------------ entry point

    def _scan(
        self, request: RequestLike, group: int, first: int, limit: int, *, inherit: bool
    ) -> list[tuple[int, int, _Label | None]]:
        """Runs ``(start, end, label)`` of ``group``'s block positions ``[first, limit)``
        by their own status; ``None``: cached before any missing block. With ``inherit``
        a cached block after a missing one takes that block's label. A run's label is
        its first block's (an evicted run: the first eviction)."""
        if first >= limit:
            return []
        k = self.strides[group]
        gh = request.block_hashes if k == 1 else request.block_hashes[k - 1 :: k]
        get = self.pool.index[group].get
        ghost = self.ghost.ghost
        runs: list[tuple[int, int, _Label | None]] = []
        shadow: list[bytes] | None = None
        # Without extra keys of its own and with no request with extra keys registered
        # (empty shadow index), nothing can be cached under other keys.
        isolable = request.hash_extras is not None or bool(self.ghost.shadow_index)
        evicted = Reason.EVICTED
        prev_miss: Reason | None = None
        cur: Reason | bool | None = False  # the current run's reason (False: none yet)
        cur_label: _Label | None = None
        cur_start = first
        record = None
        for i in range(first, limit):
            h = gh[i]
            if get(h) is not None:
                reason = prev_miss if inherit else None
            else:
                record = ghost.get((group, h)) if ghost else None
                if record is not None:
                    reason = evicted
                else:
                    if isolable and shadow is None:
                        shadow = self.managers[group].group_hashes(
                            self.ghost.shadow_hashes_readonly(request))
                    if shadow is not None and self._isolated(
                            group, h, shadow[i] if i < len(shadow) else h):
                        reason = Reason.ISOLATED
                    else:
                        # Chained hashes are registered in order: nothing later was seen.
                        if i > cur_start:
                            runs.append((cur_start, i, cur_label))
                        runs.append((i, limit, self.never_labels[group]))
                        return runs
                prev_miss = reason
            if reason is not cur:
                # A new run (an inherited reason always continues the current one).
                if i > cur_start:
                    runs.append((cur_start, i, cur_label))
                cur_start = i
                cur = reason
                cur_label = None if reason is None else (
                    reason, group, None, record if reason is evicted else None)
        runs.append((cur_start, limit, cur_label))
        return runs

    def _isolated(self, group: int, h: bytes, shadow_h: bytes) -> bool:
        """Whether the tokens behind ``h`` are cached under other extra keys."""
        index = self.pool.index[group]
        if shadow_h != h and shadow_h in index:
            return True
        others = self.ghost.shadow_index.get((group, shadow_h))
        return bool(others) and any(x != h and x in index for x in others or ())

    # ------------------------------------------------------------------ hybrid

    def _finish(
        self, request: RequestLike, hit: int, tables: tuple[list[int], ...],
        segments: tuple[Segment, ...], known: tuple[int, _Status] | None = None,
    ) -> LookupExplanation:
        """The explanation, its per-group detail read now (the pool's state) and built
        into values when first asked for (from what was read; nothing is read later).
        ``known``: one group's status, already read."""
        raw = [known[1] if known is not None and known[0] == g
               else self._group_status(request, g, tables[g]) for g in self.group_ids]
        return LookupExplanation(request.request_id, request.num_tokens, hit, segments,
                                 detail=partial(self._group_details, raw, segments))

    def _group_details(
        self, raw: list[_Status], segments: tuple[Segment, ...]
    ) -> tuple[GroupExplanation, ...]:
        return tuple(self._group_detail(r, segments) for r in raw)

    def _group_status(
        self, request: RequestLike, group: int, table: list[int]
    ) -> _Status:
        """What :meth:`_group_detail` needs from the pool, read now: (group, limit, hit
        ids, ``_scan`` runs past the hit); runs of a group that never caches are
        ``(0, limit, clamped)``."""
        m = self.managers[group]
        limit = min(len(request.block_hashes) // self.strides[group],
                    request.num_tokens // m.block_size)
        if not m.cacheable:
            runs: list[tuple[int, int, _Label | None]] = []
            if limit:
                runs.append((0, limit, (Reason.CLAMPED, group, self.causes[group], None)))
            return group, limit, tuple(table), runs
        return group, limit, tuple(table), self._scan(request, group, len(table), limit,
                                                      inherit=False)

    def _group_detail(
        self, status: _Status,
        segments: tuple[Segment, ...],
    ) -> GroupExplanation:
        """Group positions from :meth:`_group_status`: hit ids, then own status where its
        block is missing, else the request segment holding the block's first token."""
        group, _, table, scanned = status
        bs = self.managers[group].block_size
        runs: list[BlockRun] = []
        for a, b, label in scanned:
            if label is not None:
                runs.append(BlockRun(a, b, label[0], label[2], label[1], label[3]))
                continue
            for i in range(a, b):
                s = next(s for s in segments if s.start <= i * bs < s.end)
                if runs and runs[-1].end == i and runs[-1].reason is s.reason and \
                        runs[-1].cause is s.cause and runs[-1].group == s.group:
                    runs[-1] = runs[-1]._replace(end=i + 1)
                else:
                    runs.append(BlockRun(i, i + 1, s.reason, s.cause, s.group, s.eviction))
        return GroupExplanation(group=group, kind=self.kinds[group], block_size=bs,
                                hit_block_ids=table, miss_runs=tuple(runs))


def _inherited(
    runs: list[tuple[int, int, _Label | None]]
) -> list[tuple[int, int, _Label | None]]:
    """``_scan`` runs (without inheriting) as ``_scan(..., inherit=True)`` gives them: a
    cached run after a missing block joins the run before it, and runs of the same
    label that then meet merge (the first label kept).

    >>> miss = (Reason.EVICTED, 0, None, None)
    >>> _inherited([(2, 3, None), (3, 4, miss), (4, 6, None), (6, 7, miss)])
    [(2, 3, None), (3, 7, (<Reason.EVICTED: 'evicted'>, 0, None, None))]
    """
    out: list[tuple[int, int, _Label | None]] = []
    missed = False
    for a, b, label in runs:
        if out and ((label is None and missed) or _same(out[-1][2], label)):
            out[-1] = (out[-1][0], b, out[-1][2])
        else:
            out.append((a, b, label))
        missed = missed or label is not None
    return out


def _same(a: _Label | None, b: _Label | None) -> bool:
    """Whether two labels merge into one run (same reason, group and cause)."""
    if a is None or b is None:
        return a is b
    return a[0] is b[0] and a[1] == b[1] and a[2] is b[2]
