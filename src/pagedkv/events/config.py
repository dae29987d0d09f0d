"""Configuration of the KV-cache event publisher: :class:`KVEventsConfig`, the value
``CacheConfig(kv_events=...)`` takes (its fields and checks are
:class:`~pagedkv.events.settings.KVEventsSettings`; nothing here imports ZeroMQ until a
manager builds its publisher).

>>> KVEventsConfig(endpoint="tcp://127.0.0.1:5557").wire_form
'map'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pagedkv.core.components import EventPublisher
from pagedkv.core.records import BlockStored
from pagedkv.events.settings import (
    DEFAULT_ENDPOINT,
    KVEventsSettings,
    WireForm,
    binds_beyond_loopback,
    kv_topic,
    should_bind,
)

__all__ = ["DEFAULT_ENDPOINT", "KVEventsConfig", "WireForm", "binds_beyond_loopback", "kv_topic",
           "should_bind"]


@dataclass(frozen=True, kw_only=True, slots=True)
class KVEventsConfig(KVEventsSettings):
    """Where and how KV-cache events are published (fields: :class:`KVEventsSettings`)."""

    def make_publisher(
        self, snapshot_fn: Callable[[], list[BlockStored]]
    ) -> EventPublisher:
        """The ZeroMQ publisher for this config (needs the ``events`` extra), answering
        snapshot requests with ``snapshot_fn()``."""
        from pagedkv.events.publisher import ZmqEventPublisher

        return ZmqEventPublisher(self, snapshot_fn=snapshot_fn)
