"""Event recorders: what the block pool tells about its prefix index, once per batch.

The pool calls its recorder at most once per run of blocks it registers or evicts in one
call (``stored``, ``stored_partial``, ``removed``, ``cleared``) and never tests whether
events are on: that is the recorder's class. A registered run reaches ``stored`` as one
:class:`StoredRun` record, which the pool builds only for a recorder that hears
registrations (``hears_stored``): with the null recorder nothing is built. The record
is a plain tuple: a named tuple or a slotted class costs about 0.5 us more per
registration (``python benchmarks/ab_hot_paths.py``).

* :class:`EventRecorder` — the null recorder: every call does nothing, no event object is
  ever built. The default.
* :class:`EventBuffer` — builds vLLM-shaped records, buffers them until :meth:`take`, and
  remembers which stored record announced each cached block so that it can describe the
  whole index again (:meth:`snapshot`, for subscribers that join late).

A new sink (say, a counter of stored blocks per tenant) subclasses :class:`EventBuffer`
and post-processes :meth:`take`, or subclasses :class:`EventRecorder` and overrides the
four calls; the pool does not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pagedkv.core.hashing import event_extra_keys
from pagedkv.core.kernels import kernels
from pagedkv.core.records import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from pagedkv.errors import InvalidArgumentError

if TYPE_CHECKING:
    from pagedkv.core.request import RequestLike

__all__ = ["EventBuffer", "EventRecorder", "GroupInfo", "StoredRun"]

_new = tuple.__new__  # a named tuple's record without its Python-level __new__


class GroupInfo:
    """What the pool knows of one KV-cache group: its block size and the spec
    annotations stored events carry (``kind``, ``sliding_window``)."""

    __slots__ = ("block_size", "kind", "sliding_window")

    def __init__(self, block_size: int, kind: str | None, sliding_window: int | None) -> None:
        self.block_size = block_size
        self.kind = kind
        self.sliding_window = sliding_window


#: One run of blocks the pool registered in one call, ``(request, blocks, hashes, start,
#: end, skipped, group)``: table positions ``[start, end)`` of ``request``'s ``blocks`` in
#: ``group``, position ``i`` under ``hashes[i]`` (the group's hashes, one per block),
#: except the ascending positions ``skipped`` (null or already registered blocks).
#: Read-only for recorders (the lists are the pool's).
StoredRun = tuple["RequestLike", Sequence[int], list[bytes], int, int, Sequence[int], int]


class EventRecorder:
    """The null recorder: the pool's calls cost one method call and build nothing.

    Contract of the calls (every implementation): they never change the pool and never
    raise; ``take`` returns the events recorded since the previous ``take``.
    """

    #: Whether :meth:`stored` wants to hear of registered runs (the pool builds the
    #: ``StoredRun`` record only then). A recorder overriding ``stored`` sets it.
    hears_stored: ClassVar[bool] = False

    def stored(self, run: StoredRun) -> None:
        """The pool registered the blocks of ``run`` (``StoredRun``, unpack it:
        ``request, blocks, hashes, start, end, skipped, group = run``)."""

    def stored_partial(
        self, request: RequestLike, block: int, i: int, group: int, primary: bool
    ) -> None:
        """``block`` was registered under the hash of hash block ``i`` (a prefix ending
        inside it); ``primary``: it is the block's only hash."""

    def removed(self, hashes: list[bytes], group: int) -> None:
        """The index entries ``(hash, group)`` were dropped (the list is handed over)."""

    def moved(self, src: int, dst: int) -> None:
        """Block ``src``'s index entries now point to ``dst`` (no event: they stay live)."""

    def cleared(self) -> None:
        """The whole index was reset."""

    def take(self) -> list[KVCacheEvent]:
        """The events recorded since the last call (always empty here). O(1)."""
        return []

    def pending(self) -> list[KVCacheEvent] | None:
        """A copy of the buffered events for state dumps; ``None``: this recorder keeps none."""
        return None

    def snapshot(
        self, block_hash: Sequence[bytes | None], block_group: Sequence[int]
    ) -> list[BlockStored]:
        """Stored records recreating the index (see :class:`EventBuffer`).

        Raises:
            InvalidArgumentError: always; this recorder does not know what was stored.
        """
        raise InvalidArgumentError(
            "a prefix-index snapshot needs events on (CacheConfig(enable_events=True))"
        )

    def check_invariants(self, block_hash: Sequence[bytes | None], enable_caching: bool) -> None:
        """Assert the recorder agrees with the pool's block hashes (nothing to check here)."""


