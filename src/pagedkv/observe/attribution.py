"""Miss attribution: why each token of a prefix-cache lookup hit or missed.

:class:`Explainer` reads the pool's index, the ghost record and the shadow index; it never
changes anything (no statistics, no LRU order, no hasher memo of the manager).

How the ``N`` tokens of a request are split (hash block size ``h``):

1. The *limiting group* ``g*``: among full-attention groups the one whose cached prefix
   run (from block 0) is shortest, ``F`` tokens; without full-attention groups, group 0.
   ``P`` = the tokens of ``g*``'s full blocks. Tokens ``[P, N)``: ``partial_block``.
2. ``U``: the hit the coordinator would find without the ``N - 1`` cap (max length
   ``P``); ``H``: the real hit. ``[0, H)``: ``hit``; ``[H, U)``: ``hit_cap``.
3. ``[U, F)``: cached for the prefix groups, lost on the way to the common hit. A
   single full-attention group loses only its dropped last block (speculative decoding,
   ``hit_cap``); a hybrid model replays the coordinator's fixed point and charges each
   shortening to the group that caused it (``clamped``, :class:`ClampCause`), the
   rounding to the lcm of block sizes included.
4. From ``max(U, F)`` on, ``g*``'s own blocks: a missing block is ``evicted`` (in the
   ghost record), ``isolated`` (same tokens under other extra keys) or ``never_seen``
   (and so is everything after it); a cached block after a missing one inherits its
   reason (its prefix is gone); a cached block before any miss (windowed ``g*``) is
   ``clamped`` by ``g*``.

Worked case (one full-attention group, block 16, ``N`` = 72, blocks 0..2 cached, block
3 evicted at step 5): ``P`` = 64, ``F`` = 48, ``U`` = ``H`` = 48 -> hit ``[0, 48)``,
evicted ``[48, 64)`` (step 5), partial ``[64, 72)``.
"""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING

from pagedkv.coordinator import HybridCoordinator, NoPrefixCacheCoordinator
from pagedkv.managers.base import SingleTypeManager
from pagedkv.managers.chunked_local import ChunkedLocalManager
from pagedkv.managers.cross_attention import CrossAttentionManager
from pagedkv.managers.full import FullAttentionManager
from pagedkv.managers.mamba import MambaAlignManager, MambaCheckpointManager, MambaManager
from pagedkv.managers.sliding_window import SlidingWindowManager
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
from pagedkv.request import RequestLike

if TYPE_CHECKING:
    from pagedkv.manager import KVCacheManager

__all__ = ["Explainer", "clamp_cause_for"]

_NEVER_SEEN = Reason.NEVER_SEEN
_HIT = Reason.HIT
_PARTIAL = Reason.PARTIAL_BLOCK

#: (reason, group, cause, eviction): what one position is labelled with while painting.
_Label = tuple[Reason, "int | None", "ClampCause | None", "EvictionRecord | None"]
#: Per-table hit block ids and the hit length, as the coordinator returns them.
Found = tuple[tuple[list[int], ...], int]


def clamp_cause_for(manager: SingleTypeManager) -> ClampCause:
    """Why a group of this manager's kind shortens a hit."""
    if isinstance(manager, SlidingWindowManager):
        return ClampCause.WINDOW_RUN_NOT_FOUND
    if isinstance(manager, ChunkedLocalManager):
        return ClampCause.CHUNK_RUN_NOT_FOUND
    if isinstance(manager, (MambaManager, MambaCheckpointManager, MambaAlignManager)):
        return ClampCause.NO_MAMBA_STATE
    if isinstance(manager, CrossAttentionManager):
        return ClampCause.NOT_CACHEABLE
    return ClampCause.GROUP_MISS


