"""Mamba / linear-attention state: a fixed-size recurrent state per request.

Three classes, chosen by caching and ``MambaSpec.cache_checkpoints`` (see ``variant_for``):

* :class:`MambaAlignManager` (prefix caching on, the default): vLLM 0.33's
  ``mamba_cache_mode="align"``, block for block (below).
* :class:`MambaManager` (prefix caching off): one state block per request, whatever its
  length; never registered (vLLM's mode ``"none"``).
* :class:`MambaCheckpointManager` (``cache_checkpoints=True``, an option kept from earlier
  pagedkv versions, not vLLM's behaviour): a state checkpoint at every ``block_size``
  boundary, all held until they are passed (module notes below).

**Align mode** (``bs`` = the group's block size). A table holds one live state block at
position ``ceil(t / bs) - 1`` (``t`` = tokens the main model has after this step; lookahead
slots are ignored), nulls before it:

* allocation: when ``ceil(t / bs)`` exceeds the table length, the table is padded with
  nulls and gets one new block at the end (the returned new blocks include the nulls); the
  previous live block is remembered as the *last state*;
* release (before the capacity check, like any skipped block): with ``c`` tokens computed,
  real blocks at positions below ``(c - 1) // bs`` are freed (each position once), and the
  last state once it sits below position ``ceil(c / bs) - 1``;
* registration: the live block at position ``k`` is registered under the hash of block
  ``k`` (it holds the state after ``(k + 1) * bs`` tokens) once that block is full;
* lookup within ``m`` tokens: the rightmost cached block ``i < m // bs`` whose end is a
  multiple of the hit alignment; hit ``[0] * i + [b]``, ``(i + 1) * bs`` tokens;
* a hit whose state was registered in the current scheduler step is refused (the state is
  written by that step): ``allocate_slots`` returns ``None`` until
  :meth:`pagedkv.KVCacheManager.new_step_starts`.

Worked case (full attention 16 + Mamba 16): a 128-token prompt scheduled at once gets
``([1..8], [0, 0, 0, 0, 0, 0, 0, 9])``; block 9 is registered with block 8's hash. A decode
step with 3 lookahead slots: full attention gets block 10 (132 slots), Mamba block 11 (129
tokens): ``[0] * 7 + [9, 11]``; the next step frees block 9 (the last state). A second
request with the same prompt plus 3 tokens hits 128 tokens with Mamba ``[0] * 7 + [9]``;
allocating it in the same step is refused, in the next one it gets ``([12], [13])``.

**Checkpoint option.** Table position ``j`` holds the state after ``min((j + 1) *
block_size, computed)`` tokens; once the request computes past ``(j + 1) * block_size``
that block is final, registered under the hash of the prefix it summarises. Lookup within
``m`` tokens: the rightmost cached checkpoint ``i`` with ``(i + 1) * block_size <= m``.
With ``c`` computed tokens the live state is in block ``ceil(c / block_size) - 1``; earlier
blocks are freed. Speculative decoding (``drop_last_hit``): the checkpoint after the hit
must be cached too.

Checkpoint option, run (interval 4; checkpoints after 4 and 8 tokens cached, a 13-token
prompt, ``m`` = 12):

>>> from pagedkv import BlockHasher, Request
>>> from pagedkv.core.pool import BlockPool
>>> heads = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
>>> req = Request("a", list(range(17)), hasher=BlockHasher(4))   # 4 full blocks of 4
>>> pool = BlockPool(16, hash_block_size=4)
>>> ids = pool.get_new_blocks(2); pool.cache_full_blocks(req, ids, 0, 2, 0); ids
[1, 2]
>>> from pagedkv.core.specs import MambaSpec
>>> spec = MambaSpec(block_size=4, state_bytes=64, cache_checkpoints=True)
>>> m = MambaCheckpointManager(spec, pool, 0)
>>> m.find_longest_cache_hit(req.block_hashes, 12)
[0, 2]
>>> MambaManager(MambaSpec(block_size=4, state_bytes=64), pool, 0).find_longest_cache_hit(
...     req.block_hashes, 12)
[]
"""

from __future__ import annotations

from pagedkv.core.kernels import kernels
from pagedkv.core.managers.base import SingleTypeManager, register_manager
from pagedkv.core.managers.partial import PartialHitManager
from pagedkv.core.managers.skipping import SkippingManager
from pagedkv.core.pool import BlockPool
from pagedkv.core.request import RequestLike
from pagedkv.core.specs import KVCacheSpec, MambaSpec, cdiv

__all__ = ["MambaAlignManager", "MambaCheckpointManager", "MambaManager"]


