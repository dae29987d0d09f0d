"""Event records emitted by the block pool and taken by the engine once per step.

They are ``NamedTuple`` values (cheap to build on the hot path, immutable once built).
Block hashes are the full digests (``bytes``); the wire layer converts them to the
unsigned 64-bit ints routers expect.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
    "WireForm",
]

WireForm = Literal["map", "array"]
"""``"map"``: events as maps keyed by field name with a ``"type"`` key (vLLM >= 0.24).
``"array"``: events as tagged arrays with every field (vLLM <= 0.23)."""

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


class BlockStored(NamedTuple):
    """Full blocks that became reusable under ``block_hashes`` (parent before children).

    ``token_ids`` covers exactly ``len(block_hashes) * block_size`` tokens;
    ``extra_keys`` holds one entry per block (``None`` when the block has none).
    ``parent_block_hash`` is ``None`` for a chain that starts at the first block.
    ``lookahead_token_ids`` (hash lookahead on, ``CacheConfig.num_hash_lookahead_tokens``
    L > 0): per block, the L tokens after it that its hash also covers; ``None`` when off.
    """

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None
    group_idx: int
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(NamedTuple):
    """Blocks that are no longer reusable (evicted from the prefix index)."""

    block_hashes: list[bytes]
    medium: str | None
    group_idx: int = 0


class AllBlocksCleared(NamedTuple):
    """The whole prefix index was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
