"""The public surface is curated: pin it so additions are deliberate."""

from __future__ import annotations

import pagedkv

EXPECTED = [
    "AllBlocksCleared", "BlockHasher", "BlockRemoved", "BlockStored", "CacheConfig",
    "ChunkedLocalAttentionSpec", "ComputedBlocks", "ConfigError", "CrossAttentionSpec",
    "FullAttentionSpec", "HashExtras", "InputFileError", "InsufficientMemoryError",
    "InvalidArgumentError",
    "KVCacheEvent", "KVCacheManager", "KVCacheSpec", "LoRA", "MLAAttentionSpec", "MambaSpec",
    "MissingDependencyError", "MultiModalItem", "PagedKVError", "PrefixCacheStats", "Request",
    "RequestLike", "SinkFullAttentionSpec", "SlidingWindowSpec", "SpecMergeError",
    "UnknownRequestError", "UnsupportedModelError", "__version__",
]


def test_public_api_is_pinned_and_sorted() -> None:
    assert pagedkv.__all__ == EXPECTED
    assert pagedkv.__all__ == sorted(pagedkv.__all__)
    for name in pagedkv.__all__:
        assert hasattr(pagedkv, name), name


def test_error_tree() -> None:
    assert issubclass(pagedkv.InvalidArgumentError, ValueError)
    assert issubclass(pagedkv.UnknownRequestError, KeyError)
    assert issubclass(pagedkv.MissingDependencyError, ImportError)
    for name in ("InvalidArgumentError", "UnknownRequestError", "ConfigError",
                 "InputFileError", "MissingDependencyError", "SpecMergeError",
                 "InsufficientMemoryError", "UnsupportedModelError"):
        assert issubclass(getattr(pagedkv, name), pagedkv.PagedKVError)
