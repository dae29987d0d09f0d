"""specs + bytes -> plan: the layouts of SPEC 3.8 with exact figures, the memory check with
its binary search, overrides, worker unification, and layout invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_configs import NEMOTRON_H_8B, QWEN3_NEXT_80B

from pagedkv.core.specs import FullAttentionSpec, KVCacheSpec, MambaSpec, SlidingWindowSpec
from pagedkv.errors import ConfigError, InsufficientMemoryError, InvalidArgumentError
from pagedkv.planner import (
    KVCachePlan,
    bundled_model_names,
    cost_windows_as_full,
    estimate_max_model_len,
    load_model_spec,
    model_spec_from_config,
    plan_kv_cache,
    promote_windows_for_hybrid_off,
    unify_page_sizes,
    unify_worker_plans,
)

GiB = 1 << 30


def specs(name: str, **kwargs: object) -> dict[str, KVCacheSpec]:
    return load_model_spec(name, **kwargs).layer_to_spec  # type: ignore[arg-type]


def check_layout(plan: KVCachePlan, layer_to_spec: dict[str, KVCacheSpec]) -> None:
    """Every layer in exactly one group and one tensor; a tensor holds at most one layer of
    each group; groups are equally sized (with padding); pages are equal; tensors are
    num_blocks pages."""
    group_of, tensor_of = plan.layer_to_group(), plan.layer_to_tensor()
    assert set(group_of) == set(layer_to_spec) == set(tensor_of)
    assert sum(len(g.layer_names) for g in plan.groups) == len(layer_to_spec)
    assert sum(len(t.shared_by) for t in plan.tensors) == len(layer_to_spec)
    assert len(plan.tensors) == plan.group_size
    for tensor in plan.tensors:
        groups = [group_of[name] for name in tensor.shared_by]
        assert len(groups) == len(set(groups))
        assert tensor.size_bytes == plan.num_blocks * (plan.page_size_bytes or 0)
    for group in plan.groups:
        assert len(group.layer_names) + group.num_padding_layers == plan.group_size
        assert group.spec.page_size_bytes == plan.page_size_bytes
    assert plan.total_bytes <= plan.available_bytes or plan.notes


# -- one kind ------------------------------------------------------------------------------


def test_uniform_full_attention() -> None:
    layers = specs("Llama-3.1-8B")
    plan = plan_kv_cache(layers, available_bytes=10 * GiB, max_model_len=8192)
    check_layout(plan, layers)
    assert plan.page_size_bytes == 65_536  # 2 x 16 x 8 x 128 x 2
    assert plan.num_blocks == 5_120  # 10 GiB // (65,536 x 32)
    assert len(plan.groups) == 1 and len(plan.tensors) == 32
    assert plan.tensors[5].shared_by == ("layers.5",)
    assert plan.tensors[0].size_bytes == 5_120 * 65_536
    assert plan.kv_tokens == 5_119 * 16  # block 0 is the null block
    assert plan.blocks_per_request == 512
    assert plan.max_concurrency == 5_120 / 512  # vLLM 0.33 divides num_blocks
    assert plan.usable_concurrency == pytest.approx(5_119 / 512)  # null block held back
    assert plan.kv_cache_size_tokens == 81_920
    assert plan.vllm_log_line == ("GPU KV cache size: 81,920 tokens, Maximum concurrency "
                                  "for 8,192 tokens per request: 10.00x")
    assert plan.bytes_per_token == 131_072
    assert plan.num_padding_layers == 0 and plan.padding_waste_fraction == 0.0


def test_mla() -> None:
    layers = specs("DeepSeek-V3")
    plan = plan_kv_cache(layers, available_bytes=20 * GiB, max_model_len=163_840)
    assert plan.page_size_bytes == 16 * 576 * 2
    assert plan.num_blocks == 20 * GiB // (18_432 * 61)
    assert plan.bytes_per_token == 70_272


def test_all_sliding_is_one_group_and_windows_bound_requests() -> None:
    layers = specs("Mistral-7B-v0.1")
    on = plan_kv_cache(layers, available_bytes=10 * GiB, max_model_len=32_768)
    off = plan_kv_cache(layers, available_bytes=10 * GiB, max_model_len=32_768, hybrid=False)
    sync = plan_kv_cache(layers, available_bytes=10 * GiB, max_model_len=32_768,
                         async_scheduling=False)
    assert len(on.groups) == len(off.groups) == 1
    assert isinstance(on.groups[0].spec, SlidingWindowSpec)
    # vLLM keeps a model of one kind as it is with the hybrid allocator off
    assert isinstance(off.groups[0].spec, SlidingWindowSpec)
    # window 4096 + 8192 tokens per step: ceil(12,287 / 16) + 1 = 769 blocks; with async
    # scheduling two steps are in flight: ceil((4,095 + 16,384) / 16) + 1 = 1,281
    assert sync.blocks_per_request == 769
    assert on.blocks_per_request == off.blocks_per_request == 1_281
    assert on.num_blocks == off.num_blocks == 5_120
    assert on.max_concurrency == pytest.approx(5_120 / 1_281)
    assert sync.usable_concurrency == pytest.approx(5_119 / 769)


# -- several kinds, equal pages ---------------------------------------------------------------


def test_gemma_3_groups_of_ten_with_eight_padding_layers() -> None:
    layers = specs("Gemma-3-27B-it")
    plan = plan_kv_cache(layers, available_bytes=20 * GiB, max_model_len=32_768)
    check_layout(plan, layers)
    assert plan.group_size == 10
    assert [g.spec.kind for g in plan.groups] == ["sliding_window"] * 6 + ["full_attention"]
    # vLLM deals the 52 sliding layers out in turn: layers[i::6]
    assert [len(g.layer_names) for g in plan.groups] == [9, 9, 9, 9, 8, 8, 10]
    sliding = [f"layers.{i}" for i in range(62) if (i + 1) % 6]
    assert [list(g.layer_names) for g in plan.groups[:6]] == [sliding[i::6] for i in range(6)]
    assert plan.groups[5].num_padding_layers == 2
    assert plan.groups[6].layer_names == tuple(f"layers.{i}" for i in range(5, 62, 6))
    assert plan.num_padding_layers == 8
    assert plan.padding_waste_fraction == pytest.approx(8 / 70)
    assert len(plan.tensors) == 10
    assert [len(t.shared_by) for t in plan.tensors] == [7, 7, 7, 7, 7, 7, 7, 7, 5, 1]
    assert plan.tensors[1].shared_by == tuple(g.layer_names[1] for g in plan.groups)
    page = 2 * 16 * 16 * 128 * 2
    assert plan.num_blocks == 20 * GiB // (page * 10) == 16_384
    # full: 2,048 blocks; each sliding group: ceil((1,023 + 2 x 8,192) / 16) + 1 = 1,089
    assert plan.blocks_per_request == 2_048 + 6 * 1_089
    sync = plan_kv_cache(layers, available_bytes=20 * GiB, max_model_len=32_768,
                         async_scheduling=False)  # one batch in flight: 577 per group
    assert sync.blocks_per_request == 2_048 + 6 * 577
    assert any("8 padding layers added to the 52 sliding_window layers" in n
               and "15.38 %" in n for n in plan.notes)


def test_gemma_3_hybrid_off_is_one_group_of_62() -> None:
    layers = specs("Gemma-3-27B-it")
    on = plan_kv_cache(layers, available_bytes=20 * GiB, max_model_len=32_768)
    off = plan_kv_cache(layers, available_bytes=20 * GiB, max_model_len=32_768, hybrid=False)
    check_layout(off, cost_windows_as_full(layers))
    assert len(off.groups) == 1 and len(off.tensors) == 62
    assert off.num_blocks == 20 * GiB // (131_072 * 62)
    assert off.blocks_per_request == 2_048
    sync = plan_kv_cache(layers, available_bytes=20 * GiB, max_model_len=32_768,
                         async_scheduling=False)
    assert on.max_concurrency is not None and off.max_concurrency is not None
    assert sync.max_concurrency is not None
    assert sync.max_concurrency > 2 * off.max_concurrency
    assert on.max_concurrency > 1.4 * off.max_concurrency  # async: 2 batches in flight
    assert sync.tokens_at_max_model_len is not None
    assert off.tokens_at_max_model_len is not None
    assert sync.tokens_at_max_model_len > 2 * off.tokens_at_max_model_len


def test_llama_4_scout_groups() -> None:
    layers = specs("Llama-4-Scout-17B-16E-Instruct")
    plan = plan_kv_cache(layers, available_bytes=30 * GiB, max_model_len=131_072)
    check_layout(plan, layers)
    assert [g.spec.kind for g in plan.groups] == ["chunked_local_attention"] * 3 + [
        "full_attention"]
    assert plan.group_size == 12 and plan.num_padding_layers == 0
    # chunked (vLLM 0.33, no extra block): ceil(min(8192 + 2 x 8192, L) / 16) = 1,536 per
    # group; full 8,192
    assert plan.blocks_per_request == 8_192 + 3 * 1_536
    sync = plan_kv_cache(layers, available_bytes=30 * GiB, max_model_len=131_072,
                         async_scheduling=False)
    assert sync.blocks_per_request == 8_192 + 3 * 1_024


def test_cost_windows_as_full_records_window() -> None:
    layers = specs("Llama-4-Scout-17B-16E-Instruct")
    full = cost_windows_as_full(layers)
    assert full["layers.0"] == FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128,
                                                 dtype_bytes=2, attention_chunk_size=8192)
    assert full["layers.3"] == layers["layers.3"]


# -- unequal pages: attention + state ---------------------------------------------------------


def test_jamba_block_grown_and_state_padded() -> None:
    layers = specs("AI21-Jamba-1.5-Mini")
    plan = plan_kv_cache(layers, available_bytes=10 * GiB, max_model_len=262_144)
    unification = plan.page_unification
    assert unification is not None
    assert unification.block_size == 80  # 16 x ceil(311,296 / (16 x 4,096))
    assert unification.page_size_bytes == 327_680  # 80 x 4,096
    assert unification.state_padding_bytes == 16_384
    assert unification.state_padding_pct == pytest.approx(100 * 16_384 / 311_296)
    assert plan.block_size == 80
    assert plan.group_size == 4
    assert [g.spec.kind for g in plan.groups] == ["mamba"] * 7 + ["full_attention"]
    mamba = plan.groups[0].spec
    assert isinstance(mamba, MambaSpec)
    assert mamba.state_bytes == 311_296 and mamba.page_size_bytes == 327_680
    assert len(plan.tensors) == 4 and all(len(t.shared_by) == 8 for t in plan.tensors)
    assert plan.num_blocks == 10 * GiB // (327_680 * 4) == 8_192
    assert plan.blocks_per_request == 262_144 // 80 + 1 + 7  # attention + one state/group
    assert "grown from 16 to 80" in plan.notes[0]
    assert "(5.26 %)" in plan.notes[1]
    check_layout(plan, unify_page_sizes(layers)[0])


def test_requested_block_size_larger_than_needed_is_kept() -> None:
    layers = specs("AI21-Jamba-1.5-Mini", block_size=128)
    unified, unification = unify_page_sizes(layers)
    assert unification is not None and unification.block_size == 128
    assert unification.page_size_bytes == 128 * 4096
    assert unified["layers.0"].page_size_bytes == 128 * 4096


def test_kernel_alignment() -> None:
    _, unification = unify_page_sizes(specs("AI21-Jamba-1.5-Mini"), kernel_block_alignment=64)
    assert unification is not None and unification.block_size == 128  # 64 x ceil(76 / 64)


def test_qwen3_next_block_size_544() -> None:
    layers = model_spec_from_config(QWEN3_NEXT_80B).layer_to_spec
    plan = plan_kv_cache(layers, available_bytes=10 * GiB, max_model_len=32_768)
    # attention 2 x 2 x 256 x 2 = 2,048 B/token; 16 x ceil(1,097,728 / 32,768) = 544
    assert plan.block_size == 544 and plan.page_size_bytes == 544 * 2048
    assert plan.group_size == 12 and len(plan.groups) == 4


def test_nemotron_h_block_size() -> None:
    layers = model_spec_from_config(NEMOTRON_H_8B,
                                    mamba_ssm_cache_dtype="bfloat16").layer_to_spec
    plan = plan_kv_cache(layers, available_bytes=10 * GiB, max_model_len=8192)
    assert plan.block_size == 528  # 16 x ceil(2,158,592 / 65,536)
    assert plan.group_size == 4 and len(plan.groups) == 7
    # vLLM's default keeps the SSM state in float32: 61,440 + 4,194,304 bytes
    default = plan_kv_cache(model_spec_from_config(NEMOTRON_H_8B).layer_to_spec,
                            available_bytes=10 * GiB, max_model_len=8192)
    assert default.block_size == 1040  # 16 x ceil(4,255,744 / 65,536)


@settings(max_examples=60, deadline=None)
@given(state_bytes=st.integers(1, 10**8), heads=st.integers(1, 16),
       head_size=st.sampled_from([64, 128, 256]), alignment=st.sampled_from([8, 16, 64]))
def test_grown_block_is_the_smallest_aligned_block_covering_the_state(
        state_bytes: int, heads: int, head_size: int, alignment: int) -> None:
    layers: dict[str, KVCacheSpec] = {
        "a": FullAttentionSpec(block_size=1, num_kv_heads=heads, head_size=head_size,
                               dtype_bytes=2),
        "m": MambaSpec(block_size=1, state_bytes=state_bytes),
    }
    unified, unification = unify_page_sizes(layers, kernel_block_alignment=alignment)
    assert unification is not None
    block, page = unification.block_size, unification.page_size_bytes
    per_token = 2 * heads * head_size * 2
    assert block % alignment == 0 and page == block * per_token >= state_bytes
    assert (block - alignment) * per_token < state_bytes
    assert unified["a"].page_size_bytes == unified["m"].page_size_bytes == page


def test_unequal_attention_pages_are_an_error() -> None:
    layers: dict[str, KVCacheSpec] = {
        "a": FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2),
        "b": SlidingWindowSpec(block_size=16, num_kv_heads=4, head_size=128, dtype_bytes=2,
                               sliding_window=512),
    }
    with pytest.raises(ConfigError, match="unequal page sizes"):
        plan_kv_cache(layers, available_bytes=GiB, max_model_len=1024)


# -- trivial cases -----------------------------------------------------------------------------


def test_attention_free_model() -> None:
    plan = plan_kv_cache({}, available_bytes=0, max_model_len=4096)
    assert plan.num_blocks == 1 and plan.groups == () and plan.tensors == ()
    assert plan.max_concurrency is None and plan.kv_tokens == 0


def test_state_only_model_is_one_group_without_growth() -> None:
    layers: dict[str, KVCacheSpec] = {
        f"layers.{i}": MambaSpec(block_size=16, state_bytes=1_000_000) for i in range(4)}
    plan = plan_kv_cache(layers, available_bytes=GiB, max_model_len=1 << 20)
    assert plan.page_unification is None and len(plan.groups) == 1
    assert plan.num_blocks == GiB // 4_000_000 and plan.blocks_per_request == 1


# -- memory check -----------------------------------------------------------------------------


def test_not_enough_memory_states_figures_and_largest_length() -> None:
    layers = specs("Llama-3.1-70B")
    with pytest.raises(InsufficientMemoryError) as info:
        plan_kv_cache(layers, available_bytes=GiB, max_model_len=131_072,
                      model_name="Llama-3.1-70B")
    error = info.value
    # (8,192 blocks + the null block) x 65,536 B x 80 layers
    assert error.needed_bytes == 8_193 * 65_536 * 80 == 42_954_915_840
    assert error.available_bytes == GiB
    # 1 GiB // (65,536 x 80) = 204 blocks: 203 after the null block = 3,248 tokens
    assert error.max_model_len_that_fits == 3_248
    assert str(error).startswith(
        "Llama-3.1-70B: one request of max_model_len 131,072 tokens needs "
        "42,954,915,840 bytes (40.00 GiB) of KV cache, but only 1,073,741,824 bytes "
        "(1.00 GiB) is available; the largest max_model_len that fits is 3,248.")
    plan_kv_cache(layers, available_bytes=GiB, max_model_len=3_248)
    with pytest.raises(InsufficientMemoryError):
        plan_kv_cache(layers, available_bytes=GiB, max_model_len=3_249)


def test_no_memory_at_all() -> None:
    with pytest.raises(InsufficientMemoryError, match="not even a one-token request fits"):
        plan_kv_cache(specs("Llama-3.1-8B"), available_bytes=0, max_model_len=4096)


@settings(max_examples=40, deadline=None)
@given(available=st.integers(0, 8 * GiB), name=st.sampled_from(
    ["Gemma-3-27B-it", "AI21-Jamba-1.5-Mini", "Mistral-7B-v0.1", "Llama-3.1-8B"]))
def test_estimated_length_is_the_largest_that_plans(available: int, name: str) -> None:
    layers = specs(name)
    upper = 200_000
    fits = estimate_max_model_len(layers, available, upper=upper)
    if fits:
        plan_kv_cache(layers, available_bytes=available, max_model_len=fits)
    if fits < upper:
        with pytest.raises(InsufficientMemoryError) as info:
            plan_kv_cache(layers, available_bytes=available, max_model_len=fits + 1)
        assert info.value.max_model_len_that_fits == fits


# -- overrides and arguments --------------------------------------------------------------------


def test_num_blocks_override() -> None:
    layers = specs("Llama-3.1-8B")
    plan = plan_kv_cache(layers, available_bytes=GiB, max_model_len=8192, num_blocks=1000)
    assert plan.num_blocks == 1000 and plan.tensors[0].size_bytes == 1000 * 65_536
    assert "num_blocks overridden: 1,000 (memory would give 512)" in plan.notes
    with pytest.raises(ConfigError, match="below the 513 blocks"):
        plan_kv_cache(layers, available_bytes=GiB, max_model_len=8192, num_blocks=512)


@pytest.mark.parametrize("kwargs", [
    {"available_bytes": -1, "max_model_len": 10},
    {"available_bytes": GiB, "max_model_len": 0},
    {"available_bytes": GiB, "max_model_len": 10, "num_blocks": 0},
    {"available_bytes": GiB, "max_model_len": 10, "max_num_batched_tokens": -5},
])
def test_invalid_arguments(kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidArgumentError):
        plan_kv_cache(specs("Llama-3.1-8B"), **kwargs)  # type: ignore[arg-type]


# -- several workers --------------------------------------------------------------------------


def test_unify_workers_takes_smallest_num_blocks() -> None:
    layers = specs("Gemma-3-27B-it")
    a = plan_kv_cache(layers, available_bytes=20 * GiB, max_model_len=8192)
    b = plan_kv_cache(dict(reversed(list(layers.items()))), available_bytes=18 * GiB,
                      max_model_len=8192)
    assert a.num_blocks > b.num_blocks
    unified = unify_worker_plans([a, b])
    assert [p.num_blocks for p in unified] == [b.num_blocks, b.num_blocks]
    assert unified[0].tensors == a.tensors  # tensors keep their size


def test_unify_workers_with_different_groups_fails() -> None:
    a = plan_kv_cache(specs("Llama-3.1-8B"), available_bytes=GiB, max_model_len=4096)
    b = plan_kv_cache(specs("Llama-3.1-8B", kv_dtype="fp8"), available_bytes=GiB,
                      max_model_len=4096)
    with pytest.raises(ConfigError, match="worker 1's KV-cache groups differ"):
        unify_worker_plans([a, b])
    with pytest.raises(InvalidArgumentError):
        unify_worker_plans([])


# -- every bundled model, both modes ---------------------------------------------------------


@pytest.mark.parametrize("name", bundled_model_names())
@pytest.mark.parametrize("hybrid", [True, False])
def test_bundled_layouts_are_consistent(name: str, hybrid: bool) -> None:
    model = load_model_spec(name)
    layers = model.layer_to_spec
    if not hybrid and model.mamba_mixer is not None:
        with pytest.raises(ConfigError, match="cannot be promoted to one KV-cache type"):
            plan_kv_cache(layers, available_bytes=40 * GiB, max_model_len=16_384,
                          hybrid=hybrid)
        return
    plan = plan_kv_cache(layers, available_bytes=40 * GiB, max_model_len=16_384,
                         hybrid=hybrid)
    prepared = unify_page_sizes(layers if hybrid
                                else promote_windows_for_hybrid_off(layers))[0]
    check_layout(plan, prepared)
    assert plan.bytes_per_token == model.bytes_per_token
    assert plan.as_dict()["num_blocks"] == plan.num_blocks
