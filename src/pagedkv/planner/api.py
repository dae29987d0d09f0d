"""``plan_model``: a model and a GPU -> the KV-cache plan ``vllm serve`` would make.

The library entry point under ``pagedkv plan``: it reads the model (a ``config.json``, a
bundled name or a layer-spec file), picks the attention backend and block size vLLM 0.33
picks on the GPU family, applies its defaults (prefix caching on, async scheduling on,
``max_num_batched_tokens`` per GPU), turns GPU memory into KV bytes, and plans.

>>> result = plan_model("Llama-3.1-8B", kv_cache_bytes=10 << 30, max_model_len=8192)
>>> plan = result.plan
>>> plan.num_blocks, plan.blocks_per_request, round(plan.max_concurrency, 2)
(5120, 512, 10.0)
>>> plan.vllm_log_line
'GPU KV cache size: 81,920 tokens, Maximum concurrency for 8,192 tokens per request: 10.00x'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from pagedkv.core.specs import AttentionSpec, MambaSpec, MLAAttentionSpec
from pagedkv.errors import ConfigError, InvalidArgumentError
from pagedkv.planner.backends import GPU_FAMILIES, AttentionBackend, GpuFamily, pick_backend
from pagedkv.planner.bundled import load_config
from pagedkv.planner.gpus import resolve_gpu
from pagedkv.planner.layer_file import is_layer_file, load_layer_file, parse_layer_file
from pagedkv.planner.model_spec import KV_DTYPE_BYTES, ModelSpec
from pagedkv.planner.plan import KVCachePlan, plan_kv_cache
from pagedkv.planner.readers import model_spec_from_config
from pagedkv.planner.units import format_bytes
from pagedkv.planner.weights import (
    MemoryBudget,
    WeightEstimate,
    estimate_weights,
    kv_cache_budget,
)

__all__ = ["HYBRID_CHOICES", "ModelPlan", "plan_model"]

#: ``hybrid``: allocator on (vLLM's default), off, or both plans side by side.
HYBRID_CHOICES = ("on", "off", "compare")

_DEFAULT_ACTIVATION_RESERVE = 2 << 30

#: Prefill-checkpoint alignment per Mamba mixer (``None``: the mixer exports none). The
#: gated delta net's depends on the GPU family (see :class:`GpuFamily`).
_MIXER_CHECKPOINT_ALIGNMENT: dict[str, int | None] = {"mamba1": None, "mamba2": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPlan:
    """What :func:`plan_model` found: the model, the assumptions, the memory split and
    the plans (one, or hybrid on and off side by side)."""

    model: ModelSpec
    source: str
    gpu: GpuFamily
    backend: AttentionBackend
    block_size: int
    prefix_caching: bool
    async_scheduling: bool
    max_num_batched_tokens: int
    weights: WeightEstimate | None
    budget: MemoryBudget | None
    kv_cache_bytes: int
    plans: tuple[tuple[str, KVCachePlan], ...]

    @property
    def plan(self) -> KVCachePlan:
        """The first (with ``hybrid="compare"``: the hybrid-on) plan."""
        return self.plans[0][1]

    @property
    def assumptions(self) -> tuple[str, ...]:
        """Every setting the figures depend on, one line each."""
        plan = self.plan
        lines = [
            f"GPU family {self.gpu.name} ({self.gpu.examples}); attention backend "
            f"{self.backend.name}, block size {self.block_size} tokens",
            f"async scheduling {'on' if self.async_scheduling else 'off'}; "
            f"max_num_batched_tokens {self.max_num_batched_tokens:,} (in flight per request: "
            f"{plan.max_in_flight_tokens or 0:,})",
            f"prefix caching {'on' if self.prefix_caching else 'off'}",
        ]
        if self.model.mamba_mixer is not None:
            lines.append(
                f"Mamba mixer {self.model.mamba_mixer}: cache mode {plan.mamba_cache_mode}, "
                f"{plan.mamba_checkpoint_blocks} prefill checkpoint block(s); state dtypes "
                f"conv {self.model.state_dtypes[0]}, ssm {self.model.state_dtypes[1]}"
            )
        return tuple(lines)


def _with_block_size(model: ModelSpec, block_size: int) -> ModelSpec:
    return replace(model, layer_specs=tuple(
        (name, spec.with_block_size(block_size)) for name, spec in model.layer_specs))


def _read_model(model: str, *, tp_size: int, kv_dtype: str, weight_dtype: str,
                mamba_ssm_cache_dtype: str, with_weights: bool, block_size: int | None
                ) -> tuple[ModelSpec, str, WeightEstimate | None, bool]:
    """The model, its source, its weights (when asked) and whether it came from a
    layer-spec file (whose block sizes are its own)."""
    path = Path(model)
    file_block = block_size or 16
    if path.is_file() and is_layer_file(path):
        loaded = load_layer_file(path, block_size=file_block)
        return loaded.spec, str(path), _file_weights(loaded.num_parameters,
                                                     loaded.weight_dtype, weight_dtype,
                                                     tp_size, model, with_weights), True
    config, source, name = load_config(model)
    if is_layer_file(path, config):
        loaded = parse_layer_file(config, source=source, block_size=file_block)
        return loaded.spec, source, _file_weights(loaded.num_parameters,
                                                  loaded.weight_dtype, weight_dtype,
                                                  tp_size, model, with_weights), True
    spec = model_spec_from_config(config, name=name, source=source, tp_size=tp_size,
                                  kv_dtype=kv_dtype,
                                  mamba_ssm_cache_dtype=mamba_ssm_cache_dtype)
    weights = (estimate_weights(config, source=source, tp_size=tp_size,
                                weight_dtype=weight_dtype) if with_weights else None)
    return spec, source, weights, False


def _file_weights(num_parameters: int | None, file_dtype: str, weight_dtype: str,
                  tp_size: int, model: str, with_weights: bool) -> WeightEstimate | None:
    if not with_weights:
        return None
    if num_parameters is None:
        raise ConfigError(
            f"{model}: the layer-spec file gives no num_parameters, so weights cannot "
            "be estimated; add it to the file or give the KV-cache memory directly"
        )
    dtype = file_dtype if weight_dtype == "auto" else weight_dtype
    return WeightEstimate(num_parameters=num_parameters, weight_dtype=dtype, tp_size=tp_size)


def _kv_dtype_of(model: ModelSpec) -> str:
    """The KV dtype's short name; a layer-spec file gives bytes per element instead."""
    if model.kv_dtype in KV_DTYPE_BYTES:
        return model.kv_dtype
    sizes = {s.dtype_bytes for _, s in model.layer_specs if isinstance(s, AttentionSpec)}
    by_size = {1: "fp8", 2: "bf16", 4: "fp32"}
    return by_size.get(max(sizes), "bf16") if sizes else "bf16"


