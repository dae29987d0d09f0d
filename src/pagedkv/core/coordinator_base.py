"""The coordinator base: the groups of one model as one unit (see
:mod:`pagedkv.core.coordinator` for the family): the per-group loops of allocating, registering
and freeing a request's blocks, and the hit a lookup hands out (:class:`ComputedBlocks`).

Lookups never change state; a refused :meth:`Coordinator.allocate` changes nothing except
releasing the blocks that fell out of the request's windows (as vLLM 0.33 does).
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView, Sequence
from typing import NamedTuple, cast

from pagedkv.core.external_blocks import allocate_external, uncounted_blocks
from pagedkv.core.group_allocation import (
    admission_plan,
    free_plan,
    full_sequence_blocks,
    grow_running,
)
from pagedkv.core.group_hits import group_hit_problem, truncate_hit
from pagedkv.core.kernels import kernels
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.pool import BlockPool
from pagedkv.core.reprefill import cache_finalized, unitary_cacheable_tokens
from pagedkv.core.request import RequestLike
from pagedkv.errors import InvalidArgumentError

__all__ = ["BlockTables", "ComputedBlocks", "Coordinator"]

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
    #: Per group, its own hit length (a :meth:`find_hit_per_group` hit), else None.
    group_tokens: tuple[int, ...] | None = None


class Coordinator:
    """The groups of one model, sharing ``pool``. Subclasses decide lookups.

    >>> from pagedkv.core.managers import FullAttentionManager
    >>> from pagedkv.core.specs import FullAttentionSpec
    >>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    >>> from pagedkv.core.coordinator_simple import NoPrefixCacheCoordinator
    >>> pool = BlockPool(8, hash_block_size=4)
    >>> coord = NoPrefixCacheCoordinator([FullAttentionManager(spec, pool, 0)], pool)
    >>> coord.allocate("r", None, num_computed_tokens=0, total_computed_tokens=0,
    ...                num_tokens=10)                  # 10 tokens -> 3 blocks
    ([1, 2, 3],)
    >>> coord.allocate("r", None, num_computed_tokens=10, total_computed_tokens=10,
    ...                num_tokens=30) is None          # 8 blocks needed, 4 free
    True
    >>> coord.free("r"); pool.free_queue.num_free
    7
    """

    #: Groups whose external-token blocks are not zeroed (set around one allocate_slots).
    skip_zeroing_group_ids: tuple[int, ...] = ()
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
        #: Computed tokens a drafter may prefill again, never registered (reprefill.py).
        self.num_reprefillable_tokens = 0
        #: A new request's allocation in every group at once (kernels_hybrid.admit_groups;
        #: picked here, compiled or pure).
        self._admit = kernels().admit_groups
        #: A request's free in every group at once (kernels_hybrid_step.free_groups).
        self._free_groups = kernels().free_groups
        self._build_plans()

    def _build_plans(self) -> None:
        """Per-group data the hot paths read (call again after changing a manager's
        ``partial_hits``): the tables of the first group (every group tracks the same
        requests); per group ``(manager, block size, tables or None)`` for growing a
        request that holds blocks (tables only where the manager :attr:`grows_plainly
        <pagedkv.core.managers.base.SingleTypeManager.grows_plainly>`); per caching group
        ``(manager, block size, cached counts or None)`` (counts only where registering
        nothing new is a no-op, see :meth:`SingleTypeManager.registers_whole_blocks_only`)."""
        self._tables0 = self.managers[0].req_to_blocks
        #: Per group its admission plan entry (kernels_hybrid.admission_plan), or None
        #: where a group admits by rules of its own (then the methods below).
        self._admit_plan = admission_plan(self.managers)
        #: Every group's free by the base rule in one kernel call, or None (free_plan).
        self._free_plan = free_plan(self.managers)
        #: The groups with per-step bookkeeping (a new_step_starts of their own).
        self._steppers = [m for m in self.managers
                          if type(m).new_step_starts is not SingleTypeManager.new_step_starts]
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
        return group_hit_problem(self, block_hashes, hit, (num_hit_tokens,) * len(self.managers))

    def group_hit_problem(self, block_hashes: list[bytes], hit: BlockTables,
                          group_tokens: tuple[int, ...]) -> str | None:
        """As :meth:`hit_problem`, group ``g`` checked at ``group_tokens[g]`` tokens."""
        return group_hit_problem(self, block_hashes, hit, group_tokens)

    def group_problem(self, g: int, block_hashes: list[bytes], blocks: list[int],
                      num_hit_tokens: int) -> str | None:
        """Why group ``g``'s blocks of a ``num_hit_tokens``-token hit cannot be adopted."""
        return self.managers[g].hit_problem(block_hashes, blocks, num_hit_tokens)

    def find_group_hit(self, g: int, block_hashes: list[bytes], length: int
                       ) -> tuple[list[int], int]:
        """Group ``g``'s own hit within ``length`` tokens and its length. No state change."""
        m = self.managers[g]
        blocks = m.find_longest_cache_hit(block_hashes, length)
        return blocks, len(blocks) * m.block_size

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
        num_encoder_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        headroom_blocks: int = 0,
        num_local_computed_tokens: int | None = None,
    ) -> BlockTables | None:
        """Give the request slots for ``num_tokens`` tokens in every group.

        ``hit``: the hit blocks a new request adopts, else ``None``; ``num_computed_tokens``:
        computed before this step (decides which blocks fell out of windows);
        ``total_computed_tokens``: plus the hit and external tokens; ``num_tokens_main_model``:
        ``num_tokens`` without lookahead slots (Mamba's size; default ``num_tokens``);
        ``headroom_blocks``: free blocks to leave (vLLM's ``reserved_blocks`` plus the
        watermark); ``num_local_computed_tokens``: computed plus hit tokens (the external
        ones, up to ``total_computed_tokens``, get their blocks first; None: no external).

        Order, as vLLM: free every group's blocks that fell out of its window, check
        capacity for every group at once (as vLLM counts, see external_blocks.py), claim
        every group's hit blocks (so no group's allocation evicts another's), give every
        group its external tokens' blocks (not returned), then grow every table. Returns
        the new block ids per group, or ``None`` (the pool is short: nothing changed but
        the skipped blocks' release).
        """
        plan = self._admit_plan
        if plan is not None and request_id not in self._tables0 and (
                num_local_computed_tokens is None
                or total_computed_tokens <= num_local_computed_tokens):
            # A new request without external tokens: every group at once (no group holds
            # it, so no window releases anything).
            pool = self.pool
            return self._admit(  # type: ignore[no-any-return]
                plan, request_id, hit, total_computed_tokens, num_tokens,
                num_tokens if num_tokens_main_model is None else num_tokens_main_model,
                headroom_blocks, pool.free_queue.num_free, pool.ref_cnt, pool.touch,
                pool.get_new_blocks, self.zeroing, self.new_block_ids)
        for m in self._droppers:
            m.remove_skipped_blocks(request_id, num_computed_tokens)
        if hit is None and request_id in self._tables0:
            return self._grow(request_id, num_tokens, num_encoder_tokens,
                              num_tokens_main_model, headroom_blocks, total_computed_tokens)
        managers, num_needed = self.managers, 0
        table_hit = hit if hit is not None else self._no_hit
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        slots = [main if m.ignores_lookahead else m.slots_needed(num_tokens, num_encoder_tokens)
                 for m in managers]
        for g, m in enumerate(managers):
            num_needed += m.get_num_blocks_to_allocate(request_id, slots[g], table_hit[g],
                                                       total_computed_tokens)
        pool = self.pool
        local = num_local_computed_tokens
        loads = local is not None and total_computed_tokens > local
        extra = uncounted_blocks(managers, slots, total_computed_tokens) if loads else 0
        if num_needed + max(headroom_blocks, extra) > pool.free_queue.num_free:
            return None
        if hit is not None:
            for g, m in enumerate(managers):
                pool.touch(m.claimed_hit_blocks(hit[g], total_computed_tokens))
        for g, m in enumerate(managers):
            m.save_new_computed_blocks(request_id, table_hit[g], total_computed_tokens)
        if loads:
            allocate_external(managers, request_id, cast(int, local), total_computed_tokens,
                              self.zeroing, self.new_block_ids, self.skip_zeroing_group_ids)
        new_blocks = []
        zeroing = self.zeroing
        for g, m in enumerate(managers):
            new = m.allocate_new_blocks(request_id, slots[g])
            if zeroing[g] and new:
                self.new_block_ids[g].extend(b for b in new if b)
            new_blocks.append(new)
        return tuple(new_blocks)

    def _grow(self, request_id: str, num_tokens: int, num_encoder_tokens: int,
              num_tokens_main_model: int | None, headroom_blocks: int,
              total_computed_tokens: int) -> BlockTables | None:
        """:meth:`allocate` for a running request adopting no hit, after the window
        release (:func:`~pagedkv.core.group_allocation.grow_running`)."""
        return grow_running(self, request_id, num_tokens, num_encoder_tokens,
                            num_tokens_main_model, headroom_blocks, total_computed_tokens)

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
        return full_sequence_blocks(self.managers, self.admission_cap_blocks, request_id,
                                    hit if hit is not None else self._no_hit,
                                    total_computed_tokens, num_tokens, num_encoder_tokens)

    def cache_blocks(self, request: RequestLike, num_tokens: int) -> None:
        """Register the request's blocks that are full within its first ``num_tokens``
        tokens, in every group that caches. Precondition: the request holds blocks."""
        rid = request.request_id
        if self.num_reprefillable_tokens:
            cache_finalized(self, self._cache_plan, request, num_tokens)
            return
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

    def cacheable_tokens(self, num_tokens: int, m: SingleTypeManager) -> int:
        """What group ``m`` registers of ``num_tokens`` with re-prefillable tokens."""
        return unitary_cacheable_tokens(num_tokens, self.num_reprefillable_tokens)

    def remove_skipped_blocks(self, request_id: str, num_processed_tokens: int) -> None:
        """Every dropping group releases the request's blocks no token after the first
        ``num_processed_tokens`` reads (see :meth:`SkippingManager.remove_skipped_blocks`)."""
        for m in self._droppers:
            m.remove_skipped_blocks(request_id, num_processed_tokens)

    def new_step_starts(self) -> None:
        """A scheduler step begins: every group resets its per-step bookkeeping (those
        whose class keeps the base no-op skipped)."""
        for m in self._steppers:
            m.new_step_starts()

    def free(self, request_id: str) -> None:
        """Release the request's blocks in every group, tail first; an unknown id is a
        no-op. O(blocks held)."""
        plan = self._free_plan
        if plan is not None:
            self._free_groups(plan, request_id, self.pool.free_blocks)
            return
        for m in self.managers:
            m.free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """Forget the request in every group without releasing its blocks: the tables
        concatenated in group order, each without its leading null blocks (vLLM 0.33's
        ``pop_blocks_for_free``). The caller releases them later, last first."""
        managers = self.managers
        if len(managers) == 1:
            return managers[0].pop_blocks_for_free(request_id)
        out: list[int] = []
        for m in managers:
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

    def truncate(self, hit: BlockTables, num_tokens: int) -> BlockTables:
        """``hit`` cut at ``num_tokens`` (:func:`pagedkv.core.group_hits.truncate_hit`).

        Raises:
            InvalidArgumentError: not a multiple of a caching group's block size.
        """
        return truncate_hit(self.managers, hit, num_tokens)

    def take_new_block_ids(self) -> list[int]:
        """The zeroed groups' blocks allocated (or recorded) since the last call."""
        out: list[int] = []
        for ids in self.new_block_ids:
            out.extend(ids)
            ids.clear()
        return out

    def record_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Record the request's blocks from ``start_token`` on again in every zeroed group.

        Raises:
            InvalidArgumentError: ``start_token`` is not a multiple of a zeroed group's
                block size (nothing recorded).
        """
        zeroing = self.zeroing
        managers = self.managers
        for m in managers:
            if zeroing[m.group] and start_token % m.block_size:
                raise InvalidArgumentError(
                    f"start_token={start_token} is not a multiple of group {m.group}'s block "
                    f"size {m.block_size}; zero from a block boundary")
        new_ids = self.new_block_ids
        for m in managers:
            if zeroing[m.group]:
                new_ids[m.group] += m.req_to_blocks[request_id][start_token // m.block_size:]

    def take_copies(self) -> list[tuple[int, int]]:
        """Block copies queued since the last call (sub-block hits only; none here)."""
        return []

    def iter_pending_copy_blocks(self) -> Iterator[int]:
        """Both blocks of every queued copy (sub-block hits only; none here)."""
        return iter(())

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
