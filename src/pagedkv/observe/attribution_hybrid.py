"""Miss attribution for hybrid models (several KV-cache groups): the coordinator's fixed
point replayed with each shortening charged to the group that caused it (see
:mod:`pagedkv.observe.attribution` for how tokens are split).
"""

from __future__ import annotations

from itertools import groupby

from pagedkv.core.request import RequestLike
from pagedkv.observe.attribution_scan import (
    _HIT,
    _PARTIAL,
    ExplainerBase,
    Found,
    _inherited,
    _Label,
    _seg,
    _Status,
)
from pagedkv.observe.reasons import ClampCause, LookupExplanation, Reason, Segment

__all__ = ["HybridExplainer"]


class HybridExplainer(ExplainerBase):
    """The hybrid part of :class:`~pagedkv.observe.attribution.Explainer`."""

    def _explain_hybrid(self, request: RequestLike, found: Found | None) -> LookupExplanation:
        n = request.num_tokens
        hashes = request.block_hashes
        managers = self.managers
        replayed = None
        if self.partial_hits:
            return self._explain_partial(request, found)
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
        star, f_tokens, runs_tokens = self._full_runs(hashes, n, tables)
        star_bs = managers[star].block_size
        limit = min(len(hashes) // self.strides[star], n // star_bs)
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

    def _full_runs(
        self, hashes: list[bytes], n: int, tables: tuple[list[int], ...]
    ) -> tuple[int, int, dict[int, int]]:
        """Every full-attention group's cached prefix run from its hit on, in tokens, and
        the limiting group (the shortest run; group 0 and -1 tokens when there is no
        full-attention group): ``(star, its run, runs by group)``. No state change."""
        index = self.pool.index
        managers = self.managers
        star = 0
        f_tokens = -1
        runs_tokens: dict[int, int] = {}
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
        return star, f_tokens, runs_tokens

    def _explain_partial(self, request: RequestLike, found: Found | None) -> LookupExplanation:
        """Sub-block hits (:class:`~pagedkv.core.coordinator.PartialHitCoordinator`): the hit is
        the coordinator's; the rest of the block it ends in, and every later block, read
        the limiting group's own status (a block cached there but not hit: clamped by the
        other group)."""
        n = request.num_tokens
        if found is None:
            found = self.coordinator.find_longest_cache_hit(request.block_hashes, n - 1)
            assert found is not None
        tables, hit = found
        star = self.full_groups[0] if self.full_groups else 0
        bs = self.managers[star].block_size
        limit = min(len(request.block_hashes) // self.strides[star], n // bs)
        p_tokens = limit * bs
        other = next((g for g in self.group_ids if g != star), star)
        clamp: _Label = (Reason.CLAMPED, other, self.causes[other], None)
        segs = [_seg((0, hit, _HIT, None, None, None))] if hit else []
        if hit < p_tokens:
            for a, b, label in self._scan(request, star, hit // bs, limit, inherit=True):
                reason, group, cause, ev = label or clamp
                start = max(a * bs, hit)
                last = segs[-1] if segs else None
                if last is not None and last.reason is reason and last.group == group \
                        and last.cause is cause:
                    segs[-1] = _seg((last.start, b * bs, reason, group, cause, last.eviction))
                else:
                    segs.append(_seg((start, b * bs, reason, group, cause, ev)))
        if max(p_tokens, hit) < n:
            segs.append(_seg((max(p_tokens, hit), n, _PARTIAL, None, None, None)))
        return self._finish(request, hit, tables, tuple(segs))

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
        length, clamps = self._first_clamps(max_length, lcm)
        if self.never_group is not None:
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

    def _first_clamps(
        self, max_length: int, lcm: int
    ) -> tuple[int, list[tuple[int, int, _Label]]]:
        """Where both replays start: ``max_length`` cut to a multiple of ``lcm`` (the cut
        recorded), and, when a group never hits (``never_group``), the whole remaining
        length charged to it (the caller then returns a hit of 0)."""
        length = max_length // lcm * lcm
        clamps: list[tuple[int, int, _Label]] = []
        if max_length > length:
            clamps.append((length, max_length, self._lcm_label(max_length)))
        g = self.never_group
        if g is not None and length:
            clamps.append((0, length, (Reason.CLAMPED, g, self.causes[g], None)))
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
        length, clamps = self._first_clamps(max_length, lcm)
        if self.never_group is not None:
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