class ForwardingRecorder(EventRecorder):
    """Passes every call on to ``inner``: the base of recorders that watch the pool's
    registrations and evictions (the observability ghost record, the host tier's feed)
    while the events themselves stay ``inner``'s. Subclasses override the calls they
    watch and forward those too."""

    hears_stored: ClassVar[bool] = True

    def __init__(self, inner: EventRecorder) -> None:
        self.inner = inner

    def stored(self, run: StoredRun) -> None:
        self.inner.stored(run)

    def stored_partial(
        self, request: RequestLike, block: int, i: int, group: int, primary: bool
    ) -> None:
        self.inner.stored_partial(request, block, i, group, primary)

    def removed(self, hashes: list[bytes], group: int) -> None:
        self.inner.removed(hashes, group)

    def moved(self, src: int, dst: int) -> None:
        self.inner.moved(src, dst)

    def cleared(self) -> None:
        self.inner.cleared()

    def take(self) -> list[KVCacheEvent]:
        return self.inner.take()

    def pending(self) -> list[KVCacheEvent] | None:
        return self.inner.pending()

    def snapshot(
        self, block_hash: Sequence[bytes | None], block_group: Sequence[int]
    ) -> list[BlockStored]:
        return self.inner.snapshot(block_hash, block_group)

    def check_invariants(self, block_hash: Sequence[bytes | None], enable_caching: bool) -> None:
        self.inner.check_invariants(block_hash, enable_caching)


