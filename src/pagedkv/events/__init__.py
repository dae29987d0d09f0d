"""KV-cache events: what the pool stored, removed or cleared.

The record types and the publisher config here are dependency-free; the wire encoding
(msgpack, vLLM's format) and the ZeroMQ publisher/subscriber live in submodules
(``wire``, ``publisher``, ``subscriber``) that import their optional extras.
"""

from pagedkv.core.records import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from pagedkv.events.config import KVEventsConfig, kv_topic

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
    "KVEventsConfig",
    "kv_topic",
]
