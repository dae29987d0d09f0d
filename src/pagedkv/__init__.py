"""pagedkv: a standalone paged KV-cache manager with automatic prefix caching.

The public API is what ``__all__`` lists; everything else is internal.
"""

from pagedkv import _moved
from pagedkv.core.config import CacheConfig
from pagedkv.core.hashing import BlockHasher, HashExtras, LoRA, MultiModalItem
from pagedkv.core.manager import ComputedBlocks, KVCacheManager
from pagedkv.core.metrics import PrefixCacheStats
from pagedkv.core.records import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.core.request import Request, RequestLike
from pagedkv.core.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
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

__version__ = "0.1.0"

_moved.install()

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