@register_manager(MambaSpec)
class MambaManager(SingleTypeManager):
    """One state block per request; no prefix caching."""

    positional = False
    cacheable = False
    grows_plainly = False  # one state block, whatever the length
    hit_shape = "state"

    @classmethod
    def variant_for(cls, spec: KVCacheSpec, *, enable_caching: bool = True
                    ) -> type[SingleTypeManager]:
        if isinstance(spec, MambaSpec) and spec.cache_checkpoints:
            return MambaCheckpointManager
        return MambaAlignManager if enable_caching else cls

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """Always a miss: no state is ever cached. Does not modify any state. O(1)."""
        return []

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed: list[int],
        total_computed_tokens: int = 0,
    ) -> int:
        """1 for a request without its state block yet, else 0. O(1)."""
        return 0 if self.req_to_blocks.get(request_id) else 1

    def allocate_external_blocks(self, request_id: str, num_local: int, total: int) -> list[int]:
        """None: the one state block comes with the new tokens' allocation. O(1)."""
        return []

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """The request's single state block, on its first allocation only. O(1)."""
        blocks = self.req_to_blocks[request_id]
        if blocks:
            return []
        new = self.pool.get_new_blocks(1)
        blocks.extend(new)
        return new

    def check_invariants(self) -> None:
        super().check_invariants()
        for rid, blocks in self.req_to_blocks.items():
            assert len(blocks) <= 1, f"group {self.group}: {rid} holds {len(blocks)} states"


