"""The public surface is curated: pin it so additions are deliberate."""

from __future__ import annotations

import pytest

import pagedkv

EXPECTED = [
    "AllBlocksCleared", "BlockHasher", "BlockRemoved", "BlockStored", "CacheConfig",
    "ChunkedLocalAttentionSpec", "ComputedBlocks", "ConfigError", "CrossAttentionSpec",
    "DuplicateRequestError", "FullAttentionSpec", "HashExtras", "InputFileError",
    "InsufficientMemoryError", "InvalidArgumentError", "InvalidHitError",
    "KVCacheEvent", "KVCacheManager", "KVCacheSpec", "LoRA", "MLAAttentionSpec", "MambaSpec",
    "MissingDependencyError", "MultiModalItem", "PagedKVError", "PinBudgetError",
    "PrefixCacheStats", "Request",
    "RequestLike", "SinkFullAttentionSpec", "SlidingWindowSpec", "SpecMergeError",
    "UnknownRequestError", "UnsupportedModelError", "__version__",
]


def test_public_api_is_pinned_and_sorted() -> None:
    assert pagedkv.__all__ == EXPECTED
    assert pagedkv.__all__ == sorted(pagedkv.__all__)
    for name in pagedkv.__all__:
        assert hasattr(pagedkv, name), name


def test_every_documented_error_is_importable_from_pagedkv() -> None:
    """errors.py's tree is the documented one: each class in it is public."""
    from pagedkv import errors

    for name in errors.__all__:
        assert getattr(pagedkv, name) is getattr(errors, name), name
        assert name in pagedkv.__all__, name


def test_error_tree() -> None:
    assert issubclass(pagedkv.InvalidArgumentError, ValueError)
    assert issubclass(pagedkv.UnknownRequestError, KeyError)
    assert issubclass(pagedkv.MissingDependencyError, ImportError)
    for name in ("InvalidArgumentError", "UnknownRequestError", "ConfigError",
                 "InputFileError", "MissingDependencyError", "SpecMergeError",
                 "InsufficientMemoryError", "UnsupportedModelError"):
        assert issubclass(getattr(pagedkv, name), pagedkv.PagedKVError)


def test_cache_config_from_plan_builds_a_working_manager() -> None:
    from pagedkv.planner import plan_kv_cache

    full = pagedkv.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                                     dtype_bytes=2)
    window = pagedkv.SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64,
                                       dtype_bytes=2, sliding_window=128)
    layers = {f"layers.{i}": full if i % 2 else window for i in range(4)}
    plan = plan_kv_cache(layers, available_bytes=64 << 20, max_model_len=2048)
    config = pagedkv.CacheConfig.from_plan(plan, enable_events=True)
    assert config.groups == tuple(g.spec for g in plan.groups)
    assert (config.num_blocks, config.max_model_len) == (plan.num_blocks, 2048)
    assert config.enable_events
    assert pagedkv.CacheConfig.from_plan(plan, max_model_len=512).max_model_len == 512
    mgr = pagedkv.KVCacheManager(config)
    req = mgr.new_request("r", list(range(100)))
    assert mgr.allocate_slots(req, 100) is not None
    mgr.check_invariants()


def test_from_spec_takes_only_cache_config_keywords() -> None:
    spec = pagedkv.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    mgr = pagedkv.KVCacheManager.from_spec(spec, num_blocks=8, max_model_len=64,
                                           hash_memo_blocks=0, drop_last_hit=True)
    assert mgr.config.hash_memo_blocks == 0 and mgr.config.drop_last_hit
    with pytest.raises(pagedkv.InvalidArgumentError, match="enable_cachng"):
        pagedkv.KVCacheManager.from_spec(spec, num_blocks=8, max_model_len=64,
                                         enable_cachng=False)


def test_from_spec_and_from_plan_take_every_field() -> None:
    """Both are derived from CacheConfig's fields, so neither can lag behind them."""
    import dataclasses

    from pagedkv.planner import plan_kv_cache

    spec = pagedkv.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    plan = plan_kv_cache({"l0": spec}, available_bytes=1 << 20, max_model_len=64)
    base = pagedkv.CacheConfig(groups=(spec,), num_blocks=8, max_model_len=64)
    for f in dataclasses.fields(pagedkv.CacheConfig):
        if f.name in ("groups", "num_blocks", "max_model_len"):
            continue
        value = getattr(base, f.name)
        mgr = pagedkv.KVCacheManager.from_spec(spec, num_blocks=8, max_model_len=64,
                                               **{f.name: value})
        assert getattr(mgr.config, f.name) == value
        assert getattr(pagedkv.CacheConfig.from_plan(plan, **{f.name: value}), f.name) == value
