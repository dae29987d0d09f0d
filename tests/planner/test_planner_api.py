"""The planner's public surface is curated: ``__all__`` is sorted and pinned."""

from __future__ import annotations

import pagedkv.planner as planner


def test_all_is_pinned() -> None:
    assert planner.__all__ == [
        "BACKENDS", "DEFAULT_KERNEL_BLOCK_ALIGNMENT", "DEFAULT_MAX_NUM_BATCHED_TOKENS",
        "GPU_FAMILIES", "HYBRID_CHOICES", "KV_DTYPE_BYTES", "MAMBA_CACHE_MODES",
        "WEIGHT_DTYPE_BYTES", "AttentionBackend", "GpuFamily", "KVCacheGroup", "KVCachePlan",
        "KVCacheTensor", "LayerFileModel", "MemoryBudget", "ModelPlan", "ModelSpec",
        "PageUnification", "WeightEstimate", "bundled_model_names", "cost_windows_as_full",
        "estimate_max_model_len", "estimate_num_parameters", "estimate_weights",
        "format_bytes", "group_blocks_per_request", "kv_cache_budget", "load_config",
        "load_layer_file", "load_model_spec", "model_spec_from_config", "parse_bytes",
        "parse_layer_file", "plan_kv_cache", "plan_model", "promote_windows_for_hybrid_off",
        "supported_model_types", "unify_page_sizes", "unify_worker_plans",
    ]
    assert planner.__all__ == sorted(planner.__all__, key=lambda n: (not n.isupper(), n))
    for name in planner.__all__:
        assert hasattr(planner, name)


def test_supported_model_types() -> None:
    assert planner.supported_model_types() == [
        "deepseek_v2", "deepseek_v3", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt_oss",
        "jamba", "llama", "llama4", "llama4_text", "mistral", "mixtral", "nemotron_h",
        "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next",
    ]
