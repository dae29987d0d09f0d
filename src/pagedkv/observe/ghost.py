"""The ghost record of evicted hashes and the salt-free shadow index, as an event recorder.

:class:`GhostRecorder` sits between the block pool and the manager's real recorder (the
null recorder or an :class:`~pagedkv.core.recorder.EventBuffer`): it forwards every call
unchanged and additionally

* remembers the last ``ghost_entries`` evicted ``(group, hash)`` keys with an
  :class:`~pagedkv.observe.reasons.EvictionRecord` (step, clock, pool usage), so a later
  miss on that hash reads *evicted* rather than *never seen*;
* for blocks registered by a request with extra keys (cache salt, LoRA, multimodal), maps
  the block's *shadow hash* — the chained hash of the same tokens without any extra keys —
  to its real hash, so a lookup of the same tokens under other keys reads *isolated*.

It exists only when attribution is on (``pagedkv.observe.ObservedKVCacheManager``); the
plain manager's pool never sees it.

Memory: one ghost entry is a key tuple, a record and an ordered-dict slot: about 200
bytes (``benchmarks/observe_speed.py``), plus the hash's bytes object (65 bytes for
SHA-256) once nothing else holds it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pagedkv.core.hashing import BlockHasher
from pagedkv.core.recorder import EventRecorder, ForwardingRecorder, StoredRun
from pagedkv.errors import InvalidArgumentError
from pagedkv.observe.reasons import EvictionRecord

if TYPE_CHECKING:
    from pagedkv.core.pool import BlockPool
    from pagedkv.core.request import RequestLike

__all__ = ["GhostRecorder"]

#: Requests whose shadow hashes are kept between two registrations (FIFO).
_SHADOW_CACHE_REQUESTS = 256


class GhostRecorder(ForwardingRecorder):
    """Forwards to ``inner`` and keeps the ghost record and the shadow index.

    ``clock`` returns seconds; ``shadow_hasher`` hashes without extra keys and must use
    the manager's hash block size, algorithm and seed (a separate instance, so its memo
    never touches the manager's hasher). :meth:`bind` must be called with the pool
    before the first registration.

    Raises:
        InvalidArgumentError: ``ghost_entries < 0``.
    """

    def __init__(
        self,
        inner: EventRecorder,
        *,
        ghost_entries: int,
        shadow_hasher: BlockHasher,
        clock: Callable[[], float],
    ) -> None:
        if not isinstance(ghost_entries, int) or ghost_entries < 0:
            raise InvalidArgumentError(
                f"ghost_entries must be an int >= 0, got {ghost_entries!r}"
            )
        super().__init__(inner)
        self.ghost_entries = ghost_entries
        self.shadow_hasher = shadow_hasher
        self.clock = clock
        #: The engine's step number, stamped on eviction records.
        self.step = 0
        #: (group, hash) -> when it was evicted; oldest first.
        self.ghost: OrderedDict[tuple[int, bytes], EvictionRecord] = OrderedDict()
        #: Evicted keys dropped from the ghost record (it was full): a later miss on one
        #: of them reads never seen.
        self.num_forgotten = 0
        #: (group, shadow hash) -> real hashes registered with extra keys.
        self.shadow_index: dict[tuple[int, bytes], set[bytes]] = {}
        self._shadow_of: dict[tuple[int, bytes], bytes] = {}
        self._shadow_cache: OrderedDict[str, list[bytes]] = OrderedDict()
        self._pool: BlockPool | None = None

    def bind(self, pool: BlockPool) -> None:
        """Attach the pool whose usage eviction records report."""
        self._pool = pool

    # ------------------------------------------------------------------ shadow hashes

    def shadow_hashes(self, request: RequestLike) -> list[bytes]:
        """The request's chained hashes without extra keys, one per full hash block
        (its own hashes when it has no extras). Cached per request id (bounded)."""
        if request.hash_extras is None:
            return request.block_hashes
        tokens = request.all_token_ids
        hashes = self._shadow_cache.get(request.request_id)
        if hashes is None:
            hashes = []
            self._shadow_cache[request.request_id] = hashes
            if len(self._shadow_cache) > _SHADOW_CACHE_REQUESTS:
                self._shadow_cache.popitem(last=False)
        self.shadow_hasher.extend(hashes, tokens)
        return hashes

    def shadow_hashes_readonly(self, request: RequestLike) -> list[bytes]:
        """As :meth:`shadow_hashes`, without filling the per-request cache (for
        ``explain_lookup``, which must not change anything)."""
        if request.hash_extras is None:
            return request.block_hashes
        cached = self._shadow_cache.get(request.request_id)
        hashes = list(cached) if cached is not None else []
        self.shadow_hasher.extend(hashes, request.all_token_ids)
        return hashes

    # ------------------------------------------------------------------ recorder calls

    def stored(self, run: StoredRun) -> None:
        self.inner.stored(run)
        request, blocks, hashes, start, end, _, group = run
        if request.hash_extras is None:
            return
        pool = self._pool
        assert pool is not None, "GhostRecorder.bind(pool) was not called"
        k = pool.groups[group].block_size // pool.hash_block_size
        shadow = self.shadow_hashes(request)
        shadow_of = self._shadow_of
        index = self.shadow_index
        for i in range(start, end):
            if not blocks[i]:
                continue
            h = hashes[i]
            sh = shadow[(i + 1) * k - 1]
            shadow_of[(group, h)] = sh
            index.setdefault((group, sh), set()).add(h)

    def removed(self, hashes: list[bytes], group: int) -> None:
        # The inner recorder may keep the list: read it before handing it over.
        ghost = self.ghost
        if self.ghost_entries:
            pool = self._pool
            usage = (1.0 - pool.free_queue.num_free / (pool.num_blocks - 1)
                     if pool is not None else 0.0)
            record = EvictionRecord(self.step, self.clock(), usage)
            for h in hashes:
                key = (group, h)
                ghost[key] = record
                ghost.move_to_end(key)
            while len(ghost) > self.ghost_entries:
                ghost.popitem(last=False)
                self.num_forgotten += 1
        if self._shadow_of:
            for h in hashes:
                sh = self._shadow_of.pop((group, h), None)
                if sh is not None:
                    real = self.shadow_index.get((group, sh))
                    if real is not None:
                        real.discard(h)
                        if not real:
                            del self.shadow_index[(group, sh)]
        self.inner.removed(hashes, group)

    def cleared(self) -> None:
        self._shadow_of.clear()
        self.shadow_index.clear()
        self.inner.cleared()

    def check_invariants(self, block_hash: Sequence[bytes | None], enable_caching: bool) -> None:
        """The inner recorder's checks; the ghost is bounded; every shadow entry names a
        hash that is still registered (its block holds it)."""
        self.inner.check_invariants(block_hash, enable_caching)
        assert len(self.ghost) <= self.ghost_entries, "ghost record over its bound"
        live = {(g, h) for g, h in self._shadow_of}
        for (g, _sh), real in self.shadow_index.items():
            assert real, "empty shadow entry kept"
            for h in real:
                assert (g, h) in live, "shadow entry for a hash that is not registered"
        if self._pool is not None:
            registered = {(self._pool.block_group[b], h) for b, h in enumerate(block_hash)
                          if h is not None}
            assert live <= registered, "shadow map names an evicted hash"
