"""The hybrid coordinators: several KV-cache groups agreeing on one prefix-cache hit
(see :mod:`pagedkv.core.coordinator` for the family).

* :class:`HybridCoordinator` — a hit must be valid for *every* group. Full-attention
  groups go first (their hit is a plain prefix); every other group then verifies and
  possibly shortens it; this repeats until the length stops changing (a fixed point).
  Lengths are kept multiples of the least common multiple of the block sizes so every
  group's hit ends on one of its block boundaries.
* :class:`PartialHitCoordinator` — the same with sub-block hits (vLLM 0.33's finer
  ``hash_block_size`` with an align-mode Mamba group), copying the block a hit ends in.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pagedkv.core.coordinator_base import BlockTables, Coordinator
from pagedkv.core.eagle_hits import find_hit_with_drop
from pagedkv.core.external_blocks import allocate_external, uncounted_blocks
from pagedkv.core.kernels import kernels
from pagedkv.core.lookup_plan import KernelLookup, hit_plan
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.managers.partial import PartialHitManager
from pagedkv.core.pool import BlockPool
from pagedkv.core.reprefill import cache_finalized, hybrid_cacheable_tokens
from pagedkv.core.request import RequestLike
from pagedkv.core.specs import lcm_block_size

__all__ = ["HybridCoordinator", "PartialHitCoordinator"]


class HybridCoordinator(KernelLookup, Coordinator):
    """Several groups: the longest hit valid for all of them, found as a fixed point.

    Lengths are kept multiples of ``lcm_block_size`` (the least common multiple of the
    group block sizes) so every group's hit ends on one of its own block boundaries.

    1. Full-attention groups (MLA and sinks included) go first. Their hit is downward
       closed (any shorter block-aligned prefix of a hit is a hit), so each is looked up
       once and later only truncated. The candidate length ``C`` becomes the shortest of
       their hits, rounded down to the lcm.
    2. Every other group is asked for its hit within ``C``; a shorter answer lowers ``C``
       (rounded down to the lcm) and the pass repeats until one pass changes nothing.
       ``C`` only decreases, so this ends. Windowed hits are not downward closed (a
       sliding-window hit of 80 tokens says nothing about 64), which is why they are asked
       again rather than truncated.

    Worked case: full attention (block 32) + sliding window 32 (block 16), hashes at 16,
    lcm 32, a 129-token prompt whose first 128 tokens are cached except sliding-window
    blocks 5 and 6 (tokens 80..111): full attention hits 128; sliding window within 128
    scans blocks 7, 6 (miss), 5 (miss), 4, 3 -> run ``b3 b4``, 80 tokens; C = 64; full
    attention truncates to 2 blocks; sliding window within 64 -> ``[0, 0, b2, b3]``, 64;
    stable: 4 x 16 tokens, not 5 x 16.

    Registration (:meth:`Coordinator.cache_blocks`) goes only up to a multiple of the lcm
    (``cache_alignment_tokens``; no hit can end elsewhere), as vLLM 0.33: full attention
    32 + sliding window 16 with 48 tokens computed registers 32 tokens in each group.

    Speculative decoding (``drop_last_hit``): each manager's rule already drops its last
    hit block (its answer is at most its bound minus one block), so a group is asked
    within ``min(C + block_size, max_length)``: it looks one block past ``C`` and drops
    it, landing at ``C`` when the block after ``C`` matched. Asking within ``C`` instead
    would drop one block per pass and shrink every hit to 0.

    A group that can never hit (Mamba without checkpoints, cross attention) makes every
    lookup miss, without any lookup. A group that does not join lookups (``joins_lookup``
    False: SWA-MLA with bounded replay) is left out: its part of every hit is empty.
    """

    def __init__(self, managers: Sequence[SingleTypeManager], pool: BlockPool) -> None:
        super().__init__(managers, pool)
        self.lcm_block_size = lcm_block_size([m.spec for m in self.managers])
        joining = [(i, m) for i, m in enumerate(self.managers) if m.joins_lookup]
        self._full = [i for i, m in joining if m.prefix_closed_hits]
        self._others = [i for i, m in joining if not m.prefix_closed_hits]
        self._never_hits = not joining or any(not m.cacheable for _, m in joining)
        self._eagle = any(m.drop_last_hit for m in self.managers)
        if self._eagle:  # vLLM registers up to min(n, aligned + block) in a dropping group
            setattr(self, "cache_blocks", self._cache_under_drop)  # noqa: B010
        for m in self.managers:
            m.hit_alignment_tokens = self.lcm_block_size
        self.cache_alignment_tokens = self.lcm_block_size
        self._kernels = kernels()
        self._install_hit()

    def _install_hit(self) -> None:
        """Put the lookup kernel over this coordinator's plan (kernels_hybrid_hits) in
        front of :meth:`find_longest_cache_hit` where the plan covers the groups (the
        class's fixed point without the drop, every group by its kind's own rule), and
        the façade's ``lookup_request`` over that kernel (no reference back to this
        coordinator)."""
        if (type(self).find_longest_cache_hit is HybridCoordinator.find_longest_cache_hit
                and not self._never_hits and not self._eagle):
            self._use_hit_kernel(hit_plan(self.managers, self._full, self._others,
                                          self.lcm_block_size, False))

    def cacheable_tokens(self, num_tokens: int, m: SingleTypeManager) -> int:
        """Aligned, and finalized in a group with the EAGLE drop
        (:func:`~pagedkv.core.reprefill.hybrid_cacheable_tokens`). No state change."""
        return hybrid_cacheable_tokens(num_tokens, self.num_reprefillable_tokens,
                                       self.cache_alignment_tokens, m)

    def _cache_under_drop(self, request: RequestLike, num_tokens: int) -> None:
        """``cache_blocks`` under the EAGLE drop: each group registers its
        :meth:`cacheable_tokens` (aligned; up to one block more where it drops, as vLLM's
        ``get_num_cacheable_tokens``). Bound as ``cache_blocks`` only then."""
        cache_finalized(self, self._cache_plan, request, num_tokens)

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[BlockTables, int] | None:
        """Per-group hit blocks and the common hit length (class docstring). Does not
        modify any state. Cost: one scan per full-attention group, plus one scan per other
        group and pass; passes are few (each one lowers the length by at least the lcm)."""
        managers = self.managers
        if self._never_hits:
            return tuple([] for _ in managers), 0
        if self._eagle:  # the EAGLE drop: vLLM's own fixed point (eagle_hits.py)
            return find_hit_with_drop(managers, self._full, self._others, block_hashes,
                                      max_length, len(block_hashes) * self.pool.hash_block_size)
        # No group drops its last hit here (that is the branch above): each group is
        # asked within the common length, one call per group and pass, no closure.
        lcm = self.lcm_block_size
        length = max_length // lcm * lcm
        hits: list[list[int]] = [[] for _ in managers]
        for i in self._full:
            m = managers[i]
            hit = hits[i] = m.find_longest_cache_hit(block_hashes, length)
            got = len(hit) * m.block_size
            if got < length:
                length = got // lcm * lcm
        others = self._others
        changed = True
        while changed and length:
            changed = False
            for i in others:
                m = managers[i]
                hit = hits[i] = m.find_longest_cache_hit(block_hashes, length)
                got = len(hit) * m.block_size
                if got < length:  # the length falls to the group's hit, aligned
                    changed = True
                    length = got // lcm * lcm
        if not length:
            return tuple([] for _ in managers), 0
        for i in self._full:
            m = managers[i]
            del hits[i][length // m.block_size :]
        for i in self._others:
            assert len(hits[i]) * managers[i].block_size == length, "hybrid hit not stable"
        return tuple(hits), length


class PartialHitCoordinator(HybridCoordinator):
    """A hybrid model with sub-block ("partial") prefix hits, as vLLM 0.33 enables them: an
    align-mode Mamba group's block is larger than the hash block and every other caching
    group is full attention or has the hash block as its block. Hits land on hash-block
    boundaries (not the lcm), so they may end inside a block; the full-attention and Mamba
    groups then copy that block on write (:meth:`pagedkv.KVCacheManager.take_block_copies`).

    Lookup, as vLLM's fixed point with the hash block as alignment: full attention first
    (once; later only truncated), then every other group within the candidate; a model of
    one full-attention and one other group stops after one pass. Registration is not
    rounded down to the lcm.

    Worked case (full attention 16 + Mamba 16, hash block 4): a request whose first 40
    tokens were computed by a request with a 41-token prompt (its state at 40 registered
    as a partial entry) hits 40 tokens: full attention ``[b0, b1, b2]`` (b2 partially) and
    Mamba ``[0, 0, s]``; both b2 and s are copied at allocation.
    """

    def __init__(self, managers: Sequence[SingleTypeManager], pool: BlockPool) -> None:
        super().__init__(managers, pool)
        hbs = pool.hash_block_size
        #: Per group: its manager when it serves sub-block hits, else None.
        self._partial_of: list[PartialHitManager | None] = [
            m if isinstance(m, PartialHitManager) else None for m in self.managers]
        for m in self.managers:
            m.hit_alignment_tokens = hbs
        #: The groups serving sub-block hits, with their managers (these queue copies).
        self._partial = [(g, m) for g, m in enumerate(self._partial_of) if m is not None]
        self._partial_groups = [g for g, _ in self._partial]
        self._copying = [m for _, m in self._partial]
        for m in self._copying:
            m.enable_partial_hits()
        #: Per group: its manager when it records a copy block as new (see
        #: ``PartialHitManager.records_copy_block``), else None.
        self._copy_recorders = [m if m is not None and m.records_copy_block else None
                                for m in self._partial_of]
        self._order = self._full + self._others
        self._simple = len(self.managers) == 2 and len(self._full) == 1
        # No rounding: a hit may end anywhere on a hash block boundary.
        self.cache_alignment_tokens = 1
        self._build_plans()  # the Mamba groups' registration changed (partial_hits)

    def group_problem(self, g: int, block_hashes: list[bytes], blocks: list[int],
                      num_hit_tokens: int) -> str | None:
        """Hits on hash-block boundaries: in the full-attention and Mamba groups the last
        block must hold the key of the hit's prefix (the block it ends inside, or its last
        full block); full attention's earlier blocks are checked as usual, Mamba's must be
        null. No state change."""
        hbs = self.pool.hash_block_size
        if type(num_hit_tokens) is not int or num_hit_tokens % hbs:
            return f"a hit of {num_hit_tokens!r} tokens is not a multiple of {hbs}"
        m = self.managers[g]
        if not all(type(b) is int for b in blocks):
            return f"group {g}: block ids come as a list of ints, got {blocks!r}"
        p = self._partial_of[g]
        if p is None or not num_hit_tokens:
            return m.hit_problem(block_hashes, blocks, num_hit_tokens)
        n = -(-num_hit_tokens // m.block_size)
        if len(blocks) != n:
            return (f"group {g}: a {num_hit_tokens}-token hit takes {n} blocks of "
                    f"{m.block_size}, got {len(blocks)}")
        i = num_hit_tokens // hbs - 1
        last = blocks[-1]
        key = block_hashes[i] if i < len(block_hashes) else None
        if key is None or not self.pool.has_entry(g, key, last):
            return (f"group {g}: block {last} no longer holds this request's first "
                    f"{num_hit_tokens} tokens (evicted or reused since the lookup)")
        return p.partial_head_problem(block_hashes, blocks[:-1])

    def find_group_hit(self, g: int, block_hashes: list[bytes], length: int
                       ) -> tuple[list[int], int]:
        p = self._partial_of[g]
        if p is not None:
            return p.find_partial_hit(block_hashes, length)
        m = self.managers[g]
        blocks = m.find_longest_cache_hit(block_hashes, length)
        return blocks, len(blocks) * m.block_size

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[BlockTables, int] | None:
        managers = self.managers
        if self._never_hits:
            return tuple([] for _ in managers), 0
        full = self._full
        hits: list[list[int] | None] = [None] * len(managers)
        lengths = [0] * len(managers)
        length = max_length
        while True:
            cur = length
            for g in self._order:
                if g in full and hits[g] is not None:
                    cur = min(cur, lengths[g])
                    continue
                hits[g], cur = self.find_group_hit(g, block_hashes, cur)
                lengths[g] = cur
            if cur >= length:
                break
            length = cur
            if self._simple:
                break
        for g in full:
            blocks = hits[g]
            if blocks is not None:
                del blocks[-(-length // managers[g].block_size):]
        return tuple(h if h is not None else [] for h in hits), length

    def allocate(
        self,
        request_id: str,
        hit: BlockTables | None,
        num_computed_tokens: int,
        total_computed_tokens: int,
        num_tokens: int,
        num_encoder_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        headroom_blocks: int = 0,
        num_local_computed_tokens: int | None = None,
    ) -> BlockTables | None:
        """As :meth:`Coordinator.allocate`, plus the copy block of a hit ending inside a
        block (counted in the capacity check, taken first at allocation)."""
        for m in self._droppers:
            m.remove_skipped_blocks(request_id, num_computed_tokens)
        if hit is None and request_id in self._tables0:
            # A running request: no hit, so no copy (a full-attention copy is queued only
            # when a hit is adopted; a Mamba group's own copy goes through its methods).
            return self._grow(request_id, num_tokens, num_encoder_tokens,
                              num_tokens_main_model, headroom_blocks, total_computed_tokens)
        managers = self.managers
        table_hit = hit if hit is not None else self._no_hit
        local = (total_computed_tokens if num_local_computed_tokens is None
                 else num_local_computed_tokens)
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        slots = [main if m.ignores_lookahead else m.slots_needed(num_tokens, num_encoder_tokens)
                 for m in managers]
        num_needed = 0
        for g, m in enumerate(managers):
            num_needed += m.get_num_blocks_to_allocate(
                request_id, slots[g], table_hit[g], total_computed_tokens)
        if hit is not None:
            for g, p in self._partial:
                num_needed += p.count_partial(table_hit[g], local)
        pool = self.pool
        extra = (uncounted_blocks(managers, slots, total_computed_tokens)
                 if total_computed_tokens > local else 0)
        if num_needed + max(headroom_blocks, extra) > pool.free_queue.num_free:
            return None
        if hit is not None:
            for g, m in enumerate(managers):
                pool.touch(m.claimed_hit_blocks(hit[g], total_computed_tokens))
        for g, m in enumerate(managers):
            m.save_new_computed_blocks(request_id, table_hit[g], total_computed_tokens)
        if hit is not None:
            for g, p in self._partial:
                # as vLLM, only the hit blocks a load's skipped prefix leaves count
                p.adopt_partial_hit(request_id, managers[g].claimed_hit_blocks(
                    table_hit[g], total_computed_tokens), local)
        if total_computed_tokens > local:
            allocate_external(managers, request_id, local, total_computed_tokens,
                              self.zeroing, self.new_block_ids, self.skip_zeroing_group_ids)
        new_blocks = []
        zeroing = self.zeroing
        recorders = self._copy_recorders
        for g, m in enumerate(managers):
            rec = recorders[g]
            copies = len(rec.pending_copies) if rec is not None else 0
            new = m.allocate_new_blocks(request_id, slots[g])
            if zeroing[g]:
                self.new_block_ids[g].extend(b for b in new if b)
            elif rec is not None and copies != len(rec.pending_copies):
                self.new_block_ids[g].append(new[0])  # vLLM records a copy block always
            new_blocks.append(new)
        return tuple(new_blocks)

    def take_copies(self) -> list[tuple[int, int]]:
        """The ``(source, copy)`` block pairs queued since the last call, group by group."""
        out: list[tuple[int, int]] = []
        for m in self._copying:
            if m.pending_copies:
                out.extend(m.pending_copies)
                m.pending_copies = []
        return out

    def iter_pending_copy_blocks(self) -> Iterator[int]:
        """Both blocks of every queued copy (each holds one reference for the copy)."""
        for m in self._copying:
            for src, cow in m.pending_copies:
                yield src
                yield cow
