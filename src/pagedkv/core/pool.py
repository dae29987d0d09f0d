"""The block pool: every block's reference count and hash, the free queue, and the prefix index.

State per block id ``b`` (parallel lists, see ``free_queue.py`` for why blocks are ints):

* ``ref_cnt[b]``: how many request block tables hold ``b``. A block is in the free queue
  iff its ref count is 0. Block 0 is the *null block*: never queued, allocated, freed,
  cached or evicted, and its ref count is not tracked (it stays 0).
* ``block_hash[b]`` / ``block_group[b]``: the prefix-index key the block is registered
  under (``None`` when it holds no reusable content).

The prefix index itself (keys, duplicates, partial-prefix entries; registering, moving and
evicting) is a :class:`~pagedkv.core.prefix_index.PrefixIndex` the pool holds as
:attr:`BlockPool.prefix`; the pool adds the reference counts, the free queue, and the
eviction of the cached blocks it hands out. The index's per-block lists and dicts
(``block_hash``, ``block_group``, ``index``) and its registration methods
(``cache_full_blocks``, ``cache_partial_block``, ``evict_blocks``, ...) are also bound on
the pool once, at construction, as plain attributes: the same objects, so a hot loop
reading ``pool.block_hash`` pays no property call. Its per-block loops are kernels
(:mod:`pagedkv.core.kernels`: ``pool_take``, ``pool_free``, ``pool_touch`` and the queue
class), taken once at construction and called unconditionally;
:meth:`BlockPool.set_free_queue` rebinds the free and touch kernels when a retention
policy swaps in its own queue.

Events: the pool tells its recorder (:mod:`pagedkv.core.recorder`) what it registered
(one ``StoredRun`` record per run, built only for a recorder that ``hears_stored``),
evicted or cleared; the default recorder does nothing and builds no event object, so the
pool never tests whether events are on.

Components (:mod:`pagedkv.core.components`): an optional
:class:`~pagedkv.core.components.EvictionPolicy` (retention) is called where the order of
free blocks could change, and optional
listeners (:class:`~pagedkv.core.components.PoolListener`: a host tier, residency sampling) hear of
evictions, allocations, hits and resets. Without them every such call site costs one test
of ``None`` or of an empty tuple.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any

from pagedkv.core.components import DeviceBlock, EvictionPolicy, PoolListener
from pagedkv.core.free_queue import FreeBlockQueue
from pagedkv.core.kernels import kernels
from pagedkv.core.prefix_index import PrefixIndex
from pagedkv.core.recorder import EventRecorder, GroupInfo
from pagedkv.errors import InvalidArgumentError

__all__ = ["NULL_BLOCK", "BlockPool", "GroupInfo"]

#: Block id of the null block.
NULL_BLOCK = 0


class BlockPool:
    """Fixed pool of ``num_blocks`` blocks shared by every KV-cache group.

    Complexity: every method is O(number of blocks it is given or returns), independent of
    ``num_blocks``; construction is O(num_blocks) with two list builds.
    """

    def __init__(
        self,
        num_blocks: int,
        *,
        enable_caching: bool = True,
        hash_block_size: int,
        groups: Sequence[GroupInfo] = (),
        recorder: EventRecorder | None = None,
        policy: EvictionPolicy | None = None,
        listeners: Sequence[PoolListener] = (),
    ) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise InvalidArgumentError(
                f"num_blocks must be an int >= 2 (block 0 is the null block), got {num_blocks!r}"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.ref_cnt = [0] * num_blocks
        # The kernels (pagedkv.core.kernels), picked once for the pool and its index.
        k = self._kernels = kernels()
        #: The prefix index (module docstring): what the pool's blocks are cached under.
        self.prefix = PrefixIndex(num_blocks, enable_caching=enable_caching,
                                  hash_block_size=hash_block_size, groups=groups,
                                  recorder=recorder, policy=policy, ref_cnt=self.ref_cnt,
                                  kernels=k)
        self._bind_index()
        # The allocation's loop, and the free and touch loops for the queue the pool holds
        # (set_free_queue rebinds them).
        self._pool_take = k.pool_take
        self.free_queue: FreeBlockQueue = k.queue_class(num_blocks, first_id=1)
        self._pool_free = k.pool_free
        self._pool_touch = k.pool_touch
        #: Told of evictions, allocations, hits and resets (module docstring).
        self.listeners: tuple[PoolListener, ...] = tuple(listeners)
        self.policy = policy
        if policy is not None:
            policy.bind(self)

    def _bind_index(self) -> None:
        """Bind the index's lists, dicts and methods on the pool (module docstring): the
        same objects, never rebound (the index mutates them in place)."""
        p = self.prefix
        self.groups = p.groups
        self.block_hash = p.block_hash
        self.block_group = p.block_group
        self.index = p.index
        self.recorder = p.recorder
        self.longest_hit = p.longest_hit
        self.cache_full_blocks = p.cache_full_blocks
        self.cache_partial_block = p.cache_partial_block
        self.move_block_hashes = p.move_block_hashes
        self.evict_blocks = p.evict_blocks
        self.has_entry = p.has_entry
        self.duplicates_of = p.duplicates_of
        self.num_cached_blocks = p.num_cached_blocks

    @property
    def num_evicted_blocks(self) -> int:
        """Cumulative number of cached blocks evicted (the index's count). O(1)."""
        return self.prefix.num_evicted_blocks

    @property
    def index_generation(self) -> int:
        """:attr:`PrefixIndex.index_generation` of the pool's index. O(1)."""
        return self.prefix.index_generation

    # ------------------------------------------------------------------ allocation

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue; each gets ref count 1.

        A taken block that was cached is evicted from the index first (the recorder is
        told, once per run of same-group evictions). Precondition: ``n <= num_free`` (callers
        check capacity first, so an allocation is never half done). O(n).
        """
        if n > self.free_queue.num_free:
            raise AssertionError(f"get_new_blocks({n}) with {self.free_queue.num_free} free")
        listeners = self.listeners
        victims = self._cached_at_front(n) if listeners else None
        ids = self.free_queue.popleft_n(n)
        # (It returns the blocks it evicted inline; the rest went through evict_block,
        # which counted them itself: so the count is read after the call.)
        prefix = self.prefix
        inline = self._pool_take(ids, self.ref_cnt, self.block_hash, self.block_group,
                                 self.index, prefix.duplicates, prefix.secondary,
                                 self.recorder.removed, prefix.evict_block)
        prefix.num_evicted_blocks += inline
        if listeners:
            self._tell_taken(ids, victims)
        return ids

    def _cached_at_front(self, n: int) -> list[DeviceBlock]:
        """The cached blocks among the first ``n`` of the free queue (about to be
        evicted), as ``(id, hash, group)``. O(n); only with listeners."""
        bh = self.block_hash
        bg = self.block_group
        return [(b, h, bg[b]) for b in islice(self.free_queue, n) if (h := bh[b]) is not None]

    def _tell_taken(self, ids: list[int], victims: list[DeviceBlock] | None) -> None:
        """Tell the listeners which of ``victims`` left the index (keys a duplicate still
        holds left out) and which blocks were handed out."""
        index = self.index
        gone = [v for v in victims or () if v[1] not in index[v[2]]]
        for listener in self.listeners:
            if gone:
                listener.evicted(gone)
            listener.allocated(ids)

    def touch(self, ids: Iterable[int]) -> None:
        """A prefix hit on ``ids``: ref count +1; a block at 0 leaves the free queue. O(n)."""
        if self.policy is not None or self.listeners:
            self._touch_told(list(ids))
            return
        self._pool_touch(self.free_queue, self.ref_cnt, ids)

    def _touch_told(self, ids: list[int]) -> None:
        """:meth:`touch` with a policy (which may count the references itself) or
        listeners."""
        if self.policy is None or not self.policy.touch(ids):
            self._pool_touch(self.free_queue, self.ref_cnt, ids)
        for listener in self.listeners:
            listener.touched(ids)

    def free_blocks(self, ordered: Iterable[int]) -> None:
        """Ref count -1 for each of ``ordered`` (first = evicted first); blocks reaching 0
        are queued: those without a hash at the front, those with one at the back. O(n)."""
        self._pool_free(self.free_queue, self.ref_cnt, self.block_hash, ordered)

    def set_free_queue(self, queue: FreeBlockQueue) -> None:
        """Hold ``queue`` as the free queue from now on (a retention policy's own queue,
        which must hold the same blocks in the same order) and take the free and touch
        kernels that work on it (:meth:`pagedkv.core.kernels.Kernels.for_queue`). O(1)."""
        k = self._kernels.for_queue(queue)
        self.free_queue = queue
        self._pool_free = k.pool_free
        self._pool_touch = k.pool_touch

    # ------------------------------------------------------------------ prefix index

    def reset_prefix_cache(self) -> bool:
        """Clear the whole index and every block's hash, only if no block is in use.

        Returns whether it succeeded (then the recorder is told). O(num_blocks).
        """
        if self.policy is not None:
            if self.policy.reset() is False:
                return False
        elif self.free_queue.num_free != self.num_blocks - 1:
            return False
        self.prefix.clear()
        for listener in self.listeners:
            listener.cleared()
        return True

    # ------------------------------------------------------------------ checks

    def debug_state(self) -> dict[str, Any]:
        """A deep copy of all pool state, for tests and bug reports. O(num_blocks)."""
        if self.policy is not None:
            self.policy.settle()
        state = {
            "ref_cnt": list(self.ref_cnt),
            "block_hash": list(self.block_hash),
            "block_group": [g if h is not None else None
                            for g, h in zip(self.block_group, self.block_hash, strict=True)],
            "free_queue": self.free_queue.to_list(),
            **self.prefix.debug_state(),
            "events": self.recorder.pending(),
        }
        if self.policy is not None:
            self.policy.debug_state(state)
        return state

    def check_invariants(self) -> None:
        """Walk all state and assert it is consistent. O(num_blocks + index size)."""
        queued = self.free_queue.check_invariants()
        queued_set = set(queued)
        assert NULL_BLOCK not in queued_set, "the null block is in the free queue"
        assert self.ref_cnt[NULL_BLOCK] == 0, "the null block's ref count changed"
        assert self.block_hash[NULL_BLOCK] is None, "the null block has a hash"
        for b in range(1, self.num_blocks):
            r = self.ref_cnt[b]
            assert r >= 0, f"block {b} has ref count {r}"
            assert (r == 0) == (b in queued_set), (
                f"block {b}: ref count {r} but {'in' if b in queued_set else 'not in'} queue"
            )
        self.prefix.check_index()
        self.recorder.check_invariants(self.block_hash, self.enable_caching)
        if self.policy is not None:
            self.policy.check_invariants()