def _positive(value: int | None, name: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or value <= 0):
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")


def _check_arguments(
    no_gpu_memory: bool, no_kv_memory: bool, hybrid: str,
    positives: tuple[tuple[int | None, str], ...],
) -> None:
    """Raise InvalidArgumentError unless exactly one memory is given, ``hybrid`` is a
    choice and every ``(value, name)`` of ``positives`` is None or a positive int."""
    if no_gpu_memory == no_kv_memory:
        raise InvalidArgumentError("give exactly one of gpu_memory_bytes and kv_cache_bytes")
    if hybrid not in HYBRID_CHOICES:
        raise InvalidArgumentError(f"hybrid must be one of {', '.join(HYBRID_CHOICES)}, "
                                   f"got {hybrid!r}")
    for value, name in positives:
        _positive(value, name)


def _check_block_size(backend: AttentionBackend, block_size: int) -> None:
    """Raise ConfigError when ``backend``'s kernels cannot run ``block_size``."""
    if not backend.supports_block_size(block_size):
        raise ConfigError(f"attention backend {backend.name} cannot run block size "
                          f"{block_size}; its kernels take "
                          + (f"multiples of {backend.multiple_of}" if backend.multiple_of
                             else ", ".join(map(str, backend.exact))))


def _kernel_alignment(
    spec: ModelSpec, family: GpuFamily, base_alignment: int, mamba_mode: str, override: int | None
) -> tuple[int, int]:
    """The kernel block alignment (``override``, else ``base_alignment`` grown to the
    Mamba mixer's checkpoint alignment in align mode) and the Mamba checkpoint blocks."""
    checkpoint_alignment: int | None = None
    if spec.mamba_mixer is not None:
        checkpoint_alignment = (family.gdn_checkpoint_alignment
                                if spec.mamba_mixer == "gated_delta_net"
                                else _MIXER_CHECKPOINT_ALIGNMENT.get(spec.mamba_mixer))
    alignment = override or base_alignment
    if mamba_mode == "align" and override is None:
        alignment = math.lcm(alignment, checkpoint_alignment or 1)
    checkpoint_blocks = 1 if mamba_mode == "align" and checkpoint_alignment is not None \
        else 0
    return alignment, checkpoint_blocks


