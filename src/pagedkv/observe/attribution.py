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
   rounding to the lcm of block sizes included. Nothing cached past the hit (the usual
   miss: a new suffix) needs no replay; a given hit (``get_computed_blocks``) replays
   only the groups that are not full attention (a full group's hit within a length is
   its cached run cut to it).
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

from functools import partial
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
        self.strides = [m.hash_stride for m in self.managers]
        self.group_ids = range(len(self.managers))
        self.never_labels: list[_Label] = [(Reason.NEVER_SEEN, g, None, None)
                                           for g in self.group_ids]
        self.other_groups = [g for g in range(len(self.managers)) if g not in self.full_groups]
        #: What a group that shortens the replayed hit is charged with.
        self.replay_labels: list[_Label] = [
            (Reason.HIT_CAP, None, None, None) if g in self.full_groups
            else (Reason.CLAMPED, g, self.causes[g], None) for g in range(len(self.managers))]
        self.never_group = next((g for g, m in enumerate(self.managers) if not m.cacheable),
                                None)

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

    def _explain_hybrid(self, request: RequestLike, found: Found | None) -> LookupExplanation:
        n = request.num_tokens
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
        # 1. the limiting group and its cached prefix run; every full group's run
        star = 0
        f_tokens = -1
        runs_tokens: dict[int, int] = {}
        num_hashes = len(hashes)
        for g in self.full_groups:
            k = self.strides[g]
            gh = hashes if k == 1 else hashes[k - 1 :: k]
            bs = managers[g].block_size
            lim = min(len(gh), n // bs)
            get = index[g].get
            i = len(tables[g])
            while i < lim and get(gh[i]) is not None:
                i += 1
            runs_tokens[g] = i * bs
            if f_tokens < 0 or i * bs < f_tokens:
                star, f_tokens = g, i * bs
        star_bs = managers[star].block_size
        limit = min(num_hashes // self.strides[star], n // star_bs)
        p_tokens = limit * star_bs
        if f_tokens < 0:
            return self._explain_no_full(request, tables, hit, replayed, p_tokens, limit)
        # 2. + 3. the uncapped fixed point, with who shortened it. Nothing cached past
        # the hit in the limiting group (the usual miss, a new suffix): nothing to replay.
        if f_tokens == hit:
            uncapped, clamps = hit, []
        elif replayed is not None:
            uncapped, clamps = replayed[0], replayed[1]
        elif not self.any_drop:
            uncapped, clamps = self._replay_known_full(hashes, p_tokens, runs_tokens)
        else:
            uncapped, clamps, _ = self._replay(hashes, p_tokens)
        # 4. the limiting group's own blocks from its run's end on: read once, for the
        # segments (a cached block after a missing one inherits its reason) and as the
        # group's detail (it does not).
        f_blocks = f_tokens // star_bs
        own = self._scan(request, star, f_blocks, limit, inherit=False)
        # Token runs over [hit, P): the cap, then the clamps (disjoint, recorded from the
        # top down) with the limiting group charged where none applies, then its blocks;
        # neighbours with the same reason, group and cause merge (the first one's
        # eviction kept).
        segs = [_seg((0, hit, _HIT, None, None, None))] if hit else []

        def add(a: int, b: int, label: _Label) -> None:
            reason, group, cause, ev = label
            last = segs[-1] if segs else None
            if last is not None and last.reason is reason and last.group == group and \
                    last.cause is cause:
                segs[-1] = _seg((last.start, b, reason, group, cause, last.eviction))
            else:
                segs.append(_seg((a, b, reason, group, cause, ev)))

        pos = max(uncapped, hit)
        if pos > hit:
            add(hit, pos, (Reason.HIT_CAP, None, None, None))
        if f_tokens > pos:
            fallback: _Label = (Reason.CLAMPED, star, ClampCause.GROUP_MISS, None)
            for start, end, clamp in reversed(clamps):
                a = max(start, pos)
                b = min(end, f_tokens)
                if b > a:
                    if a > pos:
                        add(pos, a, fallback)
                    add(a, b, clamp)
                    pos = b
            if f_tokens > pos:
                add(pos, f_tokens, fallback)
        for a, b, label in _inherited(own) if len(own) > 1 else own:
            assert label is not None  # the block at the run's end is missing
            add(a * star_bs, b * star_bs, label)
        if p_tokens < n:
            segs.append(_seg((p_tokens, n, _PARTIAL, None, None, None)))
        held = len(tables[star])
        star_status: _Status = (star, limit, tuple(tables[star]),
                                [(held, f_blocks, None), *own] if f_blocks > held else own)
        return self._finish(request, hit, tables, tuple(segs), (star, star_status))

    def _explain_no_full(
        self, request: RequestLike, tables: tuple[list[int], ...], hit: int,
        replayed: tuple[int, list[tuple[int, int, _Label]], tuple[list[int], ...]] | None,
        p_tokens: int, limit: int,
    ) -> LookupExplanation:
        """A hybrid model without full-attention groups: group 0 limits; its own blocks
        are read from the uncapped hit on, and clamps show where they are cached."""
        n = request.num_tokens
        hbs = self.hash_block_size
        uncapped, clamps, _ = replayed or self._replay(request.block_hashes, p_tokens)
        base = min(hit, p_tokens) // hbs
        labels: list[_Label | None] = [None] * (p_tokens // hbs - base)

        def paint(start: int, end: int, label: _Label) -> None:
            a = max(start // hbs - base, 0)
            b = end // hbs - base
            if b > a:
                labels[a:b] = [label] * (b - a)

        for start, end, clamp in clamps:
            paint(start, end, clamp)
        bs = self.managers[0].block_size
        for a, b, status in self._scan(request, 0, uncapped // bs, limit, inherit=False):
            if status is not None:
                paint(a * bs, b * bs, status)
        paint(hit, max(uncapped, hit), (Reason.HIT_CAP, None, None, None))
        fallback: _Label = (Reason.CLAMPED, 0, ClampCause.GROUP_MISS, None)
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
        return self._finish(request, hit, tables, tuple(segs))

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

    def _replay_known_full(
        self, hashes: list[bytes], max_length: int, runs_tokens: dict[int, int]
    ) -> tuple[int, list[tuple[int, int, _Label]]]:
        """:meth:`_replay` (without ``drop_last_hit``) when every full-attention group's
        cached prefix run is known (``runs_tokens``): a full group's hit within a length
        is that run cut to the length, so only the other groups are asked. Same lengths
        and clamps as :meth:`_replay`."""
        coord = self.hybrid
        assert coord is not None
        managers = self.managers
        lcm = coord.lcm_block_size
        length = max_length // lcm * lcm
        clamps: list[tuple[int, int, _Label]] = []
        if max_length > length:
            clamps.append((length, max_length, self._lcm_label(max_length)))
        if self.never_group is not None:
            g = self.never_group
            if length:
                clamps.append((0, length, (Reason.CLAMPED, g, self.causes[g], None)))
            return 0, clamps
        for g in self.full_groups:
            bs = managers[g].block_size
            got = min(runs_tokens[g], length // bs * bs)
            if got < length:
                new = got // lcm * lcm
                clamps.append((got, length, (Reason.HIT_CAP, None, None, None)))
                if new < got:
                    clamps.append((new, got, self._lcm_label(got)))
                length = new
        others = self.other_groups
        changed = True
        while changed and length:
            changed = False
            for g in others:
                m = managers[g]
                got = len(m.find_longest_cache_hit(hashes, length)) * m.block_size
                if got < length:
                    new = got // lcm * lcm
                    clamps.append((got, length, self.replay_labels[g]))
                    if new < got:
                        clamps.append((new, got, self._lcm_label(got)))
                    changed = True
                    length = new
        return length, clamps

    def _lcm_label(self, tokens: int) -> _Label:
        """The clamp of a hit cut back to the lcm of block sizes from ``tokens``: charged
        to a group whose block boundary ``tokens`` is not on (else the largest block)."""
        managers = self.managers
        g = next((g for g, m in enumerate(managers) if tokens % m.block_size),
                 max(range(len(managers)), key=lambda g: managers[g].block_size))
        return (Reason.CLAMPED, g, ClampCause.LCM_ALIGNMENT, None)

    def _replay(
        self, hashes: list[bytes], max_length: int
    ) -> tuple[int, list[tuple[int, int, _Label]], tuple[list[int], ...]]:
        """The hybrid coordinator's fixed point within ``max_length``, recording each
        shortening ``(start, end, label)``. Mirrors HybridCoordinator.find_longest_cache_hit
        step for step (same groups asked, same bounds)."""
        managers = self.managers
        lcm = self.hybrid_lcm
        length = max_length // lcm * lcm
        clamps: list[tuple[int, int, _Label]] = []
        if max_length > length:
            clamps.append((length, max_length, self._lcm_label(max_length)))
        if self.never_group is not None:
            g = self.never_group
            if length:
                clamps.append((0, length, (Reason.CLAMPED, g, self.causes[g], None)))
            return 0, clamps, tuple([] for _ in managers)
        hits: list[list[int]] = [[] for _ in managers]
        labels = self.replay_labels

        def ask(g: int, length: int) -> int:
            m = managers[g]
            bound = min(length + m.block_size, max_length) if m.drop_last_hit else length
            hits[g] = found = m.find_longest_cache_hit(hashes, bound)
            got = len(found) * m.block_size
            if got >= length:
                return length
            new = got // lcm * lcm
            clamps.append((got, length, labels[g]))
            if new < got:
                clamps.append((new, got, self._lcm_label(got)))
            return new

        for g in self.full_groups:
            length = ask(g, length)
        others = self.other_groups
        changed = True
        while changed and length:
            changed = False
            for g in others:
                shorter = ask(g, length)
                changed = changed or shorter != length
                length = shorter
        if not length:
            return 0, clamps, tuple([] for _ in managers)
        for g in self.full_groups:
            del hits[g][length // managers[g].block_size :]
        return length, clamps, tuple(hits)

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
