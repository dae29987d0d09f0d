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

from pagedkv.core.request import RequestLike
from pagedkv.observe.attribution_hybrid import HybridExplainer
from pagedkv.observe.attribution_scan import (
    _HIT,
    _NEVER_SEEN,
    _PARTIAL,
    Found,
    clamp_cause_for,
)
from pagedkv.observe.reasons import LookupExplanation, Reason, Segment

__all__ = ["Explainer", "clamp_cause_for"]


class Explainer(HybridExplainer):
    """Explains lookups of one manager whose pool tells ``ghost`` (module docstring)."""

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

