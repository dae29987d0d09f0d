"""The KV-cache planner: a model's layers + memory -> groups, tensors and ``num_blocks``.

Start from a Hugging Face ``config.json`` (:func:`load_model_spec`,
:func:`model_spec_from_config`), a layer-spec file (:func:`load_layer_file`) or specs built
in Python, then call :func:`plan_kv_cache`; or let :func:`plan_model` do all of it with
vLLM 0.33's defaults for a GPU family (backend, block size, async scheduling, prefix
caching). :func:`estimate_weights` and :func:`kv_cache_budget` turn GPU memory into the
bytes left for KV. Needs only :mod:`pagedkv.core.specs`.

>>> from pagedkv.planner import load_model_spec, plan_kv_cache
>>> model = load_model_spec("Llama-3.1-8B")
>>> plan = plan_kv_cache(model.layer_to_spec, available_bytes=10 << 30,
...                      max_model_len=8192)
>>> plan.num_blocks, plan.kv_tokens
(5120, 81904)
"""

from pagedkv.planner.api import HYBRID_CHOICES, ModelPlan, plan_model
from pagedkv.planner.backends import BACKENDS, GPU_FAMILIES, AttentionBackend, GpuFamily
from pagedkv.planner.bundled import bundled_model_names, load_config
from pagedkv.planner.layer_file import LayerFileModel, load_layer_file, parse_layer_file
from pagedkv.planner.model_spec import KV_DTYPE_BYTES, ModelSpec
from pagedkv.planner.plan import (
    DEFAULT_KERNEL_BLOCK_ALIGNMENT,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    MAMBA_CACHE_MODES,
    KVCacheGroup,
    KVCachePlan,
    KVCacheTensor,
    PageUnification,
    cost_windows_as_full,
    estimate_max_model_len,
    group_blocks_per_request,
    plan_kv_cache,
    promote_windows_for_hybrid_off,
    unify_page_sizes,
    unify_worker_plans,
)
from pagedkv.planner.readers import load_model_spec, model_spec_from_config
from pagedkv.planner.readers.base import supported_model_types
from pagedkv.planner.units import format_bytes, parse_bytes
from pagedkv.planner.weights import (
    WEIGHT_DTYPE_BYTES,
    MemoryBudget,
    WeightEstimate,
    estimate_num_parameters,
    estimate_weights,
    kv_cache_budget,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_KERNEL_BLOCK_ALIGNMENT",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "GPU_FAMILIES",
    "HYBRID_CHOICES",
    "KV_DTYPE_BYTES",
    "MAMBA_CACHE_MODES",
    "WEIGHT_DTYPE_BYTES",
    "AttentionBackend",
    "GpuFamily",
    "KVCacheGroup",
    "KVCachePlan",
    "KVCacheTensor",
    "LayerFileModel",
    "MemoryBudget",
    "ModelPlan",
    "ModelSpec",
    "PageUnification",
    "WeightEstimate",
    "bundled_model_names",
    "cost_windows_as_full",
    "estimate_max_model_len",
    "estimate_num_parameters",
    "estimate_weights",
    "format_bytes",
    "group_blocks_per_request",
    "kv_cache_budget",
    "load_config",
    "load_layer_file",
    "load_model_spec",
    "model_spec_from_config",
    "parse_bytes",
    "parse_layer_file",
    "plan_kv_cache",
    "plan_model",
    "promote_windows_for_hybrid_off",
    "supported_model_types",
    "unify_page_sizes",
    "unify_worker_plans",
]
