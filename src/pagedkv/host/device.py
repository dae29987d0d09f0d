"""How the device tier feeds the host tier, without touching the core pool or recorder:

* :class:`EvictionListener` — a pool listener (:mod:`pagedkv.core.components`) told of
  the cached blocks ``get_new_blocks`` evicts, with their ids, hashes and groups (the
  recorder hears only hashes). The pool looks at the blocks it is about to take from the
  free queue first: O(n), only while a listener is attached.
* :class:`HostFeedingRecorder` — wraps the manager's recorder (the null one or the event
  buffer), forwards every call, and reports registrations (for write-through) and, with
  host events on, what each registered block's CPU ``BlockStored`` event will need
  (:class:`BlockMeta`: parent hash, token ids, LoRA, extra keys).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pagedkv.core.components import DeviceBlock, PoolListener
from pagedkv.core.hashing import event_extra_keys
from pagedkv.core.recorder import EventRecorder, ForwardingRecorder, GroupInfo, StoredRun

__all__ = ["BlockMeta", "DeviceBlock", "EvictionListener", "HostFeedingRecorder"]



class BlockMeta(NamedTuple):
    """What a CPU ``BlockStored`` event of one block carries besides its hash."""

    parent_block_hash: bytes | None
    token_ids: list[int]
    lora_id: int | None
    lora_name: str | None
    extra_keys: Any


class EvictionListener(PoolListener):
    """A pool listener that calls ``on_evicted(blocks)`` after ``get_new_blocks`` evicted
    cached blocks, with every evicted ``(id, hash, group)`` in eviction order, leaving out
    keys another (duplicate) block still holds in the index."""

    def __init__(self, on_evicted: Callable[[list[DeviceBlock]], None]) -> None:
        self.on_evicted = on_evicted

    def evicted(self, blocks: list[DeviceBlock]) -> None:
        self.on_evicted(blocks)


class HostFeedingRecorder(ForwardingRecorder):
    """Forwards to ``inner``; tells ``on_registered`` about every newly registered block
    (only when ``wants_registrations``) and keeps :class:`BlockMeta` per device block id
    in ``meta`` (only when ``keep_meta``)."""

    def __init__(
        self, inner: EventRecorder, *, groups: Sequence[GroupInfo],
        on_registered: Callable[[list[DeviceBlock]], None],
        wants_registrations: bool, keep_meta: bool,
    ) -> None:
        super().__init__(inner)
        self.groups = list(groups)
        self.on_registered = on_registered
        self.wants_registrations = wants_registrations
        self.keep_meta = keep_meta
        #: Device block id -> meta of the content it was last registered with.
        self.meta: dict[int, BlockMeta] = {}

    def stored(self, run: StoredRun) -> None:
        self.inner.stored(run)
        request, blocks, hashes, start, end, skipped, group = run
        if not (self.keep_meta or self.wants_registrations):
            return
        left_out = set(skipped)
        positions = [i for i in range(start, end) if i not in left_out]
        if self.keep_meta:
            bs = self.groups[group].block_size
            tokens = request.all_token_ids
            extras = request.hash_extras
            lora = extras.lora if extras is not None else None
            for i in positions:
                extra = (None if extras is None
                         else event_extra_keys(extras.block_keys(i * bs, (i + 1) * bs)))
                self.meta[blocks[i]] = BlockMeta(
                    hashes[i - 1] if i else None, list(tokens[i * bs:(i + 1) * bs]),
                    lora.adapter_id if lora else None, lora.name if lora else None, extra)
        if self.wants_registrations and positions:
            self.on_registered([(blocks[i], hashes[i], group) for i in positions])

    def moved(self, src: int, dst: int) -> None:
        self.inner.moved(src, dst)
        meta = self.meta.pop(src, None)
        if meta is not None:
            self.meta[dst] = meta