class EventBuffer(EventRecorder):
    """Buffers KV-cache events in vLLM's shapes and can snapshot the index.

    ``groups`` and ``hash_block_size`` must be the pool's. Stored records are one per
    registering call, as vLLM 0.33 builds them: ``token_ids`` cover every position of the
    call's range, ``block_hashes`` and ``extra_keys`` only the positions newly registered
    (null and unreachable positions left out), the parent is the hash just before the
    range; removed
    records are one per dropped hash (vLLM 0.33 emits them so).

    Extra keys go out untagged (:func:`pagedkv.core.hashing.event_extra_keys`, vLLM's
    ``to_event_extra_keys``). For a group whose block is one hash block, the keys the hasher
    recorded on the request (``block_extra_keys``) are reused; otherwise (larger blocks, or
    hashes the caller supplied) they are derived from ``request.hash_extras`` over the
    block's span.
    """

    hears_stored: ClassVar[bool] = True

    def __init__(self, groups: Sequence[GroupInfo], hash_block_size: int) -> None:
        self.groups = list(groups)
        self.hash_block_size = hash_block_size
        self._events: list[KVCacheEvent] = []
        # Block id -> (the stored record that announced it, the block's index in its
        # hashes, its block offset in its token_ids, its parent hash). Entries of evicted
        # blocks may linger: they are replaced when the block is stored again and ignored
        # while it has no hash.
        self._announced: dict[int, tuple[BlockStored, int, int, bytes | None]] = {}
        #: The record builder (kernels_hybrid.record_stored), compiled or pure.
        self._record = kernels().record_stored

    def stored(self, run: StoredRun) -> None:
        request, blocks, hashes, start, end, skipped, group = run
        info = self.groups[group]
        bs = info.block_size
        extras = request.hash_extras
        if extras is None:
            lora = extra = None
        else:
            lora = extras.lora
            if skipped:
                left_out = set(skipped)
                positions: Sequence[int] = [i for i in range(start, end) if i not in left_out]
            else:
                positions = range(start, end)
            extra = self._extra_keys(request, extras, positions, bs, end)
        self._record(self._events, self._announced, BlockStored, blocks, hashes, start, end,
                     skipped, request.all_token_ids, bs, lora.adapter_id if lora else None,
                     MEDIUM_GPU, lora.name if lora else None, extra, group, info.kind,
                     info.sliding_window)

    def _extra_keys(self, request: RequestLike, extras: Any, positions: Sequence[int],
                    bs: int, end: int) -> list[Any]:
        """Per registered position, its extra keys as events carry them (class docstring)."""
        if bs == self.hash_block_size and len(request.block_extra_keys) >= end:
            recorded = request.block_extra_keys
            # Most blocks carry no keys: skip the call for them.
            return [None if (k := recorded[i]) is None else event_extra_keys(k)
                    for i in positions]
        return [event_extra_keys(extras.block_keys(i * bs, (i + 1) * bs)) for i in positions]

    def stored_partial(
        self, request: RequestLike, block: int, i: int, group: int, primary: bool
    ) -> None:
        hbs = self.hash_block_size
        hashes = request.block_hashes
        extras = request.hash_extras
        lora = extras.lora if extras is not None else None
        if extras is None:
            extra = None
        elif len(request.block_extra_keys) > i:
            extra = event_extra_keys(request.block_extra_keys[i])
        else:
            extra = event_extra_keys(extras.block_keys(i * hbs, (i + 1) * hbs))
        info = self.groups[group]
        event = BlockStored(
            block_hashes=[hashes[i]],
            parent_block_hash=hashes[i - 1] if i else None,
            token_ids=request.all_token_ids[i * hbs : (i + 1) * hbs],
            block_size=hbs,
            lora_id=lora.adapter_id if lora else None,
            medium=MEDIUM_GPU,
            lora_name=lora.name if lora else None,
            extra_keys=[extra],
            group_idx=group,
            kv_cache_spec_kind=info.kind,
            kv_cache_spec_sliding_window=info.sliding_window,
        )
        if primary:
            self._announced[block] = (event, 0, 0, hashes[i - 1] if i else None)
        self._events.append(event)

    def moved(self, src: int, dst: int) -> None:
        entry = self._announced.pop(src, None)
        if entry is not None:
            self._announced[dst] = entry

    def removed(self, hashes: list[bytes], group: int) -> None:
        # One record per hash, as vLLM's pool emits them (a one-hash list is handed over
        # and becomes the record's own).
        if len(hashes) == 1:
            self._events.append(_new(BlockRemoved, (hashes, MEDIUM_GPU, group)))
            return
        self._events.extend(_new(BlockRemoved, ([h], MEDIUM_GPU, group)) for h in hashes)

    def cleared(self) -> None:
        self._announced.clear()
        self._events.append(AllBlocksCleared())

    def take(self) -> list[KVCacheEvent]:
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    def pending(self) -> list[KVCacheEvent] | None:
        return list(self._events)

    def snapshot(
        self, block_hash: Sequence[bytes | None], block_group: Sequence[int]
    ) -> list[BlockStored]:
        """Stored records recreating the current index (one block each), parents before
        children, from the pool's ``block_hash`` / ``block_group``. O(cached blocks)."""
        announced = self._announced
        cached = {b: (h, block_group[b]) for b in announced
                  if (h := block_hash[b]) is not None}
        known = {h for h, _ in cached.values()}
        children: dict[bytes | None, list[int]] = {}
        for b in cached:
            parent = announced[b][3]
            children.setdefault(parent if parent in known else None, []).append(b)
        out: list[BlockStored] = []
        todo = sorted(children.get(None, []))
        while todo:
            b = todo.pop()
            h, g = cached[b]
            event, k, j, parent = announced[b]
            bs = event.block_size
            info = self.groups[g]
            out.append(
                BlockStored(
                    [h], parent if parent in known else None,
                    event.token_ids[j * bs : (j + 1) * bs], bs,
                    event.lora_id, MEDIUM_GPU, event.lora_name,
                    [event.extra_keys[k] if event.extra_keys else None], g, info.kind,
                    info.sliding_window,
                    None if event.lookahead_token_ids is None
                    else [event.lookahead_token_ids[k]],
                )
            )
            todo.extend(sorted(children.pop(h, []), reverse=True))
        return out

    def check_invariants(self, block_hash: Sequence[bytes | None], enable_caching: bool) -> None:
        """Every cached block was announced by a record that lists its hash."""
        if not enable_caching:
            return
        for b in range(1, len(block_hash)):
            h = block_hash[b]
            if h is not None:
                entry = self._announced.get(b)
                assert entry is not None, f"cached block {b} was never announced"
                assert entry[0].block_hashes[entry[1]] == h, (
                    f"block {b}'s record lists another hash at its position")