def _check_budget(spec: ModelSpec, weights: WeightEstimate, budget: MemoryBudget,
                  tp_size: int) -> None:
    """Raise ConfigError when weights and the activation reserve leave no KV memory,
    naming the tensor-parallel size that would leave some (weights split evenly)."""
    if budget.kv_cache_bytes <= 0:
        per_rank = weights.weight_bytes_per_rank
        room = budget.usable_bytes - budget.activation_reserve_bytes
        tp = next((n for n in (2, 4, 8, 16, 32, 64)
                   if n > tp_size and per_rank * tp_size / n < room), None)
        raise ConfigError(
            f"{spec.name}: the weights ({format_bytes(per_rank)} per GPU at TP {tp_size}) "
            f"and the activation reserve ({format_bytes(budget.activation_reserve_bytes)}) "
            f"exceed the usable {format_bytes(budget.usable_bytes)} of one GPU: use "
            f"--tp {tp or 'N'}, a larger GPU (--gpu), lower-precision weights "
            "(--weight-dtype), or give the KV-cache memory directly (--kv-cache-memory)"
        )


def _max_model_len(spec: ModelSpec, source: str, max_model_len: int | None) -> int:
    """``max_model_len``, or the model's limit when None; refused above the limit."""
    limit = spec.max_position_embeddings
    if max_model_len is None:
        if limit is None:
            raise ConfigError(f"{source}: no max_position_embeddings; give max_model_len")
        return limit
    if limit is not None and max_model_len > limit:
        raise ConfigError(
            f"{spec.name}: max_model_len {max_model_len:,} is above the model's limit of "
            f"{limit:,} tokens (max_position_embeddings in {source}); vLLM refuses it too. "
            f"Use at most {limit:,}"
        )
    return max_model_len


def _check_fits(plan: KVCachePlan, kv_bytes: int) -> None:
    """Raise ConfigError when ``plan`` (a ``num_blocks`` override) exceeds the memory."""
    if plan.total_bytes > kv_bytes:
        raise ConfigError(
            f"--num-blocks {plan.num_blocks:,} needs {format_bytes(plan.total_bytes)} of "
            f"KV cache but only {format_bytes(kv_bytes)} is available "
            f"({kv_bytes // (plan.total_bytes // plan.num_blocks):,} blocks); lower "
            "--num-blocks or give the KV cache more memory"
        )


