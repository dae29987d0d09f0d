"""Coordinators: the groups of one model as one unit — how they agree on a prefix-cache
hit, and the per-group loops of allocating, registering and freeing a request's blocks.

* :class:`NoPrefixCacheCoordinator` — caching off: no lookup, nothing registered.
* :class:`UnitaryCoordinator` — one group: that group's longest hit; no loops.
* :class:`HybridCoordinator` — several groups: a hit must be valid for *every* group.
  Full-attention groups go first (their hit is a plain prefix); every other group then
  verifies and possibly shortens it; this repeats until the length stops changing (a fixed
  point). Lengths are kept multiples of the least common multiple of the block sizes so
  every group's hit ends on one of its block boundaries.

The façade (:class:`pagedkv.KVCacheManager`) validates calls, does the token arithmetic
and keeps statistics; the coordinator does everything that touches groups and the pool.
Lookups never change state; a refused :meth:`Coordinator.allocate` changes nothing except
releasing the blocks that fell out of the request's windows (as vLLM 0.33 does).
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView, Sequence
from typing import NamedTuple

from pagedkv.managers.base import SingleTypeManager
from pagedkv.managers.full import FullAttentionManager, PartialHitFullManager
from pagedkv.managers.mamba import MambaAlignManager
from pagedkv.pool import BlockPool
from pagedkv.request import RequestLike
from pagedkv.specs import lcm_block_size

__all__ = [
    "ComputedBlocks",
    "Coordinator",
    "HybridCoordinator",
    "NoPrefixCacheCoordinator",
    "PartialHitCoordinator",
    "UnitaryCoordinator",
]

#: Per-group block ids, one list per group.
BlockTables = tuple[list[int], ...]


class ComputedBlocks(NamedTuple):
    """A prefix-cache hit: block ids per group and the number of hit tokens.

    ``issuer`` and ``request_id`` say which manager issued the hit for which request:
    :meth:`pagedkv.KVCacheManager.allocate_slots` adopts a hit only from the manager that issued
    it, for the same request, and only while its blocks still hold the request's prefix
    (:class:`~pagedkv.errors.InvalidHitError` otherwise).
    """

    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    issuer: object = None
    request_id: str | None = None
    #: The pool's ``index_generation`` at the lookup and a copy of what it returned: while
    #: both still match, the blocks provably still hold the prefix (no O(n) hash check).
    generation: int = -1
    fingerprint: tuple[object, ...] = ()


class Coordinator:
    """The groups of one model, sharing ``pool``. Subclasses decide lookups.

    >>> from pagedkv.managers import FullAttentionManager
    >>> from pagedkv.specs import FullAttentionSpec
    >>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    >>> pool = BlockPool(8, hash_block_size=4)
    >>> coord = NoPrefixCacheCoordinator([FullAttentionManager(spec, pool, 0)], pool)
    >>> coord.allocate("r", None, 0, 0, 10, 0)      # 10 tokens -> 3 blocks
    ([1, 2, 3],)
    >>> coord.allocate("r", None, 10, 10, 30, 0) is None   # 8 blocks needed, 4 free
    True
    >>> coord.free("r"); pool.free_queue.num_free
    7
    """

    def __init__(self, managers: Sequence[SingleTypeManager], pool: BlockPool) -> None:
        self.managers = list(managers)
        self.pool = pool
        self._droppers = [m for m in self.managers if m.drops_blocks]
        self._cacheable = [m for m in self.managers if m.cacheable]
        self._no_hit: BlockTables = tuple([] for _ in self.managers)
        #: Per group: whether its new blocks are recorded for zeroing (set by the façade,
        #: see :meth:`pagedkv.KVCacheManager.take_new_block_ids`).
        self.zeroing: list[bool] = [False] * len(self.managers)
        #: Per group: block ids the engine must zero, since the last take.
        self.new_block_ids: list[list[int]] = [[] for _ in self.managers]
        #: Per group: the admission cap in blocks of ``full_sequence_must_fit`` (None: none).
        self.admission_cap_blocks: list[int | None] = [None] * len(self.managers)
        #: Every hit and registration lands on a multiple of this many tokens.
        self.cache_alignment_tokens = 1
        self._build_plans()

    def _build_plans(self) -> None:
        """Per-group data the hot paths read (call again after changing a manager's
        ``partial_hits``): the tables of the first group (every group tracks the same
        requests); per group ``(manager, block size, tables or None)`` for growing a
        request that holds blocks (tables only where the manager :attr:`grows_plainly
        <pagedkv.managers.base.SingleTypeManager.grows_plainly>`); per caching group
        ``(manager, block size, cached counts or None)`` (counts only where registering
        nothing new is a no-op, see :meth:`SingleTypeManager.registers_whole_blocks_only`)."""
        self._tables0 = self.managers[0].req_to_blocks
        self._grow_plan = [
            (m, m.block_size, m.req_to_blocks if m.grows_plainly else None)
            for m in self.managers
        ]
        self._cache_plan = [
            (m, m.block_size, m.num_cached_blocks if m.registers_whole_blocks_only() else None,
             m.caps_registration_itself)
            for m in self._cacheable
        ]
        # With hash lookahead every group registers only blocks its request has hashes for
        # (the coordinator caps the tokens, see cache_blocks).
        self._capped_at_hashes = any(m.hash_lookahead_tokens for m in self.managers)

    # ----------------------------------------------------------------- lookup

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[BlockTables, int] | None:
        """Per-group hit block ids and the hit length in tokens (``<= max_length``), or
        ``None`` when this coordinator makes no lookups (caching off). No state change."""
        raise NotImplementedError

    def hit_problem(
        self, block_hashes: list[bytes], hit: BlockTables, num_hit_tokens: int
    ) -> str | None:
        """Why ``hit`` cannot be adopted by a request with ``block_hashes`` (see
        :meth:`SingleTypeManager.hit_problem`), or None. No state change. O(hit blocks)."""
        if type(hit) is not tuple or len(hit) != len(self.managers):
            return f"a hit has one block list per group ({len(self.managers)}), got {hit!r}"
        for m, blocks in zip(self.managers, hit, strict=True):
            if type(blocks) is not list:
                return f"group {m.group}: block ids come as a list, got {blocks!r}"
            why = m.hit_problem(block_hashes, blocks, num_hit_tokens)
            if why is not None:
                return why
        return None

    # ----------------------------------------------------------------- requests

    def has_request(self, request_id: str) -> bool:
        """Whether the request holds a block table (it was allocated and not freed). O(1)."""
        return request_id in self.managers[0].req_to_blocks

    def request_ids(self) -> KeysView[str]:
        """The ids of the requests holding block tables (a live view). O(1)."""
        return self.managers[0].req_to_blocks.keys()

    def allocate(
        self,
        request_id: str,
        hit: BlockTables | None,
        num_computed_tokens: int,
        total_computed_tokens: int,
        num_tokens: int,
        num_encoder_tokens: int,
        num_tokens_main_model: int | None = None,
        headroom_blocks: int = 0,
        num_local_computed_tokens: int | None = None,
    ) -> BlockTables | None:
        """Give the request slots for ``num_tokens`` tokens in every group.

        ``hit``: the hit blocks a new request adopts (from a lookup), else ``None``;
        ``num_computed_tokens``: computed before this step (decides which blocks fell out
        of windows); ``total_computed_tokens``: plus the hit and external tokens;
        ``num_tokens_main_model``: ``num_tokens`` without lookahead slots (what groups that
        ignore lookahead, Mamba, are sized by; default ``num_tokens``);
        ``headroom_blocks``: free blocks the allocation must leave (vLLM's
        ``reserved_blocks`` plus the watermark; the façade computes it);
        ``num_local_computed_tokens``: computed plus hit tokens (external ones apart; only
        sub-block hits need it, see :class:`PartialHitCoordinator`).

        Order, as vLLM 0.33: free every group's blocks that fell out of its window (they
        are never read again, whatever this call decides), then check capacity for every
        group at once, then claim every group's hit blocks, then grow every table.
        Claiming all hits before any group allocates means one group's allocation can
        never evict another group's hit.

        Returns:
            The new block ids per group, or ``None`` when the pool is short; a refusal
            changes nothing except releasing the skipped blocks. O(blocks touched).
        """
        for m in self._droppers:
            m.remove_skipped_blocks(request_id, num_computed_tokens)
        if hit is None and request_id in self._tables0:
            return self._grow(request_id, num_tokens, num_encoder_tokens,
                              num_tokens_main_model, headroom_blocks, total_computed_tokens)
        managers = self.managers
        table_hit = hit if hit is not None else self._no_hit
        num_needed = 0
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        slots = [main if m.ignores_lookahead else m.slots_needed(num_tokens, num_encoder_tokens)
                 for m in managers]
        for g, m in enumerate(managers):
            num_needed += m.get_num_blocks_to_allocate(
                request_id, slots[g], table_hit[g], total_computed_tokens
            )
        pool = self.pool
        if num_needed + headroom_blocks > pool.free_queue.num_free:
            return None
        if hit is not None:
            # Claim every group's hit before any group allocates: an allocation takes
            # blocks from the front of the free queue and would evict an unclaimed hit.
            for g, m in enumerate(managers):
                pool.touch(m.claimed_hit_blocks(hit[g], total_computed_tokens))
        new_blocks = []
        zeroing = self.zeroing
        for g, m in enumerate(managers):
            m.save_new_computed_blocks(request_id, table_hit[g], total_computed_tokens)
            new = m.allocate_new_blocks(request_id, slots[g])
            if zeroing[g] and new:
                self.new_block_ids[g].extend(b for b in new if b)
            new_blocks.append(new)
        return tuple(new_blocks)

    def _grow(
        self,
        request_id: str,
        num_tokens: int,
        num_encoder_tokens: int,
        num_tokens_main_model: int | None,
        headroom_blocks: int,
        total_computed_tokens: int,
    ) -> BlockTables | None:
        """:meth:`allocate` for a request that already holds blocks and adopts no hit (a
        running request's next chunk or decode step, the common call), after the window
        release: the same capacity check and growth.

        NOTE: inlined for speed: in groups whose manager grows plainly (full attention,
        sliding window, chunked local) the table grows to ``ceil(num_tokens /
        block_size)`` blocks right here, without the four per-group method calls of
        :meth:`allocate` (they would do the same: no hit to claim or save). Other groups
        (Mamba, cross attention, sinks) go through their methods."""
        plan = self._grow_plan
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        counts: list[int] = []
        num_needed = 0
        for m, bs, tables in plan:
            if tables is not None:
                n = -(-num_tokens // bs) - len(tables[request_id])
            else:
                slots = main if m.ignores_lookahead else m.slots_needed(
                    num_tokens, num_encoder_tokens)
                n = m.get_num_blocks_to_allocate(request_id, slots, [], total_computed_tokens)
            counts.append(n)
            if n > 0:
                num_needed += n
        pool = self.pool
        if num_needed + headroom_blocks > pool.free_queue.num_free:
            return None
        out: list[list[int]] = []
        zeroing = self.zeroing
        for g, (m, _bs, tables) in enumerate(plan):
            if tables is not None:
                n = counts[g]
                if n <= 0:
                    out.append([])
                    continue
                new = pool.get_new_blocks(n)
                tables[request_id].extend(new)
            else:
                slots = main if m.ignores_lookahead else m.slots_needed(
                    num_tokens, num_encoder_tokens)
                new = m.allocate_new_blocks(request_id, slots)
            if zeroing[g] and new:
                self.new_block_ids[g].extend(b for b in new if b)
            out.append(new)
        return tuple(out)

    def num_blocks_for_full_sequence(
        self,
        request_id: str,
        hit: BlockTables | None,
        total_computed_tokens: int,
        num_tokens: int,
        num_encoder_tokens: int,
    ) -> int:
        """Free blocks the request needs to hold all its ``num_tokens`` tokens at once
        (``allocate_slots(..., full_sequence_must_fit=True)``, vLLM 0.33's admission gate
        for chunked prefill), each group's need capped at its admission cap
        (:attr:`admission_cap_blocks`: sliding window and chunked local recycle blocks, so
        a request never holds more). Counted before any skipped block is released. No
        state change.

        Worked case (sliding window 8 at block 4, cap 5 blocks): a new 40-token request
        needs ``min(10, 5) = 5`` blocks, not 10.
        """
        table_hit = hit if hit is not None else self._no_hit
        caps = self.admission_cap_blocks
        n = 0
        for g, m in enumerate(self.managers):
            slots = num_tokens if m.ignores_lookahead else m.slots_needed(
                num_tokens, num_encoder_tokens)
            cap = caps[g]
            if cap is not None and slots > cap * m.block_size:
                slots = cap * m.block_size
            n += m.get_num_blocks_to_allocate(request_id, slots, table_hit[g],
                                              total_computed_tokens)
        return n

    def cache_blocks(self, request: RequestLike, num_tokens: int) -> None:
        """Register the request's blocks that are full within its first ``num_tokens``
        tokens, in every group that caches. Precondition: the request holds blocks."""
        rid = request.request_id
        align = self.cache_alignment_tokens
        if align > 1:
            num_tokens = num_tokens // align * align
        # NOTE: the common case (no block became full) costs one comparison per group
        # instead of a chain of method calls (see _build_plans).
        hashed = num_tokens
        if self._capped_at_hashes:  # hash lookahead: only blocks the request has hashes for
            hashed = len(request.block_hashes) * self.pool.hash_block_size
            if hashed > num_tokens:
                hashed = num_tokens
        for m, bs, cached, caps_itself in self._cache_plan:
            if cached is None or hashed // bs > cached[rid]:
                m.cache_blocks(request, rid, num_tokens if caps_itself else hashed)

    def new_step_starts(self) -> None:
        """A scheduler step begins: every group resets its per-step bookkeeping."""
        for m in self.managers:
            m.new_step_starts()

    def free(self, request_id: str) -> None:
        """Release the request's blocks in every group, tail first; an unknown id is a
        no-op. O(blocks held)."""
        for m in self.managers:
            m.free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """Forget the request in every group without releasing its blocks: the tables
        concatenated in group order, each without its leading null blocks (vLLM 0.33's
        ``pop_blocks_for_free``). The caller releases them later, last first."""
        out: list[int] = []
        for m in self.managers:
            out.extend(m.pop_blocks_for_free(request_id))
        return out

    def block_ids(self, request_id: str) -> BlockTables:
        """Copies of the request's block tables. Precondition: it holds blocks."""
        return tuple(list(m.req_to_blocks[request_id]) for m in self.managers)

    def block_ids_for_computed_tokens(self, request_id: str, num_tokens: int) -> BlockTables:
        """Copies of the request's tables, attention groups clipped to the
        ``ceil(num_tokens / block_size)`` blocks covering ``num_tokens`` tokens (Mamba and
        cross-attention tables whole). Precondition: it holds blocks."""
        return tuple(
            list(m.req_to_blocks[request_id][: -(-num_tokens // m.block_size)])
            if m.positional else list(m.req_to_blocks[request_id])
            for m in self.managers
        )

    def num_token_slots(self, request_id: str) -> int:
        """Tokens the request's tables can hold in every caching group (the fewest of
        them; a large number when no group caches). Precondition: it holds blocks."""
        return min((len(m.req_to_blocks[request_id]) * m.block_size for m in self._cacheable),
                   default=1 << 62)

    def num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> list[int]:
        """Per group, the leading blocks every running request shares (0 where the kind
        has no cascade attention)."""
        return [m.get_num_common_prefix_blocks(request_id, num_running_requests)
                for m in self.managers]

    # ----------------------------------------------------------------- checks

    def iter_held_blocks(self) -> Iterator[int]:
        """Every block id held by any table of any group, once per holding."""
        for m in self.managers:
            yield from m.iter_held_blocks()

    def check_invariants(self, held_outside: dict[int, int] | None = None) -> None:
        """Each group's checks; every group tracks the same requests; every block's ref
        count equals the number of tables holding it plus ``held_outside[b]`` (references
        the engine holds outside tables: popped or copy-retained blocks).
        O(num_blocks + held blocks)."""
        pool = self.pool
        counts = [0] * pool.num_blocks
        for b, n in (held_outside or {}).items():
            counts[b] += n
        tracked: set[str] | None = None
        for m in self.managers:
            m.check_invariants()
            ids = set(m.req_to_blocks)
            assert tracked is None or ids == tracked, "groups track different requests"
            tracked = ids
        for b in self.iter_held_blocks():
            counts[b] += 1
        for b in range(1, pool.num_blocks):
            assert pool.ref_cnt[b] == counts[b], (
                f"block {b}: ref count {pool.ref_cnt[b]}, held {counts[b]} times (block "
                "tables and references held outside them)"
            )


class NoPrefixCacheCoordinator(Coordinator):
    """Caching off: no lookup, no hit adopted, nothing registered."""

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[BlockTables, int] | None:
        return None

    def hit_problem(
        self, block_hashes: list[bytes], hit: BlockTables, num_hit_tokens: int
    ) -> str | None:
        if num_hit_tokens or type(hit) is not tuple or any(hit):
            return "prefix caching is off: this manager hands out no hits"
        return None

    def allocate(
        self,
        request_id: str,
        hit: BlockTables | None,
        num_computed_tokens: int,
        total_computed_tokens: int,
        num_tokens: int,
        num_encoder_tokens: int,
        num_tokens_main_model: int | None = None,
        headroom_blocks: int = 0,
        num_local_computed_tokens: int | None = None,
    ) -> BlockTables | None:
        return super().allocate(request_id, None, num_computed_tokens, total_computed_tokens,
                                num_tokens, num_encoder_tokens, num_tokens_main_model,
                                headroom_blocks, num_local_computed_tokens)

    def cache_blocks(self, request: RequestLike, num_tokens: int) -> None:
        return


class UnitaryCoordinator(Coordinator):
    """One group: its own longest hit, and the allocation without per-group loops."""

    def __init__(self, managers: Sequence[SingleTypeManager], pool: BlockPool) -> None:
        super().__init__(managers, pool)
        assert len(self.managers) == 1
        self._manager = self.managers[0]

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[BlockTables, int] | None:
        m = self._manager
        blocks = m.find_longest_cache_hit(block_hashes, max_length)
        return (blocks,), len(blocks) * m.block_size

    def allocate(
        self,
        request_id: str,
        hit: BlockTables | None,
        num_computed_tokens: int,
        total_computed_tokens: int,
        num_tokens: int,
        num_encoder_tokens: int,
        num_tokens_main_model: int | None = None,
        headroom_blocks: int = 0,
        num_local_computed_tokens: int | None = None,
    ) -> BlockTables | None:
        """As :meth:`Coordinator.allocate`, for the one group."""
        m = self._manager
        if hit is None and m.grows_plainly:
            table = m.req_to_blocks.get(request_id)
            if table is not None:
                # NOTE: inlined for speed, as Coordinator._grow: a running request.
                if m.drops_blocks:
                    m.remove_skipped_blocks(request_id, num_computed_tokens)
                n = -(-num_tokens // m.block_size) - len(table)
                pool = self.pool
                if (n if n > 0 else 0) + headroom_blocks > pool.free_queue.num_free:
                    return None
                if n <= 0:
                    return ([],)
                new = pool.get_new_blocks(n)
                table.extend(new)
                if self.zeroing[0]:
                    self.new_block_ids[0].extend(b for b in new if b)
                return (new,)
        if m.ignores_lookahead and num_tokens_main_model is not None:
            slots = num_tokens_main_model
        else:
            slots = m.slots_needed(num_tokens, num_encoder_tokens)
        table_hit = hit[0] if hit is not None else []
        if m.drops_blocks:
            m.remove_skipped_blocks(request_id, num_computed_tokens)
        if m.get_num_blocks_to_allocate(
            request_id, slots, table_hit, total_computed_tokens
        ) + headroom_blocks > self.pool.free_queue.num_free:
            return None
        if hit is not None:
            self.pool.touch(m.claimed_hit_blocks(table_hit, total_computed_tokens))
        m.save_new_computed_blocks(request_id, table_hit, total_computed_tokens)
        new = m.allocate_new_blocks(request_id, slots)
        if self.zeroing[0] and new:
            self.new_block_ids[0].extend(b for b in new if b)
        return (new,)


class HybridCoordinator(Coordinator):
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
    lookup miss, without any lookup.
    """

    def __init__(self, managers: Sequence[SingleTypeManager], pool: BlockPool) -> None:
        super().__init__(managers, pool)
        self.lcm_block_size = lcm_block_size([m.spec for m in self.managers])
        self._full = [i for i, m in enumerate(self.managers)
                      if isinstance(m, FullAttentionManager)]
        self._others = [i for i, m in enumerate(self.managers)
                        if not isinstance(m, FullAttentionManager)]
        self._never_hits = any(not m.cacheable for m in self.managers)
        self._drop = [m.drop_last_hit for m in self.managers]
        for m in self.managers:
            m.hit_alignment_tokens = self.lcm_block_size
        self.cache_alignment_tokens = self.lcm_block_size

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[BlockTables, int] | None:
        """Per-group hit blocks and the common hit length (class docstring). Does not
        modify any state. Cost: one scan per full-attention group, plus one scan per other
        group and pass; passes are few (each one lowers the length by at least the lcm)."""
        managers = self.managers
        if self._never_hits:
            return tuple([] for _ in managers), 0
        lcm = self.lcm_block_size
        drop = self._drop
        length = max_length // lcm * lcm
        hits: list[list[int]] = [[] for _ in managers]

        def ask(i: int, length: int) -> int:
            """Group i's hit within ``length`` (one block more under drop_last_hit, since
            the group drops it again); returns the new common length."""
            m = managers[i]
            bound = min(length + m.block_size, max_length) if drop[i] else length
            hits[i] = m.find_longest_cache_hit(block_hashes, bound)
            got = len(hits[i]) * m.block_size
            return got // lcm * lcm if got < length else length

        for i in self._full:
            length = ask(i, length)
        changed = True
        while changed and length:
            changed = False
            for i in self._others:
                shorter = ask(i, length)
                changed = changed or shorter != length
                length = shorter
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
        for m in self.managers:
            m.hit_alignment_tokens = hbs
            if isinstance(m, MambaAlignManager):
                m.partial_hits = True
        self._partial_groups = [g for g, m in enumerate(self.managers)
                                if isinstance(m, (PartialHitFullManager, MambaAlignManager))]
        #: The managers of ``_partial_groups`` (the groups that queue copies).
        self._copying = [m for m in self.managers
                         if isinstance(m, (PartialHitFullManager, MambaAlignManager))]
        self._order = self._full + self._others
        self._simple = len(self.managers) == 2 and len(self._full) == 1
        # No rounding: a hit may end anywhere on a hash block boundary.
        self.cache_alignment_tokens = 1
        self._build_plans()  # the Mamba groups' registration changed (partial_hits)

    def hit_problem(
        self, block_hashes: list[bytes], hit: BlockTables, num_hit_tokens: int
    ) -> str | None:
        """As :meth:`Coordinator.hit_problem`, for hits on hash-block boundaries: in the
        full-attention and Mamba groups the last block must hold the key of the hit's
        prefix (the block it ends inside, or its last full block); full attention's
        earlier blocks are checked as usual, Mamba's must be null. No state change."""
        if type(hit) is not tuple or len(hit) != len(self.managers):
            return f"a hit has one block list per group ({len(self.managers)}), got {hit!r}"
        hbs = self.pool.hash_block_size
        if type(num_hit_tokens) is not int or num_hit_tokens % hbs:
            return f"a hit of {num_hit_tokens!r} tokens is not a multiple of {hbs}"
        pool = self.pool
        for g, (m, blocks) in enumerate(zip(self.managers, hit, strict=True)):
            if type(blocks) is not list or not all(type(b) is int for b in blocks):
                return f"group {g}: block ids come as a list of ints, got {blocks!r}"
            if g not in self._partial_groups or not num_hit_tokens:
                why = m.hit_problem(block_hashes, blocks, num_hit_tokens)
                if why is not None:
                    return why
                continue
            n = -(-num_hit_tokens // m.block_size)
            if len(blocks) != n:
                return (f"group {g}: a {num_hit_tokens}-token hit takes {n} blocks of "
                        f"{m.block_size}, got {len(blocks)}")
            i = num_hit_tokens // hbs - 1
            last = blocks[-1]
            key = block_hashes[i] if i < len(block_hashes) else None
            if key is None or not pool.has_entry(g, key, last):
                return (f"group {g}: block {last} no longer holds this request's first "
                        f"{num_hit_tokens} tokens (evicted or reused since the lookup)")
            head = blocks[:-1]
            if isinstance(m, MambaAlignManager):
                if any(head):
                    return f"group {g}: a Mamba hit holds one state, after null blocks"
            else:
                why = m.hit_problem(block_hashes, head, len(head) * m.block_size)
                if why is not None:
                    return why
        return None

    def _find(self, g: int, block_hashes: list[bytes], length: int) -> tuple[list[int], int]:
        m = self.managers[g]
        if isinstance(m, (PartialHitFullManager, MambaAlignManager)):
            return m.find_partial_hit(block_hashes, length)
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
                hits[g], cur = self._find(g, block_hashes, cur)
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
        num_encoder_tokens: int,
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
            for g in self._partial_groups:
                m = managers[g]
                assert isinstance(m, (PartialHitFullManager, MambaAlignManager))
                num_needed += m.count_partial(table_hit[g], local)
        pool = self.pool
        if num_needed + headroom_blocks > pool.free_queue.num_free:
            return None
        if hit is not None:
            for g, m in enumerate(managers):
                pool.touch(m.claimed_hit_blocks(hit[g], total_computed_tokens))
        for g, m in enumerate(managers):
            m.save_new_computed_blocks(request_id, table_hit[g], total_computed_tokens)
        if hit is not None:
            for g in self._partial_groups:
                m = managers[g]
                assert isinstance(m, (PartialHitFullManager, MambaAlignManager))
                m.adopt_partial_hit(request_id, table_hit[g], local)
        new_blocks = []
        zeroing = self.zeroing
        for g, m in enumerate(managers):
            copies = len(m.pending_copies) if isinstance(m, PartialHitFullManager) else 0
            new = m.allocate_new_blocks(request_id, slots[g])
            if zeroing[g]:
                self.new_block_ids[g].extend(b for b in new if b)
            elif copies != (len(m.pending_copies) if isinstance(m, PartialHitFullManager)
                            else 0):
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
