"""The prefix index of a block pool: which blocks hold reusable content, under which keys.

State per block id ``b`` (parallel lists, indexed by block id):

* ``block_hash[b]`` / ``block_group[b]``: the prefix-index key the block is registered
  under (``None`` when it holds no reusable content).

The prefix index maps ``(hash, group)`` to blocks, as one dict per group from hash to the
*primary* block id. Two requests may fill identical blocks at once; both stay registered
(a block table is never rewritten), the later ones in a per-group side table, and a lookup
returns the earliest still registered.

Partial-prefix entries (hybrid groups whose block is k > 1 hash blocks long) register a
block under the hash of a shorter prefix that ends inside it, as a *secondary* key; see
:meth:`PrefixIndex.cache_partial_block`.

:class:`pagedkv.core.pool.BlockPool` holds one (``pool.prefix``) and adds the reference
counts and the free queue (and evicts, inline, the cached blocks it hands out).
Every registration, eviction and move is told to the recorder
(:mod:`pagedkv.core.recorder`) and, when one is set, to the eviction policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagedkv.core.components import EvictionPolicy
from pagedkv.core.kernels import Kernels
from pagedkv.core.recorder import EventRecorder, GroupInfo, StoredRun
from pagedkv.core.request import RequestLike
from pagedkv.errors import InvalidArgumentError

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """The prefix index over ``num_blocks`` block ids (module docstring); the pool holds it.

    Complexity: every method is O(number of blocks or keys it is given or touches),
    independent of ``num_blocks``, except the checks.
    """

    def __init__(
        self,
        num_blocks: int,
        *,
        enable_caching: bool,
        hash_block_size: int,
        groups: Sequence[GroupInfo],
        recorder: EventRecorder | None,
        policy: EvictionPolicy | None,
        ref_cnt: list[int],
        kernels: Kernels,
    ) -> None:
        num_groups = max(1, len(groups))
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.groups: list[GroupInfo] = list(groups) or [GroupInfo(hash_block_size, None, None)]
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.block_group: list[int] = [0] * num_blocks
        #: Per group: hash -> primary block id.
        self.index: list[dict[bytes, int]] = [{} for _ in range(num_groups)]
        #: Per group: hash -> later duplicate block ids, in insertion order.
        self.duplicates: list[dict[bytes, list[int]]] = [{} for _ in range(num_groups)]
        #: Block id -> secondary (group, hash) keys (partial-prefix entries).
        self.secondary: dict[int, list[tuple[int, bytes]]] = {}
        #: Told about every registration, eviction and reset (default: records nothing).
        self.recorder = recorder if recorder is not None else EventRecorder()
        #: Cumulative number of cached blocks evicted (reused or dropped from the index).
        self.num_evicted_blocks = 0
        # Blocks that lost their hash otherwise (re-registered under another hash; resets).
        self._num_rehashed = 0
        #: The eviction order when it is not vLLM's LRU (retention), else None.
        self.policy = policy
        #: Reference counts per block (the pool's list; read to refuse registering a free
        #: block).
        self.ref_cnt = ref_cnt
        # The kernels of this index and its pool (pagedkv.core.kernels), picked by the pool.
        self._index_register = kernels.index_register
        #: The longest-hit kernel over one group's dict (full attention's lookup).
        self.longest_hit = kernels.longest_hit

    # ------------------------------------------------------------------ queries

    @property
    def index_generation(self) -> int:
        """Changes whenever a block loses or changes its hash; while it stays the same, every
        block keeps the hash it had. O(1)."""
        return self.num_evicted_blocks + self._num_rehashed

    def has_entry(self, group: int, key: bytes, block: int) -> bool:
        """Whether the index maps ``(key, group)`` to ``block`` (as primary, duplicate or
        partial-prefix entry). O(duplicates of the key)."""
        if self.index[group].get(key) == block:
            return True
        dups = self.duplicates[group].get(key)
        return dups is not None and block in dups

    def duplicates_of(self, group: int, key: bytes) -> list[int]:
        """The later blocks registered under ``(key, group)`` besides the primary, in
        registration order (read-only). O(1)."""
        return self.duplicates[group].get(key, [])

    def num_cached_blocks(self) -> int:
        """Number of prefix-index entries (primary, duplicate and secondary). O(groups)."""
        n = sum(len(d) for d in self.index)
        n += sum(len(v) for d in self.duplicates for v in d.values())
        return n

    # ------------------------------------------------------------------ registration

    def cache_full_blocks(
        self,
        request: RequestLike,
        blocks: list[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        group: int,
        mask: Sequence[bool] | None = None,
    ) -> None:
        """Register ``blocks[num_cached_blocks:num_full_blocks]`` of ``request`` in the
        index under their hashes (null blocks, and positions whose ``mask`` entry is false,
        skipped) and tell the recorder in one call.

        The group's block size may be k times the hash block size; a block's hash is then
        the hash that ends at its boundary (``block_hashes[(i + 1) * k - 1]``). A block that
        already carries a shorter (partial) hash is promoted: the partial entries go.
        ``blocks`` is the request's block table (a list, as ``request.block_hashes``).
        O(num_full_blocks - num_cached_blocks).
        """
        if num_cached_blocks >= num_full_blocks:
            return
        all_hashes = request.block_hashes
        k = self.groups[group].block_size // self.hash_block_size
        hashes = all_hashes if k == 1 else all_hashes[k - 1 :: k]
        if mask is None:
            skipped = self._index_register(
                blocks, hashes, num_cached_blocks, num_full_blocks, self.index[group],
                self.duplicates[group], self.block_hash, self.block_group, group,
                self._evict_rehashed)
        else:
            skipped = self._register_masked(blocks, hashes, num_cached_blocks,
                                            num_full_blocks, group, mask)
        recorder = self.recorder
        if recorder.hears_stored:
            run: StoredRun = (request, blocks, hashes, num_cached_blocks, num_full_blocks,
                              skipped, group)
            recorder.stored(run)
        if self.policy is not None:
            self.policy.registered(request, blocks, num_cached_blocks, num_full_blocks, group,
                                   mask)

    def _register_masked(
        self, blocks: list[int], hashes: list[bytes], start: int, stop: int, group: int,
        mask: Sequence[bool],
    ) -> list[int]:
        """``index_register`` (:mod:`pagedkv.core.kernels_pure`) with positions whose
        ``mask[i - start]`` is false skipped too; the skipped positions."""
        index = self.index[group]
        dups = self.duplicates[group]
        bh = self.block_hash
        bg = self.block_group
        skipped: list[int] = []
        for i in range(start, stop):
            b = blocks[i]
            if not b or not mask[i - start]:
                skipped.append(i)
                continue
            h = hashes[i]
            if bh[b] is not None:
                if bh[b] == h and bg[b] == group:
                    skipped.append(i)
                    continue
                self.evict_block(b, count=False)
            bh[b] = h
            bg[b] = group
            if index.setdefault(h, b) != b:
                dups.setdefault(h, []).append(b)
        return skipped

    def cache_partial_block(
        self, request: RequestLike, block: int, num_tokens: int, group: int
    ) -> bytes | None:
        """Also register ``block`` under the hash of the request's first ``num_tokens``
        tokens, a prefix that ends *inside* the block, so a prompt sharing only part of the
        block can find it. Only for groups whose block is k > 1 hash blocks long.

        ``num_tokens`` must be a multiple of the hash block size and not of the group's
        block size; ``block`` is the request's block holding token ``num_tokens - 1`` and
        must be in use. Worked case (hash block 16, group block 64): ``num_tokens`` 80 ->
        the key is ``block_hashes[80 // 16 - 1] = block_hashes[4]``, inside block 1 (tokens
        64..127), so ``block`` is the request's table entry 1.

        A block without a hash gets the key as its primary hash; a block that has one keeps
        it and gets the key as a secondary entry. Eviction drops every key of the block;
        ``cache_full_blocks`` promotes it (partial keys removed, full-block hash
        registered). The recorder hears of the key as one hash block chained to its parent.
        Registering a key the block already has, the null block, and a pool with caching
        off change nothing.

        Returns:
            The registered hash, or None when nothing was registered. O(1).

        Raises:
            InvalidArgumentError: ``num_tokens`` or ``block`` break the rules above;
                nothing changed.
        """
        if not block or not self.enable_caching:
            return None
        hbs = self.hash_block_size
        group_bs = self.groups[group].block_size
        num_hashed_tokens = len(request.block_hashes) * hbs
        if (
            num_tokens <= 0
            or num_tokens % hbs
            or not num_tokens % group_bs
            or num_tokens > num_hashed_tokens
        ):
            raise InvalidArgumentError(
                f"cache_partial_block: num_tokens={num_tokens} must be a positive multiple of "
                f"the hash block size {hbs}, not a multiple of group {group}'s block size "
                f"{group_bs}, and at most the {num_hashed_tokens} hashed tokens"
            )
        if not 0 < block < self.num_blocks or self.ref_cnt[block] == 0:
            raise InvalidArgumentError(
                f"cache_partial_block: block {block!r} is not an in-use block of this pool; "
                "register a block the request holds"
            )
        i = num_tokens // hbs - 1
        h = request.block_hashes[i]
        index = self.index[group]
        dups = self.duplicates[group].get(h)
        if index.get(h) == block or (dups is not None and block in dups):
            return h
        old = self.block_hash[block]
        if old is not None and self._key_tokens(request, block, old, group_bs, i) < num_tokens:
            # vLLM 0.33: a longer prefix replaces a shorter partial key (its entries go).
            self.evict_block(block, count=False)
            dups = self.duplicates[group].get(h)
        if self.block_hash[block] is None:
            self.block_hash[block] = h
            self.block_group[block] = group
            primary = True
        else:
            self.secondary.setdefault(block, []).append((group, h))
            primary = False
        if index.setdefault(h, block) != block:
            self.duplicates[group].setdefault(h, []).append(block)
        self.recorder.stored_partial(request, block, i, group, primary)
        if self.policy is not None and primary:
            self.policy.registered_partial(request, block, h, group)
        return h

    def _key_tokens(
        self, request: RequestLike, block: int, key: bytes, group_bs: int, i: int
    ) -> int:
        """Tokens covered by ``key``, the primary key of ``block``, which holds hash block
        ``i`` of ``request`` (so its keys are hashes of ``request``'s own prefixes within
        that block); a key from outside the block's span counts as the whole block."""
        hbs = self.hash_block_size
        k = group_bs // hbs
        first = i // k * k
        hashes = request.block_hashes
        for j in range(first, min(first + k, len(hashes))):
            if hashes[j] == key:
                return (j + 1) * hbs
        return (first + k) * hbs

    def move_block_hashes(self, src: int, dst: int) -> None:
        """Re-point every index entry of ``src`` to ``dst`` (which has none), as vLLM 0.33's
        ``move_block_hashes``: the primary key stays primary, entries keep their order
        among duplicates except that ``dst`` joins the end; no events (the entries stay
        live). Used when a request keeps writing ``src`` and the cache keeps a copy. O(keys).
        """
        h = self.block_hash[src]
        if h is None:
            return
        after = self.policy.moving(src, dst) if self.policy is not None else None
        assert self.block_hash[dst] is None and dst not in self.secondary
        keys = [(self.block_group[src], h), *self.secondary.pop(src, ())]
        for g, key in keys:
            self._unregister(g, key, src)
        self.block_hash[src] = None
        self._num_rehashed += 1
        g, key = keys[0]
        self.block_hash[dst] = key
        self.block_group[dst] = g
        for n, (g, key) in enumerate(keys):
            if n:
                self.secondary.setdefault(dst, []).append((g, key))
            if self.index[g].setdefault(key, dst) != dst:
                self.duplicates[g].setdefault(key, []).append(dst)
        self.recorder.moved(src, dst)
        if after is not None:
            after()

    def _unregister(self, group: int, h: bytes, b: int) -> None:
        """Drop the entry ``(h, group) -> b``; a duplicate becomes primary if ``b`` was."""
        index = self.index[group]
        dups = self.duplicates[group].get(h)
        if index.get(h) == b:
            if dups:
                index[h] = dups.pop(0)
            else:
                del index[h]
        elif dups and b in dups:
            dups.remove(b)
        if dups is not None and not dups:
            del self.duplicates[group][h]

    def _evict_rehashed(self, b: int) -> None:
        """:meth:`evict_block` of a block about to be registered under another key."""
        self.evict_block(b, count=False)

    def evict_block(self, b: int, *, count: bool = True) -> None:
        """Drop every index entry of block ``b`` (which has a hash) and clear its hash; tell
        the recorder and the policy. ``count``: an eviction (else the block is about to be
        registered under another key). The pool's take kernel calls it for the blocks it
        does not evict inline. O(keys of ``b``)."""
        h = self.block_hash[b]
        assert h is not None
        g = self.block_group[b]
        self._unregister(g, h, b)
        self.block_hash[b] = None
        self.recorder.removed([h], g)
        if self.secondary:
            for g2, h2 in self.secondary.pop(b, ()):
                self._unregister(g2, h2, b)
                self.recorder.removed([h2], g2)
        if count:
            self.num_evicted_blocks += 1
        else:
            self._num_rehashed += 1
        if self.policy is not None:
            self.policy.unhashed(b)

    def evict_blocks(self, ids: Iterable[int]) -> None:
        """Drop the given blocks from the prefix index (they stay allocated if in use).

        Raises:
            InvalidArgumentError: an id outside ``[0, num_blocks)``; nothing is evicted.
        """
        ids = list(ids)
        for b in ids:
            if not isinstance(b, int) or not 0 <= b < self.num_blocks:
                raise InvalidArgumentError(
                    f"block id {b!r} does not belong to this pool of {self.num_blocks} blocks"
                )
        if self.policy is not None:
            self.policy.before_evict_blocks()
        for b in ids:
            if b and self.block_hash[b] is not None:
                self.evict_block(b)

    def clear(self) -> None:
        """Drop every entry and every block's hash, in place (the lists and dicts stay the
        same objects); tell the recorder. The pool's reset, once no block is in use.
        O(num_blocks)."""
        for d in self.index:
            d.clear()
        for dups in self.duplicates:
            dups.clear()
        self.secondary.clear()
        self.block_hash[:] = [None] * self.num_blocks
        self._num_rehashed += 1
        self.recorder.cleared()

    def debug_state(self) -> dict[str, object]:
        """A deep copy of the entries and the eviction count (the pool's ``debug_state``
        holds them). O(index size)."""
        return {
            "index": [dict(d) for d in self.index],
            "duplicates": [{h: list(v) for h, v in d.items()} for d in self.duplicates],
            "secondary": {b: list(v) for b, v in self.secondary.items()},
            "num_evicted_blocks": self.num_evicted_blocks,
        }

    def check_index(self) -> None:
        """Assert the index and the blocks' hashes agree entry for entry (primary,
        duplicate and secondary keys). O(num_blocks + index size)."""
        registered: set[tuple[int, bytes, int]] = set()
        for g, index in enumerate(self.index):
            for h, b in index.items():
                registered.add((g, h, b))
            for h, dups in self.duplicates[g].items():
                assert h in index, f"duplicates for a hash with no primary in group {g}"
                assert dups, "empty duplicate list kept"
                for b in dups:
                    assert (g, h, b) not in registered, f"block {b} registered twice"
                    registered.add((g, h, b))
        expected: set[tuple[int, bytes, int]] = set()
        for b in range(1, self.num_blocks):
            primary = self.block_hash[b]
            if primary is not None:
                expected.add((self.block_group[b], primary, b))
            for g2, h2 in self.secondary.get(b, ()):
                assert primary is not None, f"block {b} has secondary keys but no primary hash"
                expected.add((g2, h2, b))
        assert registered == expected, (
            f"index and block hashes disagree: {len(registered ^ expected)} entries differ"
        )
        if not self.enable_caching:
            assert not registered, "caching is off but the index holds entries"
