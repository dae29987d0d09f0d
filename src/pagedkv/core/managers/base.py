"""The bookkeeping every attention kind shares: request -> blocks, request -> number of
blocks already registered in the prefix index.

Token line of one request (``allocate_slots`` arithmetic)::

    | computed | new computed (hit) | new | lookahead |
    |<------ total computed ------>|
    |<----------------- num_tokens needing a slot ----------->|

Worked cases (block size 4):

* 10 tokens need a slot, the request holds 2 blocks, the hit brings 0:
  ceil(10 / 4) - 2 = 1 new block.
* a new request with a 3-block hit whose last block is free (ref count 0) and 14 tokens
  needing a slot: ceil(14 / 4) - 3 = 1 new block, plus 1 for reviving the free hit block
  (it leaves the free queue) = 2 blocks of capacity needed.

>>> from pagedkv.core.managers import FullAttentionManager
>>> from pagedkv.core.pool import BlockPool
>>> from pagedkv.core.specs import FullAttentionSpec
>>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
>>> pool = BlockPool(16, hash_block_size=4)
>>> m = FullAttentionManager(spec, pool, 0)
>>> m.save_new_computed_blocks("r", [], 0); m.allocate_new_blocks("r", 8)
[1, 2]
>>> m.get_num_blocks_to_allocate("r", 10, [])               # first case: 1 new block
1
>>> m.free("r")                                             # blocks 1, 2 now free
>>> m.get_num_blocks_to_allocate("s", 14, [1, 2])          # 2 new + 2 revived hit blocks
4
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import ClassVar, TypeVar

from pagedkv.core.managers.boundary_states import BoundaryStateOffloads
from pagedkv.core.pool import BlockPool
from pagedkv.core.request import RequestLike
from pagedkv.core.specs import KVCacheSpec
from pagedkv.errors import InvalidArgumentError

__all__ = ["SingleTypeManager", "manager_class_for", "register_manager"]

_REGISTRY: dict[type[KVCacheSpec], type[SingleTypeManager]] = {}
_M = TypeVar("_M", bound="type[SingleTypeManager]")
_INT_ONLY = frozenset({int})


def register_manager(*spec_types: type[KVCacheSpec]) -> Callable[[_M], _M]:
    """Class decorator: the decorated manager serves layers of ``spec_types``."""

    def deco(cls: _M) -> _M:
        for t in spec_types:
            _REGISTRY[t] = cls
        return cls

    return deco


def manager_class_for(
    spec: KVCacheSpec, *, enable_caching: bool = True
) -> type[SingleTypeManager]:
    """The manager class registered for ``spec``'s class or its nearest base (which may
    hand the spec to a variant, e.g. Mamba with prefix caching on).

    Raises:
        InvalidArgumentError: no manager serves this kind of spec.
    """
    for t in type(spec).__mro__:
        cls = _REGISTRY.get(t)
        if cls is not None:
            return cls.variant_for(spec, enable_caching=enable_caching)
    raise InvalidArgumentError(f"no KV-cache manager is registered for {type(spec).__name__}")


class SingleTypeManager:
    """Block tables of one KV-cache group.

    Subclasses override the lookup rule (:meth:`find_longest_cache_hit`), which blocks a
    request stops needing (:meth:`remove_skipped_blocks`) and cascade support.
    """

    #: Whether :meth:`remove_skipped_blocks` can ever free anything (lets the façade skip
    #: the call for kinds that never drop blocks).
    drops_blocks: ClassVar[bool] = False
    #: Whether blocks of this kind are registered in the prefix index.
    cacheable: ClassVar[bool] = True
    #: Whether the group takes part in prefix-cache lookups. False (a scratch group: SWA-MLA
    #: with bounded replay, never cacheable): its part of every hit is empty whatever the
    #: hit's length, it neither shortens nor prevents the other groups' hit, and the caller
    #: recomputes its KV (see :mod:`pagedkv.core.managers.window_mla`).
    joins_lookup: ClassVar[bool] = True
    #: Whether the table is sized by the main model's tokens only (no lookahead slots).
    ignores_lookahead: ClassVar[bool] = False
    #: Whether table position i stands for tokens ``i*bs .. i*bs + bs - 1`` (attention
    #: kinds), so a table can be clipped to the blocks covering computed tokens.
    positional: ClassVar[bool] = True
    #: Whether, for a request that holds a table and adopts no hit, this kind needs
    #: ``max(0, ceil(num_tokens / block_size) - len(table))`` blocks and
    #: :meth:`allocate_new_blocks` appends exactly that many fresh blocks (the base
    #: rules, ``slots_needed`` being ``num_tokens``). The coordinator then grows such
    #: tables itself, without the method calls; a subclass that changes any of these
    #: rules sets it to False.
    grows_plainly: ClassVar[bool] = True
    #: Tokens after each block its hash covers (``CacheConfig.num_hash_lookahead_tokens``;
    #: set by :func:`pagedkv.core.hashing_lookahead.apply_to_managers`). With L > 0 a manager
    #: registers only blocks its request has hashes for.
    hash_lookahead_tokens = 0
    #: Whether :meth:`pop_blocks_for_free` keeps the table's leading null blocks (vLLM
    #: 0.32; ``CacheConfig.vllm_release``, set at construction by the factory).
    keep_null_head = False
    #: Whether :meth:`cache_blocks` caps what it registers at the request's hashed tokens
    #: itself (and wants the uncapped count): the coordinator caps it for the others.
    caps_registration_itself: ClassVar[bool] = False
    #: Whether a table of this kind may hold the null block (windowed and state kinds;
    #: full attention never, which spares callers a scan of its tables).
    may_hold_null_blocks: ClassVar[bool] = True
    #: Whether every block-aligned prefix of a hit is a hit too (full attention): a hybrid
    #: coordinator looks such a group up once, first, and afterwards only truncates it;
    #: the other groups are asked again on every pass (a window run says nothing of a
    #: shorter prefix).
    prefix_closed_hits: ClassVar[bool] = False
    #: Whether a group of this kind whose block is larger than the hash block turns
    #: sub-block hits on for its model (vLLM 0.33: an align-mode Mamba group); see
    #: :func:`pagedkv.core.partial_hits.partial_hits_enabled`.
    drives_partial_hits: ClassVar[bool] = False
    #: The class serving this kind in a model with sub-block hits (a
    #: :class:`~pagedkv.core.managers.partial.PartialHitManager`); None: the kind cannot
    #: end a hit inside a block, so such a model needs its block to be the hash block
    #: (or the kind never caches).
    partial_hit_class: ClassVar[type[SingleTypeManager] | None] = None
    #: What a hit of this kind is, for explanations of a shortened hit
    #: (:mod:`pagedkv.observe`): ``"prefix"`` (blocks from the start), ``"window"`` (a run
    #: of blocks ending at the hit), ``"chunk"`` (the current chunk's run), ``"state"``
    #: (one state block), ``"never"`` (never hits); ``"other"`` for none of these.
    hit_shape: ClassVar[str] = "other"
    #: Whether the kind can record the states it registers for a KV connector (align-mode
    #: Mamba; :mod:`pagedkv.core.managers.boundary_states`).
    records_boundary_states: ClassVar[bool] = False
    #: Those records when kept (``CacheConfig.record_boundary_states``; set by the
    #: factory), else None.
    offloads: BoundaryStateOffloads | None = None
    #: The same kind without ``drop_last_hit`` (built on first use, lookups only).
    _undropped: SingleTypeManager | None = None

    def admission_cap_blocks(self, max_model_len: int, max_in_flight_tokens: int) -> int | None:
        """The most blocks a request's table of this kind can need at once under
        ``full_sequence_must_fit`` (None: its whole length)."""
        return None

    def __init__(
        self,
        spec: KVCacheSpec,
        pool: BlockPool,
        group: int,
        *,
        drop_last_hit: bool = False,
    ) -> None:
        self.spec = spec
        self.block_size = spec.block_size
        self.pool = pool
        self.group = group
        #: Hash blocks per block of this group (block size / hash block size).
        self.hash_stride = spec.block_size // pool.hash_block_size
        if self.hash_stride * pool.hash_block_size != spec.block_size:
            raise InvalidArgumentError(
                f"group {group}: block size {spec.block_size} is not a multiple of the hash "
                f"block size {pool.hash_block_size}"
            )
        self.drop_last_hit = drop_last_hit
        #: Token multiple every prefix-cache hit lands on: the block size alone, the lcm of
        #: all block sizes in a hybrid model (set by the coordinator).
        self.hit_alignment_tokens = spec.block_size
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_blocks: dict[str, int] = {}

    @classmethod
    def variant_for(
        cls, spec: KVCacheSpec, *, enable_caching: bool = True
    ) -> type[SingleTypeManager]:
        """The class that serves ``spec`` (a registered class may hand a spec option or
        the caching mode to a subclass, e.g. Mamba). Default: ``cls`` itself."""
        return cls

    # ----------------------------------------------------------------- lookup

    def group_hashes(self, block_hashes: list[bytes]) -> list[bytes]:
        """The hashes that end at this group's block boundaries."""
        k = self.hash_stride
        return block_hashes if k == 1 else block_hashes[k - 1 :: k]

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """The longest run of cached blocks valid for this group, covering at most
        ``max_length`` tokens, as block ids (null blocks where the kind needs none).
        Does not modify any state."""
        raise NotImplementedError

    def find_hit_without_drop(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """:meth:`find_longest_cache_hit` as this kind answers without ``drop_last_hit``
        (:mod:`pagedkv.core.eagle_hits`): a twin built without the drop over the same
        pool and group answers (lookups only read the pool). No state change."""
        if not self.drop_last_hit:
            return self.find_longest_cache_hit(block_hashes, max_length)
        twin = self._undropped
        if twin is None:
            twin = type(self)(self.spec, self.pool, self.group)
            twin.hit_alignment_tokens = self.hit_alignment_tokens
            self._undropped = twin
        return twin.find_longest_cache_hit(block_hashes, max_length)

    def max_hit_nulls(self, num_hit_tokens: int) -> int:
        """How many leading null blocks a hit of ``num_hit_tokens`` tokens may have: the
        blocks whose KV the next token never reads. Default: none."""
        return 0

    def hit_span(self, num_hit_tokens: int) -> tuple[int, int]:
        """The table positions ``[start, end)`` whose cached blocks a hit of
        ``num_hit_tokens`` tokens needs (earlier ones may be null): after the
        :meth:`max_hit_nulls` leading nulls, up to the hit's end. Full attention, 12
        tokens at block 4: (0, 3); window 8: (1, 3); a Mamba state: (2, 3). No state change."""
        return self.max_hit_nulls(num_hit_tokens), num_hit_tokens // self.block_size

    def load_position(self, request_id: str, start: int) -> int:
        """Where, in the request's table, the KV of hit positions ``start ..`` arrives when
        they came as external tokens (a host-tier load): the allocation that adopted them
        put fresh blocks there. Default: the same positions. No state change."""
        return start

    def hit_problem(
        self, block_hashes: list[bytes], blocks: list[int], num_hit_tokens: int
    ) -> str | None:
        """Why ``blocks`` cannot be adopted as this group's part of a hit of
        ``num_hit_tokens`` tokens for a request with ``block_hashes``, or None when it can:
        it covers exactly the hit, its null blocks are a prefix of at most
        :meth:`max_hit_nulls`, and every other entry is a block of this pool that still
        carries, in this group, the hash ending at its boundary (so its KV is this
        request's prefix). Does not modify any state. O(len(blocks)).
        """
        g = self.group
        if not self.cacheable:
            if blocks or (num_hit_tokens and self.joins_lookup):
                return f"group {g} ({type(self).__name__}) never hits, but the hit has blocks"
            return None
        n = len(blocks)
        if n * self.block_size != num_hit_tokens:
            return (f"group {g}: {n} blocks of {self.block_size} tokens cannot hold a "
                    f"{num_hit_tokens}-token hit")
        if not set(map(type, blocks)) <= _INT_ONLY:
            return f"group {g}: block ids must be ints, got {blocks!r}"
        nulls = 0
        while nulls < n and not blocks[nulls]:
            nulls += 1
        if nulls > self.max_hit_nulls(num_hit_tokens):
            return (f"group {g}: {nulls} leading null blocks, but the next token reads the KV "
                    f"of block {self.max_hit_nulls(num_hit_tokens)}")
        real = blocks[nulls:]
        if not real:
            return None
        pool = self.pool
        if min(real) < 1 or max(real) >= pool.num_blocks:
            return (f"group {g}: after the leading nulls, block ids must be in "
                    f"1..{pool.num_blocks - 1}, got {real!r}")
        k = self.hash_stride
        bh = pool.block_hash
        want = block_hashes[(nulls + 1) * k - 1 : n * k : k]
        got = itemgetter(*real)(bh) if len(real) > 1 else (bh[real[0]],)
        if list(got) != want:
            return (f"group {g}: the blocks no longer hold this request's prefix (evicted or "
                    "reused since the lookup, or never cached under its hashes)")
        if len(pool.index) > 1:
            bg = pool.block_group
            for b in real:
                if bg[b] != g:
                    return f"group {g}: block {b} is cached for group {bg[b]}"
        return None

    # ----------------------------------------------------------------- allocation

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed: list[int],
        total_computed_tokens: int = 0,
    ) -> int:
        """Free blocks needed to give the request ``num_tokens`` slots after adopting
        ``new_computed``: new blocks, plus hit blocks that must leave the free queue.
        ``total_computed_tokens`` (hit plus external tokens) matters only to kinds that
        skip blocks (see :class:`SkippingManager`). Does not modify any state."""
        held = self.req_to_blocks.get(request_id)
        n = -(-num_tokens // self.block_size) - len(new_computed) - (len(held) if held else 0)
        if n < 0:  # lookahead slots held from an earlier step: none needed (vLLM: max(.., 0))
            n = 0
        if new_computed:
            ref = self.pool.ref_cnt
            for b in new_computed:
                if b and ref[b] == 0:
                    n += 1
        return n

    def slots_needed(self, num_tokens: int, num_encoder_tokens: int) -> int:
        """Token slots this group must hold for a request needing ``num_tokens`` decoder
        slots (cross attention sizes by the encoder instead)."""
        return num_tokens

    def claimed_hit_blocks(self, new_computed: list[int], total_computed_tokens: int) -> list[int]:
        """The hit blocks a new request will really hold, which the façade claims
        (``pool.touch``) for every group before any group allocates. Default: all of them.
        Does not modify any state."""
        return new_computed

    def save_new_computed_blocks(
        self, request_id: str, new_computed: list[int], total_computed_tokens: int
    ) -> None:
        """Start a new request's table with its hit blocks (already touched by the caller).

        A request that already has a table keeps it (the façade rejects hit blocks for it
        before any state changes). ``total_computed_tokens`` includes externally computed
        tokens; kinds that skip blocks use it to place null blocks.
        """
        if request_id in self.req_to_blocks:
            return
        self.req_to_blocks[request_id] = list(new_computed)
        self.num_cached_blocks[request_id] = len(new_computed)

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens no future token reads once ``num_computed_tokens`` are computed
        (vLLM's ``get_num_skipped_tokens``). Default: none; windowed and state kinds
        override it (:class:`~pagedkv.core.managers.skipping.SkippingManager`)."""
        return 0

    def allocate_external_blocks(self, request_id: str, num_local_computed_tokens: int,
                                 total_computed_tokens: int) -> list[int]:
        """Blocks for a new request's external tokens (a KV connector's load of the tokens
        ``num_local_computed_tokens .. total_computed_tokens``), after every group adopted
        its hit and before any group takes blocks for new tokens (vLLM 0.33 and 0.32's
        ``allocate_external_computed_blocks``): the table grows to ``ceil(total /
        block_size)`` blocks unless every external token is skipped (outside the window;
        a state kind keeps the last one, so it gets one block for the loaded state).
        Cross attention (never hits, not positional) and Mamba without caching take none.
        Returns the new blocks. Precondition: the table was started.

        Worked case (window 8, block 4, a 1-block hit ``[b]``, 8 external tokens): 12
        computed, 5 skipped -> the table starts ``[0]`` (the hit block lies in the skipped
        prefix) and gets 2 new blocks, for tokens 4..11.
        """
        external = total_computed_tokens - num_local_computed_tokens
        if external <= 0 or (self.hit_shape == "never" and not self.positional):
            return []
        skipped = self.num_skipped_tokens(total_computed_tokens)
        if skipped > 0 and total_computed_tokens - skipped <= 0:
            return []
        table = self.req_to_blocks[request_id]
        n = -(-total_computed_tokens // self.block_size) - len(table)
        if n <= 0:
            return []
        new = self.pool.get_new_blocks(n)
        table.extend(new)
        return new

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """Grow the request's table to ``ceil(num_tokens / block_size)`` blocks; return the
        new ones. Precondition: capacity was checked."""
        blocks = self.req_to_blocks[request_id]
        n = -(-num_tokens // self.block_size) - len(blocks)
        if n <= 0:
            return []
        new = self.pool.get_new_blocks(n)
        blocks.extend(new)
        return new

    def cache_blocks(self, request: RequestLike, request_id: str, num_tokens: int) -> None:
        """Register the request's blocks that are full within its first ``num_tokens``
        tokens and not registered yet (those :meth:`reachable_mask` allows)."""
        num_full = num_tokens // self.block_size
        num_cached = self.num_cached_blocks[request_id]
        if num_full > num_cached:
            self.pool.cache_full_blocks(
                request, self.req_to_blocks[request_id], num_cached, num_full, self.group,
                self.reachable_mask(num_cached, num_full),
            )
            self.num_cached_blocks[request_id] = num_full

    def registers_whole_blocks_only(self) -> bool:
        """Whether :meth:`cache_blocks` does nothing unless a block became full
        (``num_tokens // block_size`` above the request's registered count), so the
        coordinator may skip the call. True for the base rule; a subclass registering
        anything else (partial-prefix keys) returns False. No state change."""
        return True

    def reachable_mask(self, start: int, end: int) -> list[bool] | None:
        """Which of the table positions ``[start, end)`` a later hit could ever use (only
        those are registered); ``None``: all of them (the default). No state change."""
        return None

    def new_step_starts(self) -> None:
        """A scheduler step begins (per-step bookkeeping resets). Default: nothing."""

    def free(self, request_id: str) -> None:
        """Release the request's blocks, tail first (deepest prefix blocks evicted first)."""
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_blocks.pop(request_id, None)
        if blocks:
            blocks.reverse()
            self.pool.free_blocks(blocks)

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """Forget the request without releasing its blocks: its table without the leading
        null blocks, in table order (the caller releases them last first). ``[]`` for an
        unknown id."""
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_blocks.pop(request_id, None)
        if not blocks:
            return []
        if blocks[0] or self.keep_null_head:
            return blocks
        for i, b in enumerate(blocks):  # the first real block (nulls lead)
            if b:
                return blocks[i:]
        return []

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Replace blocks the request no longer needs by the null block and free them."""

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        """Leading blocks shared by every running request (for cascade attention)."""
        return 0

    def iter_held_blocks(self) -> Iterator[int]:
        """Every block id held by any request of this group, once per holding (the null
        block included). The façade's invariant check counts ref counts with it. O(held)."""
        for blocks in self.req_to_blocks.values():
            yield from blocks

    def check_invariants(self) -> None:
        """Assert per-request state is consistent with the pool."""
        pool = self.pool
        assert set(self.num_cached_blocks) == set(self.req_to_blocks), (
            f"group {self.group}: cached-count map and block-table map track different requests"
        )
        for rid, blocks in self.req_to_blocks.items():
            nc = self.num_cached_blocks[rid]
            assert 0 <= nc <= len(blocks), f"{rid}: {nc} cached of {len(blocks)} blocks"
            for b in blocks:
                assert 0 <= b < pool.num_blocks, f"{rid}: invalid block id {b}"
                if b:
                    assert pool.ref_cnt[b] > 0, f"{rid}: holds block {b} with ref count 0"
