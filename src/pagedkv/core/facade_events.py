"""The façade's events: the buffered KV-cache events, their publisher and the snapshot
that recreates the prefix index.

Functions taking the manager; :class:`pagedkv.KVCacheManager` holds each as its method of
the same name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedkv.core.records import BlockStored, KVCacheEvent

if TYPE_CHECKING:
    from pagedkv.core.facade_state import Facade


def take_events(self: Facade) -> list[KVCacheEvent]:
    """The events buffered since the last call (empty when events are off): the
    device's, then each component's own (a host tier's, medium ``"CPU"``)."""
    events = self.recorder.take()
    for take in self._hooks.take_events:
        events += take()
    return events


def publish_events(self: Facade) -> int:
    """Hand the events since the last call to the publisher (``CacheConfig.kv_events``)
    and return how many there were. Call once per step, also when nothing happened
    (snapshot requests are answered then). Never blocks: the publisher drops and
    counts batches past its queue. Without a publisher the events are discarded."""
    events = take_events(self)
    if self.publisher is not None:
        self.publisher.publish(events)
    return len(events)


def close(self: Facade) -> None:
    """Release the event publisher's sockets and thread (if any). Idempotent."""
    if self.publisher is not None:
        self.publisher.close()
        self.publisher = None


def prefix_index_snapshot(self: Facade) -> list[BlockStored]:
    """Stored events recreating the current prefix index (events must be on)."""
    return self.recorder.snapshot(self.pool.block_hash, self.pool.block_group)