def plan_model(
    model: str,
    *,
    gpu_memory_bytes: int | None = None,
    kv_cache_bytes: int | None = None,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int = _DEFAULT_ACTIVATION_RESERVE,
    tp_size: int = 1,
    kv_dtype: str = "auto",
    weight_dtype: str = "auto",
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    block_size: int | None = None,
    gpu: str = "h100",
    attention_backend: str | None = None,
    prefix_caching: bool = True,
    async_scheduling: bool = True,
    hybrid: str = "on",
    mamba_ssm_cache_dtype: str = "auto",
    num_blocks: int | None = None,
    kernel_block_alignment: int | None = None,
) -> ModelPlan:
    """Plan the KV cache of ``model`` on one GPU of ``gpu``'s family, per TP rank.

    Exactly one of ``gpu_memory_bytes`` (KV gets what ``gpu_memory_utilization`` leaves
    after estimated weights and ``activation_reserve_bytes``) and ``kv_cache_bytes``.
    ``None`` for ``max_model_len`` / ``max_num_batched_tokens`` / ``block_size`` means
    vLLM's default: the config's ``max_position_embeddings``, the GPU's serving
    default, the backend's preferred block size (grown for Mamba hybrids).

    Raises:
        InvalidArgumentError: both or neither memory given; non-positive sizes; unknown
            GPU, ``hybrid`` or dtype names.
        ConfigError: ``max_model_len`` above the model's limit; a block size the backend
            cannot run; weights exceeding the memory; a ``num_blocks`` override above what
            the memory holds; the plan's own errors.
        InsufficientMemoryError: one request of ``max_model_len`` does not fit.
        InputFileError, UnsupportedModelError: the model cannot be read.
    """
    _check_arguments(gpu_memory_bytes is None, kv_cache_bytes is None, hybrid, (
        (tp_size, "tp_size"), (max_model_len, "max_model_len"),
        (max_num_batched_tokens, "max_num_batched_tokens"), (block_size, "block_size"),
        (num_blocks, "num_blocks"), (kernel_block_alignment, "kernel_block_alignment")))
    gpu_spec = resolve_gpu(gpu)
    family = GPU_FAMILIES[gpu_spec.family]
    spec, source, weights, from_file = _read_model(
        model, tp_size=tp_size, kv_dtype=kv_dtype, weight_dtype=weight_dtype,
        mamba_ssm_cache_dtype=mamba_ssm_cache_dtype, with_weights=gpu_memory_bytes is not None,
        block_size=block_size)
    use_mla = any(isinstance(s, MLAAttentionSpec) for _, s in spec.layer_specs)
    backend = pick_backend(family, use_mla=use_mla, kv_dtype=_kv_dtype_of(spec),
                           requested=attention_backend)
    chosen_block = block_size or backend.preferred_block_size(16)
    _check_block_size(backend, chosen_block)
    if not from_file:
        spec = _with_block_size(spec, chosen_block)
    has_state = any(isinstance(s, MambaSpec) for _, s in spec.layer_specs)
    mamba_mode = "align" if prefix_caching and has_state else "none"
    alignment, checkpoint_blocks = _kernel_alignment(
        spec, family, max(backend.alignment, chosen_block), mamba_mode,
        kernel_block_alignment)
    budget: MemoryBudget | None = None
    if kv_cache_bytes is not None:
        kv_bytes = kv_cache_bytes
        if kv_bytes < 0:
            raise InvalidArgumentError(f"kv_cache_bytes must not be negative, got {kv_bytes}")
    else:
        assert weights is not None and gpu_memory_bytes is not None
        budget = kv_cache_budget(gpu_memory_bytes=gpu_memory_bytes,
                                 utilization=gpu_memory_utilization,
                                 weight_bytes=weights.weight_bytes_per_rank,
                                 activation_reserve_bytes=activation_reserve_bytes)
        kv_bytes = budget.kv_cache_bytes
        _check_budget(spec, weights, budget, tp_size)
    max_model_len = _max_model_len(spec, source, max_model_len)
    mnbt = max_num_batched_tokens or gpu_spec.serve_batched_tokens
    modes = {"on": [("hybrid on", True)], "off": [("hybrid off", False)],
             "compare": [("hybrid on", True), ("hybrid off", False)]}[hybrid]
    plans = tuple(
        (label, plan_kv_cache(
            spec.layer_to_spec, available_bytes=kv_bytes, max_model_len=max_model_len,
            max_num_batched_tokens=mnbt, hybrid=on, num_blocks=num_blocks,
            kernel_block_alignment=alignment, model_name=spec.name,
            async_scheduling=async_scheduling, mamba_cache_mode=mamba_mode,
            mamba_checkpoint_blocks=checkpoint_blocks, attention_backend=backend.name,
        ))
        for label, on in modes
    )
    for _, plan in plans:
        _check_fits(plan, kv_bytes)
    grown = plans[0][1].block_size or chosen_block
    return ModelPlan(
        model=spec, source=source, gpu=family, backend=backend, block_size=grown,
        prefix_caching=prefix_caching, async_scheduling=async_scheduling,
        max_num_batched_tokens=mnbt, weights=weights, budget=budget,
        kv_cache_bytes=kv_bytes, plans=plans,
    )
