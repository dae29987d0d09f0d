"""KV-cache events: what the pool stored, removed or cleared.

The record types here are dependency-free; the wire encoding (msgpack, vLLM's format) and
the ZeroMQ publisher/subscriber live in submodules that import their optional extras.
"""

from pagedkv.events.records import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
]
