"""KV-cache tensors from a plan: one tensor per planned tensor, views per layer kind."""

from __future__ import annotations

import math

import pytest
import torch

from pagedkv import FullAttentionSpec, InvalidArgumentError, MambaSpec, MLAAttentionSpec
from pagedkv.planner import plan_kv_cache
from pagedkv.torch import KVCacheTensors


def _full(block_size: int = 8) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=8, dtype_bytes=4)


def _plan(layers: dict, num_blocks: int = 50):  # type: ignore[no-untyped-def]
    return plan_kv_cache(layers, available_bytes=1 << 30, max_model_len=64,
                         num_blocks=num_blocks, kernel_block_alignment=8)


def test_one_tensor_per_layer_for_one_kind() -> None:
    plan = _plan({"a": _full(), "b": _full()})
    cache = KVCacheTensors(plan, dtype=torch.float32)
    cache.check_invariants()
    assert len(cache.raw) == 2 == len(plan.tensors)
    assert [r.numel() for r in cache.raw] == [t.size_bytes for t in plan.tensors]
    assert cache.kv("a").shape == (50, 2, 8, 2, 8)
    assert cache.kv("a").data_ptr() != cache.kv("b").data_ptr()


def test_hybrid_groups_share_a_tensor_and_state_is_padded() -> None:
    state = MambaSpec(block_size=8, state_bytes=128, cache_checkpoints=True)
    plan = _plan({"attn": _full(), "ssm": state})
    cache = KVCacheTensors(plan, dtype=torch.float32, fill=0.0)
    cache.check_invariants()
    assert len(plan.tensors) == 1 and set(plan.tensors[0].shared_by) == {"attn", "ssm"}
    kv, st = cache.kv("attn"), cache.state("ssm")
    assert st.shape == (50, 32) and st.stride() == (256, 1)  # 128 of 1,024 bytes per page
    st[5] = 7.0  # block 5 of the state layer is block 5 of the shared tensor
    assert kv[5].flatten()[:32].eq(7.0).all() and kv[4].eq(0.0).all() and kv[6].eq(0.0).all()


def test_mla_view_is_one_latent_per_token() -> None:
    mla = MLAAttentionSpec(block_size=8, num_kv_heads=1, head_size=16, dtype_bytes=2)
    cache = KVCacheTensors(_plan({"m": mla}), dtype=torch.bfloat16)
    assert cache.latent("m").shape == (50, 8, 16)
    with pytest.raises(InvalidArgumentError, match="no K/V pages"):
        cache.kv("m")


def test_dtype_must_match_the_plan_and_unknown_layers_are_named() -> None:
    plan = _plan({"a": _full()})
    with pytest.raises(InvalidArgumentError, match=r"4-byte elements but torch\.float16"):
        KVCacheTensors(plan, dtype=torch.float16)
    cache = KVCacheTensors(plan, dtype=torch.float32)
    with pytest.raises(InvalidArgumentError, match="'zz' is not in the plan"):
        cache.kv("zz")
    with pytest.raises(InvalidArgumentError, match="has no state"):
        cache.state("a")


def test_public_names_resolve() -> None:
    import pagedkv.torch as pt

    assert pt.__all__ == sorted(pt.__all__)
    for name in pt.__all__:
        assert getattr(pt, name).__name__ == name
    with pytest.raises(AttributeError):
        pt.nope  # noqa: B018


def test_fill_blocks_never_touches_the_null_block() -> None:
    cache = KVCacheTensors(_plan({"a": _full()}), dtype=torch.float32, fill=1.0)
    null = cache.block_bytes(0)
    cache.fill_blocks([3, 4], math.nan)
    assert cache.kv("a")[3].isnan().all() and not cache.kv("a")[2].isnan().any()
    with pytest.raises(InvalidArgumentError, match="0 is the null block"):
        cache.fill_blocks([0, 3], 0.0)
    assert cache.block_bytes(0) == null