class Explainer:
    """Explains lookups of one manager whose pool tells ``ghost`` (module docstring)."""

    def __init__(self, manager: KVCacheManager, ghost: GhostRecorder) -> None:
        self.coordinator = coord = manager.coordinator
        self.pool = manager.pool
        self.ghost = ghost
        self.managers = coord.managers
        self.caching_off = isinstance(coord, NoPrefixCacheCoordinator)
        self.hybrid = coord if isinstance(coord, HybridCoordinator) else None
        self.hash_block_size = manager.pool.hash_block_size
        self.full_groups = [g for g, m in enumerate(self.managers)
                            if isinstance(m, FullAttentionManager)]
        self.causes = [clamp_cause_for(m) for m in self.managers]
        self.kinds = [m.spec.kind for m in self.managers]
        self.any_drop = any(m.drop_last_hit for m in self.managers)
        self.unitary_full = bool(self.full_groups) and self.hybrid is None
        self.hybrid_lcm = self.hybrid.lcm_block_size if self.hybrid is not None else 1

    # ------------------------------------------------------------------ entry point

    def explain(self, request: RequestLike, found: Found | None = None) -> LookupExplanation:
        """The explanation of ``request``'s lookup. ``found``: the coordinator's answer
        for it when the caller already has it (saves the lookup). No state changes."""
        n = request.num_tokens
        rid = request.request_id
        if self.caching_off:
            return LookupExplanation(rid, n, 0, (Segment(0, n, Reason.CACHING_OFF, None, None,
                                                         None),))
        if self.hybrid is not None:
            return self._explain_hybrid(request, found)
        if found is None:
            found = self.coordinator.find_longest_cache_hit(request.block_hashes, n - 1)
            assert found is not None
        tables, hit = found
        return self._explain_unitary(request, tables, hit)

    # ------------------------------------------------------------------ one group

    def _explain_unitary(
        self, request: RequestLike, tables: tuple[list[int], ...], hit: int
    ) -> LookupExplanation:
        n = request.num_tokens
        m = self.managers[0]
        bs = m.block_size
        gh = request.block_hashes if m.hash_stride == 1 else m.group_hashes(
            request.block_hashes)
        limit = min(len(gh), n // bs)
        p_tokens = limit * bs
        full = self.unitary_full
        segs: list[Segment] = []
        if hit:
            segs.append(Segment(0, hit, _HIT, None, None, None))
        if not m.cacheable:  # Mamba without checkpoints, cross attention: never a hit
            if p_tokens:
                segs.append(Segment(0, p_tokens, Reason.CLAMPED, 0, self.causes[0], None))
            start = limit * bs
        elif full:
            # A full-attention hit is a prefix of cached blocks: the run goes on from it.
            get = self.pool.index[0].get
            i = len(tables[0])
            while i < limit and get(gh[i]) is not None:
                i += 1
            f_tokens = i * bs
            # Cached but not hit: the N - 1 cap or the dropped last block.
            if f_tokens > hit:
                segs.append(Segment(hit, f_tokens, Reason.HIT_CAP, None, None, None))
            start = max(f_tokens, hit)
        else:
            uncapped = (hit if p_tokens <= n - 1
                        else max(hit, len(m.find_longest_cache_hit(request.block_hashes,
                                                                   p_tokens)) * bs))
            if uncapped > hit:
                segs.append(Segment(hit, uncapped, Reason.HIT_CAP, None, None, None))
            start = uncapped
        first = start // bs
        if full and first < limit and request.hash_extras is None \
                and not self.ghost.shadow_index:
            # NOTE: the usual miss — a new suffix: no other keys exist to isolate it, so
            # only the ghost record can tell this block from a never-seen one; when it
            # cannot, the rest is one run (saves the general scan: explain_lookup on a
            # never-seen prompt 5.5x -> under 2x a lookup, benchmarks/observe_speed.py).
            ghost = self.ghost.ghost
            if not ghost or (0, gh[first]) not in ghost:
                segs.append(Segment(start, p_tokens, _NEVER_SEEN, 0, None, None))
                first = limit
        if first < limit:
            for a, b, label in self._scan(request, 0, first, limit, inherit=full):
                reason, group, cause, ev = label or (Reason.CLAMPED, 0, self.causes[0], None)
                segs.append(Segment(a * bs, b * bs, reason, group, cause, ev))
        if p_tokens < n:
            segs.append(Segment(p_tokens, n, _PARTIAL, None, None, None))
        return LookupExplanation(request.request_id, n, hit, tuple(segs),
                                 unitary=(self.kinds[0], bs, tables[0]))

    # ------------------------------------------------------------------ status scan

    def _scan(
        self, request: RequestLike, group: int, first: int, limit: int, *, inherit: bool
    ) -> list[tuple[int, int, _Label | None]]:
        """Runs ``(start, end, label)`` of ``group``'s block positions ``[first, limit)``
        by their own status; ``None``: cached before any missing block. With ``inherit``
        a cached block after a missing one takes that block's label."""
        if first >= limit:
            return []
        m = self.managers[group]
        gh = m.group_hashes(request.block_hashes)
        get = self.pool.index[group].get
        ghost = self.ghost.ghost
        runs: list[tuple[int, int, _Label | None]] = []
        shadow: list[bytes] | None = None
        prev_miss: _Label | None = None
        cur: _Label | None = None
        cur_start = first
        i = first
        while i < limit:
            h = gh[i]
            if get(h) is not None:
                label = prev_miss if inherit else None
            else:
                record = ghost.get((group, h)) if ghost else None
                if record is not None:
                    label = (Reason.EVICTED, group, None, record)
                else:
                    if shadow is None:
                        shadow = m.group_hashes(self.ghost.shadow_hashes_readonly(request))
                    if self._isolated(group, h, shadow[i] if i < len(shadow) else h):
                        label = (Reason.ISOLATED, group, None, None)
                    else:
                        # Chained hashes are registered in order: nothing later was seen.
                        if i > cur_start:
                            runs.append((cur_start, i, cur))
                        runs.append((i, limit, (Reason.NEVER_SEEN, group, None, None)))
                        return runs
                prev_miss = label
            if i == first:
                cur = label
            elif not _same(cur, label):
                runs.append((cur_start, i, cur))
                cur_start = i
                cur = label
            i += 1
        runs.append((cur_start, limit, cur))
        return runs

    def _isolated(self, group: int, h: bytes, shadow_h: bytes) -> bool:
        """Whether the tokens behind ``h`` are cached under other extra keys."""
        index = self.pool.index[group]
        if shadow_h != h and shadow_h in index:
            return True
        others = self.ghost.shadow_index.get((group, shadow_h))
        return bool(others) and any(x != h and x in index for x in others or ())

    # ------------------------------------------------------------------ hybrid

    def _explain_hybrid(self, request: RequestLike, found: Found | None) -> LookupExplanation:
        n = request.num_tokens
        hbs = self.hash_block_size
        hashes = request.block_hashes
        index = self.pool.index
        managers = self.managers
        replayed = None
        if found is None and len(self.full_groups) <= 1 and not self.any_drop:
            # With at most one full-attention group the limiting group is known up front;
            # when the cap does not change the lcm-rounded start, the replay within P is
            # the coordinator's own lookup (same groups, order and bounds): reuse it.
            star = self.full_groups[0] if self.full_groups else 0
            star_bs = managers[star].block_size
            p_tokens = min(len(managers[star].group_hashes(hashes)), n // star_bs) * star_bs
            lcm = self.hybrid_lcm
            if (n - 1) // lcm == p_tokens // lcm:
                replayed = self._replay(hashes, p_tokens)
                found = (replayed[2], replayed[0])
        if found is None:
            found = self.coordinator.find_longest_cache_hit(hashes, n - 1)
            assert found is not None
        tables, hit = found
        # 1. the limiting group and its cached prefix run
        star = 0
        f_tokens = -1
        for g in self.full_groups:
            m = managers[g]
            gh = m.group_hashes(hashes)
            lim = min(len(gh), n // m.block_size)
            get = index[g].get
            i = len(tables[g])
            while i < lim and get(gh[i]) is not None:
                i += 1
            if f_tokens < 0 or i * m.block_size < f_tokens:
                star, f_tokens = g, i * m.block_size
        star_bs = managers[star].block_size
        limit = min(len(managers[star].group_hashes(hashes)), n // star_bs)
        p_tokens = limit * star_bs
        has_full = f_tokens >= 0
        # 2. + 3. the uncapped fixed point, with who shortened it
        uncapped, clamps, _ = replayed or self._replay(hashes, p_tokens)
        # Labels per hash block from the hit on (the hit itself is one segment).
        base = min(hit, p_tokens) // hbs
        labels: list[_Label | None] = [None] * (p_tokens // hbs - base)

        def paint(start: int, end: int, label: _Label) -> None:
            a = max(start // hbs - base, 0)
            b = end // hbs - base
            if b > a:
                labels[a:b] = [label] * (b - a)

        for start, end, clamp in clamps:
            paint(start, end, clamp)
        # 4. the limiting group's own blocks
        first = f_tokens if has_full else uncapped
        for a, b, status in self._scan(request, star, max(first, 0) // star_bs, limit,
                                       inherit=has_full):
            if status is not None:
                paint(a * star_bs, b * star_bs, status)
        paint(hit, max(uncapped, hit), (Reason.HIT_CAP, None, None, None))
        fallback: _Label = (Reason.CLAMPED, star, ClampCause.GROUP_MISS, None)
        segs: list[Segment] = []
        if hit:
            segs.append(Segment(0, base * hbs, _HIT, None, None, None))
        j = base
        for label, run in groupby(labels):  # painted runs share one label object
            e = j + len(list(run))
            reason, group, cause, ev = label or fallback
            if segs and segs[-1].end == j * hbs and segs[-1].reason is reason and \
                    segs[-1].group == group and segs[-1].cause is cause:
                segs[-1] = segs[-1]._replace(end=e * hbs)
            else:
                segs.append(Segment(j * hbs, e * hbs, reason, group, cause, ev))
            j = e
        if p_tokens < n:
            segs.append(Segment(p_tokens, n, Reason.PARTIAL_BLOCK, None, None, None))
        segments = tuple(segs)
        groups = tuple(self._group_detail(request, g, tables[g], segments)
                       for g in range(len(managers)))
        return LookupExplanation(request.request_id, n, hit, segments, groups)

    def _replay(
        self, hashes: list[bytes], max_length: int
    ) -> tuple[int, list[tuple[int, int, _Label]], tuple[list[int], ...]]:
        """The hybrid coordinator's fixed point within ``max_length``, recording each
        shortening ``(start, end, label)``. Mirrors HybridCoordinator.find_longest_cache_hit
        step for step (same groups asked, same bounds)."""
        coord = self.hybrid
        assert coord is not None
        managers = self.managers
        lcm = coord.lcm_block_size
        length = max_length // lcm * lcm
        clamps: list[tuple[int, int, _Label]] = []

        def lcm_label(tokens: int) -> _Label:
            g = next((g for g, m in enumerate(managers) if tokens % m.block_size),
                     max(range(len(managers)), key=lambda g: managers[g].block_size))
            return (Reason.CLAMPED, g, ClampCause.LCM_ALIGNMENT, None)

        if max_length > length:
            clamps.append((length, max_length, lcm_label(max_length)))
        never = [g for g, m in enumerate(managers) if not m.cacheable]
        if never:
            g = never[0]
            if length:
                clamps.append((0, length, (Reason.CLAMPED, g, self.causes[g], None)))
            return 0, clamps, tuple([] for _ in managers)
        full = set(self.full_groups)

        hits: list[list[int]] = [[] for _ in managers]

        def ask(g: int, length: int) -> int:
            m = managers[g]
            bound = min(length + m.block_size, max_length) if m.drop_last_hit else length
            hits[g] = m.find_longest_cache_hit(hashes, bound)
            got = len(hits[g]) * m.block_size
            if got >= length:
                return length
            new = got // lcm * lcm
            if g in full:
                clamps.append((got, length, (Reason.HIT_CAP, None, None, None)))
            else:
                clamps.append((got, length, (Reason.CLAMPED, g, self.causes[g], None)))
            if new < got:
                clamps.append((new, got, lcm_label(got)))
            return new

        for g in self.full_groups:
            length = ask(g, length)
        others = [g for g in range(len(managers)) if g not in full]
        changed = True
        while changed and length:
            changed = False
            for g in others:
                shorter = ask(g, length)
                changed = changed or shorter != length
                length = shorter
        if not length:
            return 0, clamps, tuple([] for _ in managers)
        for g in full:
            del hits[g][length // managers[g].block_size :]
        return length, clamps, tuple(hits)

    def _group_detail(
        self, request: RequestLike, group: int, table: list[int], segments: tuple[Segment, ...]
    ) -> GroupExplanation:
        """Group ``group``'s positions: hit ids, then own status where its block is
        missing, else the request segment holding the block's first token."""
        m = self.managers[group]
        bs = m.block_size
        limit = min(len(m.group_hashes(request.block_hashes)), request.num_tokens // bs)
        runs: list[BlockRun] = []
        if not m.cacheable and limit:
            runs.append(BlockRun(0, limit, Reason.CLAMPED, self.causes[group], group, None))
            limit = 0
        for a, b, label in self._scan(request, group, len(table), limit, inherit=False):
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
                                hit_block_ids=tuple(table), miss_runs=tuple(runs))


def _same(a: _Label | None, b: _Label | None) -> bool:
    """Whether two labels merge into one run (same reason, group and cause)."""
    if a is None or b is None:
        return a is b
    return a[0] is b[0] and a[1] == b[1] and a[2] is b[2]