class MambaCheckpointManager(SkippingManager):
    """State checkpoints at every ``block_size`` boundary (module docstring)."""

    positional = False
    hit_shape = "state"

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens of finished checkpoints: interval 64, 130 computed -> live block 2, so
        128 tokens (blocks 0 and 1); 128 computed -> live block 1, so 64; 0 -> 0."""
        bs = self.block_size
        return max(0, -(-num_computed_tokens // bs) - 1) * bs

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """The deepest cached checkpoint within ``max_length`` tokens, nulls before it.
        Does not modify any state. O(blocks scanned from the right) lookups."""
        hashes = self.group_hashes(block_hashes)
        num_blocks = min(max_length // self.block_size, len(hashes))
        get = self.pool.index[self.group].get
        need_next = self.drop_last_hit
        next_cached = False
        for i in range(num_blocks - 1, -1, -1):
            b = get(hashes[i])
            if b is None:
                next_cached = False
                continue
            if need_next and not next_cached:
                next_cached = True
                continue
            out = [0] * i
            out.append(b)
            return out
        return []


class MambaAlignManager(SkippingManager, PartialHitManager):
    """vLLM 0.33's ``mamba_cache_mode="align"`` (module docstring). Per request it keeps the
    position of its last state and how far its leading positions were released; per step,
    the hashes it registered."""

    ignores_lookahead = True
    positional = False
    hit_shape = "state"
    grows_plainly = False  # at most one new block per call, nulls before it
    caps_registration_itself = True  # its prompt's tail state needs the uncapped count
    drives_partial_hits = True
    records_boundary_states = True

    def __init__(self, spec: KVCacheSpec, pool: BlockPool, group: int, *,
                 drop_last_hit: bool = False) -> None:
        super().__init__(spec, pool, group, drop_last_hit=drop_last_hit)
        self._last_state: dict[str, int] = {}
        self._released: dict[str, int] = {}
        self._registered_this_step: set[bytes] = set()
        # Requests that had a successful allocation (a partial state then moves, not copies).
        self._allocated: set[str] = set()
        #: Sub-block hits (set by the coordinator; see mamba_partial.py): request -> (table
        #: position, block) of a state to copy at its next allocation.
        self.partial_hits = False
        self._partial: dict[str, tuple[int, int]] = {}
        #: (source, copy) pairs queued since the last take, in allocation order.
        self.pending_copies: list[tuple[int, int]] = []
        ks = kernels()  # compiled or pure, picked once
        self._state_hit = ks.state_hit
        self._release_states = ks.mamba_release  # kernels_hybrid_step
        self._grow_state = ks.mamba_grow

    def enable_partial_hits(self) -> None:
        self.partial_hits = True

    def partial_head_problem(self, block_hashes: list[bytes], head: list[int]) -> str | None:
        """A state hit is one state after null blocks."""
        if any(head):
            return f"group {self.group}: a Mamba hit holds one state, after null blocks"
        return None

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Every token but the last: a state summarises its whole prefix."""
        return max(0, num_computed_tokens - 1)

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[int]:
        """The rightmost cached state within ``max_length`` tokens ending on the hit
        alignment, nulls before it. No state change. O(blocks scanned) lookups."""
        if type(block_hashes) is not list:
            block_hashes = list(block_hashes)
        k, bs = self.hash_stride, self.block_size
        return self._state_hit(  # kernels_hybrid.state_hit
            self.pool.index[self.group], block_hashes, k,
            min(max_length // bs, len(block_hashes) // k), bs, self.hit_alignment_tokens)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed: list[int],
        total_computed_tokens: int = 0,
    ) -> int:
        """At most one new block per call, plus hit blocks leaving the free queue; more
        than the pool when the hit's state was registered in this step. No state change."""
        held = self.req_to_blocks.get(request_id)
        n = -(-num_tokens // self.block_size) - (len(held) if held else 0)
        if new_computed:
            n -= len(new_computed)
        n = 1 if n > 0 else 0
        if self._partial and request_id in self._partial:  # a producer's state to move
            n += 1
        if not new_computed:
            return n
        pool = self.pool
        if pool.block_hash[new_computed[-1]] in self._registered_this_step:
            return pool.num_blocks + 1
        ref = pool.ref_cnt
        return n + sum(1 for b in new_computed if b and ref[b] == 0)

    def count_partial(self, new_computed: list[int], num_local_computed_tokens: int) -> int:
        """The copy block a new request's sub-block hit needs (1), else 0."""
        return 1 if new_computed and num_local_computed_tokens % self.block_size else 0

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """Pad with nulls up to the live position and take its block; returns the padding
        and the block (module docstring; kernels_hybrid_step.mamba_grow)."""
        table = self.req_to_blocks[request_id]
        p = self._partial.pop(request_id, None) if self._partial else None
        if p is None:
            return self._grow_state(table, self._last_state, self._allocated, request_id,
                                    num_tokens, self.block_size, self.pool.get_new_blocks)
        required = -(-num_tokens // self.block_size)
        prev = len(table)
        if prev:
            self._last_state[request_id] = prev - 1
        if prev < required - 1:
            table.extend([0] * (required - 1 - prev))
        new = self.pool.get_new_blocks(max(required - len(table), 0) + 1)
        out = self._copy_partial_state(request_id, table, p, new.pop(0), prev)
        table.extend(new)
        out.extend(new)
        self._allocated.add(request_id)
        return out

    def _copy_partial_state(
        self, request_id: str, table: list[int], p: tuple[int, int], cow: int, prev: int
    ) -> list[int]:
        """Queue the copy ``source -> cow`` of a sub-block state; returns the start of the
        new blocks. A new request (it adopted the hit) puts ``cow`` in its table; a running
        one (it registered the state itself and overwrites it next) keeps writing its
        block and the cache entries move to ``cow``, which then counts as registered in
        this step (the copy fills it)."""
        i, src = p
        pool = self.pool
        self.pending_copies.append((src, cow))
        if request_id in self._allocated:
            if self.offloads is not None:
                self.offloads.tail_copied(request_id, src, cow)
            pool.move_block_hashes(src, cow)
            pool.ref_cnt[src] += 1
            h = pool.block_hash[cow]
            if h is not None:
                self._registered_this_step.add(h)
            return table[prev:]
        table[i] = cow
        pool.ref_cnt[cow] += 1
        out = [cow]
        out.extend(table[prev:])
        return out

    def adopt_partial_hit(
        self, request_id: str, new_computed: list[int], num_local_computed_tokens: int
    ) -> None:
        """After a new request's hit joined its table: a hit ending inside the state's
        block is copied at allocation (the position is registered again once full)."""
        if new_computed and num_local_computed_tokens % self.block_size:
            i = num_local_computed_tokens // self.block_size
            self._partial[request_id] = (i, new_computed[-1])
            self.num_cached_blocks[request_id] = i

    def find_partial_hit(self, block_hashes: list[bytes], max_length: int) -> tuple[list[int], int]:
        """The rightmost cached state at any hash-block boundary within ``max_length``
        tokens, nulls before its block; and the hit length. No state change."""
        hbs = self.pool.hash_block_size
        k = self.hash_stride
        get = self.pool.index[self.group].get
        for j in range(min(max_length // hbs, len(block_hashes)) - 1, -1, -1):
            b = get(block_hashes[j])
            if b is not None:
                out = [0] * (j // k)
                out.append(b)
                return out, (j + 1) * hbs
        return [], 0

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free real blocks below position ``(c - 1) // bs`` not released yet (deepest
        first), then the last state once it is behind the live position
        (kernels_hybrid_step.mamba_release)."""
        self._release_states(self.req_to_blocks.get(request_id), self._released,
                             self._last_state, request_id, num_computed_tokens,
                             self.block_size, self.pool.free_blocks)

    def registers_whole_blocks_only(self) -> bool:
        """Unless sub-block hits register the prompt's tail state (or 0.32 keys it again)."""
        return not self.partial_hits and not self.keep_null_head

    def cache_blocks(self, request: RequestLike, request_id: str, num_tokens: int) -> None:
        """Register full positions as usual and remember their hashes for this step; with
        sub-block hits, also the state at the prompt's last hash boundary."""
        before = self.num_cached_blocks[request_id]
        num_full = min(num_tokens, len(request.block_hashes) * self.pool.hash_block_size)
        super().cache_blocks(request, request_id, num_full)
        after = self.num_cached_blocks[request_id]
        if self.partial_hits:
            self._cache_partial_tail(request, request_id, num_tokens)
        if self.keep_null_head:  # the 0.32 profile
            self._rekey_prompt_tail(request, request_id, num_tokens)
        if after > before:
            bh = self.pool.block_hash
            table = self.req_to_blocks[request_id]
            for k in range(before, after):
                h = bh[table[k]] if table[k] else None
                if h is not None:
                    self._registered_this_step.add(h)
                    if self.offloads is not None:
                        self.offloads.committed(request_id, table[k], (k + 1) * self.block_size)

    def _rekey_prompt_tail(self, request: RequestLike, request_id: str, n: int) -> None:
        """vLLM 0.32 keys the state at the prompt's last hash boundary (``(p - 1) // hbs *
        hbs``; ``p // hbs * hbs - hbs`` with the EAGLE drop) again when ``n`` reaches it
        and it is keyed there already (0.33 skips it): the key then counts as registered
        in this step, so a request hitting it waits for the next step."""
        hbs = self.pool.hash_block_size
        p = request.num_prompt_tokens
        end = max(0, p // hbs * hbs - hbs) if self.drop_last_hit else (p - 1) // hbs * hbs
        if n <= 0 or n != end:
            return
        i = cdiv(n, self.block_size) - 1
        table = self.req_to_blocks[request_id]
        if i >= len(table) or not table[i] or n // hbs > len(request.block_hashes):
            return
        key = request.block_hashes[n // hbs - 1]
        if self.pool.has_entry(self.group, key, table[i]):
            self._registered_this_step.add(key)

    def _cache_partial_tail(self, request: RequestLike, request_id: str, n: int) -> None:
        """When exactly ``n`` = the prompt's last hash boundary before its last token
        (``(num_prompt_tokens - 1) // hbs * hbs``; ``max(1, L)`` tokens before its end with
        hash lookahead L, vLLM's ``get_mamba_prefill_checkpoint_position``) is computed,
        register the live state under that prefix's hash; if ``n`` is inside the block, the
        request's next allocation moves the entry to a copy (it overwrites the state next
        step)."""
        hbs = self.pool.hash_block_size
        keep = max(1, self.hash_lookahead_tokens)
        if n <= 0 or n % hbs or n != (request.num_prompt_tokens - keep) // hbs * hbs:
            return
        bs = self.block_size
        table = self.req_to_blocks[request_id]
        i = cdiv(n, bs) - 1
        if i >= len(table) or not table[i] or not n % bs:
            return
        src = table[i]
        pool = self.pool
        if pool.block_hash[src] == request.block_hashes[n // hbs - 1] and (
                pool.block_group[src] == self.group):
            return  # keyed here already (a hit or an earlier step)
        h = pool.cache_partial_block(request, src, n, self.group)
        if h is not None:
            self._registered_this_step.add(h)
            self._partial[request_id] = (i, src)
            self.num_cached_blocks[request_id] = i
            if self.offloads is not None:
                self.offloads.producer_tail(request_id, src, n)

    def new_step_starts(self) -> None:
        self._registered_this_step.clear()

    def _forget(self, request_id: str) -> None:
        self._last_state.pop(request_id, None)
        self._released.pop(request_id, None)
        self._allocated.discard(request_id)
        if self._partial:
            self._partial.pop(request_id, None)
        if self.offloads is not None:
            self.offloads.forget(request_id)

    def free(self, request_id: str) -> None:
        self._forget(request_id)
        super().free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        self._forget(request_id)
        return super().pop_blocks_for_free(request_id)

    def check_invariants(self) -> None:
        """The base checks; no real block below the released positions (release follows
        the processed tokens, as vLLM 0.33's: under in-flight counting a table may hold
        states besides the live one and the last, in vLLM too; tests/hybrid)."""
        SingleTypeManager.check_invariants(self)
        for rid, table in self.req_to_blocks.items():
            mark = self._released.get(rid, 0)
            assert not any(table[:mark]), f"group {self.group}: {rid}: a state below {mark}"
        if self.offloads is not None:
            self.offloads.check_invariants(self.req_to_blocks)


MambaAlignManager.partial_hit_class = MambaAlignManager
