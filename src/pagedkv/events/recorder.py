"""Event recorders: what the block pool tells about its prefix index, once per batch.

The pool calls its recorder at most once per run of blocks it registers or evicts in one
call (``stored``, ``stored_partial``, ``removed``, ``cleared``) and never tests whether
events are on: that is the recorder's class.

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
from typing import TYPE_CHECKING, Any

from pagedkv.errors import InvalidArgumentError
from pagedkv.events.records import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)

if TYPE_CHECKING:
    from pagedkv.request import RequestLike

__all__ = ["EventBuffer", "EventRecorder", "GroupInfo"]


class GroupInfo:
    """What the pool knows of one KV-cache group: its block size and the spec
    annotations stored events carry (``kind``, ``sliding_window``)."""

    __slots__ = ("block_size", "kind", "sliding_window")

    def __init__(self, block_size: int, kind: str | None, sliding_window: int | None) -> None:
        self.block_size = block_size
        self.kind = kind
        self.sliding_window = sliding_window


class EventRecorder:
    """The null recorder: the pool's calls cost one method call and build nothing.

    Contract of the calls (every implementation): they never change the pool and never
    raise; ``take`` returns the events recorded since the previous ``take``.
    """

    def stored(
        self,
        request: RequestLike,
        blocks: Sequence[int],
        hashes: list[bytes],
        start: int,
        end: int,
        skipped: Sequence[int],
        group: int,
    ) -> None:
        """Table positions ``[start, end)`` of ``request``'s ``blocks`` in ``group`` were
        registered under ``hashes[i]``, except the ascending positions ``skipped`` (null or
        already registered blocks)."""

    def stored_partial(
        self, request: RequestLike, block: int, i: int, group: int, primary: bool
    ) -> None:
        """``block`` was registered under the hash of hash block ``i`` (a prefix ending
        inside it); ``primary``: it is the block's only hash."""

    def removed(self, hashes: list[bytes], group: int) -> None:
        """The index entries ``(hash, group)`` were dropped (the list is handed over)."""

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


class EventBuffer(EventRecorder):
    """Buffers KV-cache events in vLLM's shapes and can snapshot the index.

    ``groups`` and ``hash_block_size`` must be the pool's. Stored records are one per run
    of consecutive newly registered block positions, so each record's ``token_ids`` cover
    exactly its blocks and its parent is the hash just before its first block; removed
    records are one per run of same-group evictions of one pool call.

    Extra keys: for a group whose block is one hash block, the keys the hasher recorded on
    the request (``block_extra_keys``) are reused; otherwise (larger blocks, or hashes the
    caller supplied) they are derived from ``request.hash_extras`` over the block's span.
    """

    def __init__(self, groups: Sequence[GroupInfo], hash_block_size: int) -> None:
        self.groups = list(groups)
        self.hash_block_size = hash_block_size
        self._events: list[KVCacheEvent] = []
        # Block id -> the stored record that announced it (the record lists the block's
        # hash). Entries of evicted blocks may linger: they are replaced when the block is
        # stored again and ignored while it has no hash.
        self._announced: dict[int, BlockStored] = {}

    def stored(
        self,
        request: RequestLike,
        blocks: Sequence[int],
        hashes: list[bytes],
        start: int,
        end: int,
        skipped: Sequence[int],
        group: int,
    ) -> None:
        if not skipped:  # the usual case: one run
            runs = [(start, end)]
        else:
            runs = []
            first = start
            for i in (*skipped, end):
                if i > first:
                    runs.append((first, i))
                first = i + 1
        info = self.groups[group]
        bs = info.block_size
        extras = request.hash_extras
        lora = extras.lora if extras is not None else None
        lora_id = lora.adapter_id if lora else None
        lora_name = lora.name if lora else None
        tokens = request.all_token_ids
        recorded = request.block_extra_keys
        reuse = bs == self.hash_block_size and len(recorded) >= end
        announced = self._announced
        for first, last in runs:
            if extras is None:
                extra: list[Any] = [None] * (last - first)
            elif reuse:
                extra = recorded[first:last]
            else:
                extra = [extras.block_keys(j * bs, (j + 1) * bs) for j in range(first, last)]
            event = BlockStored(
                hashes[first:last], hashes[first - 1] if first else None,
                tokens[first * bs : last * bs], bs, lora_id, MEDIUM_GPU, lora_name, extra,
                group, info.kind, info.sliding_window,
            )
            self._events.append(event)
            announced.update(dict.fromkeys(blocks[first:last], event))

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
            extra = request.block_extra_keys[i]
        else:
            extra = extras.block_keys(i * hbs, (i + 1) * hbs)
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
            self._announced[block] = event
        self._events.append(event)

    def removed(self, hashes: list[bytes], group: int) -> None:
        self._events.append(BlockRemoved(hashes, MEDIUM_GPU, group))

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

        def position(b: int) -> tuple[BlockStored, int]:
            event = announced[b]
            h = block_hash[b]
            return event, (event.block_hashes.index(h) if h in event.block_hashes else 0)

        def parent_of(b: int) -> bytes | None:
            event, k = position(b)
            return event.block_hashes[k - 1] if k else event.parent_block_hash

        known = {h for h, _ in cached.values()}
        children: dict[bytes | None, list[int]] = {}
        for b in cached:
            parent = parent_of(b)
            children.setdefault(parent if parent in known else None, []).append(b)
        out: list[BlockStored] = []
        todo = sorted(children.get(None, []))
        while todo:
            b = todo.pop()
            h, g = cached[b]
            event, k = position(b)
            bs = event.block_size
            info = self.groups[g]
            out.append(
                BlockStored(
                    [h], parent_of(b), event.token_ids[k * bs : (k + 1) * bs], bs,
                    event.lora_id, MEDIUM_GPU, event.lora_name,
                    [event.extra_keys[k] if event.extra_keys else None], g, info.kind,
                    info.sliding_window,
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
                event = self._announced.get(b)
                assert event is not None, f"cached block {b} was never announced"
                assert h in event.block_hashes, f"block {b}'s record lists other hashes"
