"""pagedkv: a standalone paged KV-cache manager with automatic prefix caching.

The public API is what ``__all__`` lists; everything else is internal.
"""

from pagedkv.config import CacheConfig
from pagedkv.errors import (
    ConfigError,
    DuplicateRequestError,
    InputFileError,
    InsufficientMemoryError,
    InvalidArgumentError,
    InvalidHitError,
    MissingDependencyError,
    PagedKVError,
    PinBudgetError,
    SpecMergeError,
    UnknownRequestError,
    UnsupportedModelError,
)
from pagedkv.events.records import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.hashing import BlockHasher, HashExtras, LoRA, MultiModalItem
from pagedkv.manager import ComputedBlocks, KVCacheManager
from pagedkv.metrics import PrefixCacheStats
from pagedkv.request import Request, RequestLike
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

__version__ = "0.1.0"

__all__ = [
    "AllBlocksCleared",
    "BlockHasher",
    "BlockRemoved",
    "BlockStored",
    "CacheConfig",
    "ChunkedLocalAttentionSpec",
    "ComputedBlocks",
    "ConfigError",
    "CrossAttentionSpec",
    "DuplicateRequestError",
    "FullAttentionSpec",
    "HashExtras",
    "InputFileError",
    "InsufficientMemoryError",
    "InvalidArgumentError",
    "InvalidHitError",
    "KVCacheEvent",
    "KVCacheManager",
    "KVCacheSpec",
    "LoRA",
    "MLAAttentionSpec",
    "MambaSpec",
    "MissingDependencyError",
    "MultiModalItem",
    "PagedKVError",
    "PinBudgetError",
    "PrefixCacheStats",
    "Request",
    "RequestLike",
    "SinkFullAttentionSpec",
    "SlidingWindowSpec",
    "SpecMergeError",
    "UnknownRequestError",
    "UnsupportedModelError",
    "__version__",
]
