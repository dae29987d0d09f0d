"""Estimate a model's weight memory from its ``config.json``, and what is left for KV.

The parameter count adds up the matrices of the families :mod:`.readers` reads:
embeddings (and an untied output head), attention (standard, or MLA's low-rank
projections), Mamba-1 / Mamba-2 / gated-delta-net mixers, dense MLPs and mixture-of-experts
blocks with **every** expert (all are resident), shared experts and routers. Norms, biases
and vision towers are left out (well under 1 % for the bundled models). Worked case:
Llama-3.1-8B = 128,256 x 4,096 x 2 (embeddings, head) + 32 x (41,943,040 attention +
176,160,768 MLP) = 8,030,261,248 parameters.

Weights are split evenly over tensor-parallel ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagedkv.errors import InvalidArgumentError
from pagedkv.planner._fields import ConfigFields
from pagedkv.planner.readers.base import fields_for, resolve_dtype_name

__all__ = [
    "WEIGHT_DTYPE_BYTES",
    "MemoryBudget",
    "WeightEstimate",
    "estimate_num_parameters",
    "estimate_weights",
    "kv_cache_budget",
]

#: Bytes per parameter of each ``weight_dtype`` (``auto`` = from ``quantization_config``,
#: else ``torch_dtype``).
WEIGHT_DTYPE_BYTES: Mapping[str, float] = {
    "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightEstimate:
    """Weights of one model: parameter count, storage type, and bytes per TP rank."""

    num_parameters: int
    weight_dtype: str
    tp_size: int

    @property
    def bytes_per_parameter(self) -> float:
        return WEIGHT_DTYPE_BYTES[self.weight_dtype]

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights."""
        return math.ceil(self.num_parameters * self.bytes_per_parameter)

    @property
    def weight_bytes_per_rank(self) -> int:
        """Bytes of weights on each rank."""
        return -(-self.weight_bytes // self.tp_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBudget:
    """How one GPU's memory is split: ``gpu_memory_bytes x utilization`` minus weights and
    the activation reserve leaves ``kv_cache_bytes`` (may be negative: nothing left)."""

    gpu_memory_bytes: int
    utilization: float
    weight_bytes: int
    activation_reserve_bytes: int

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_memory_bytes * self.utilization)

    @property
    def kv_cache_bytes(self) -> int:
        return self.usable_bytes - self.weight_bytes - self.activation_reserve_bytes


def kv_cache_budget(
    *, gpu_memory_bytes: int, utilization: float, weight_bytes: int,
    activation_reserve_bytes: int,
) -> MemoryBudget:
    """Check the inputs and build a :class:`MemoryBudget`.

    Raises:
        InvalidArgumentError: memory or reserve negative, utilization outside (0, 1].
    """
    if gpu_memory_bytes <= 0:
        raise InvalidArgumentError(f"GPU memory must be positive, got {gpu_memory_bytes:,} bytes")
    if not 0.0 < utilization <= 1.0:
        raise InvalidArgumentError(
            f"GPU memory utilization must be in (0, 1], got {utilization}"
        )
    if activation_reserve_bytes < 0:
        raise InvalidArgumentError(
            f"activation reserve must not be negative, got {activation_reserve_bytes:,} bytes"
        )
    return MemoryBudget(
        gpu_memory_bytes=gpu_memory_bytes, utilization=utilization, weight_bytes=weight_bytes,
        activation_reserve_bytes=activation_reserve_bytes,
    )


# -- parameter counting ----------------------------------------------------------------------


def _attention_params(f: ConfigFields, head_dim_key: str = "head_dim",
                      head_dim_default: int | None = None) -> int:
    hidden = f.get_int("hidden_size")
    heads = f.get_int("num_attention_heads")
    kv = f.get_int("num_key_value_heads", heads)
    if f.has(head_dim_key) or head_dim_key in f.defaults:
        head_dim = f.get_int(head_dim_key)
    elif head_dim_default is not None:
        head_dim = head_dim_default
    else:
        head_dim = hidden // heads
    return 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim


def _mla_params(f: ConfigFields) -> int:
    hidden = f.get_int("hidden_size")
    heads = f.get_int("num_attention_heads")
    nope = f.get_int("qk_nope_head_dim", 128)
    rope = f.get_int("qk_rope_head_dim")
    v_dim = f.get_int("v_head_dim", 128)
    kv_rank = f.get_int("kv_lora_rank")
    q_rank = f.opt_int("q_lora_rank")
    q = heads * (nope + rope)
    q_params = hidden * q if q_rank is None else hidden * q_rank + q_rank * q
    return (q_params + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim)
            + heads * v_dim * hidden)


def _gated_mlp(hidden: int, intermediate: int) -> int:
    return 3 * hidden * intermediate


def _moe(hidden: int, num_experts: int, expert_size: int, shared_size: int = 0,
         gated: bool = True) -> int:
    per_expert = (3 if gated else 2) * hidden
    return num_experts * per_expert * expert_size + per_expert * shared_size + hidden * num_experts


def _mamba1_params(f: ConfigFields) -> int:
    hidden = f.get_int("hidden_size")
    inner = f.get_int("mamba_expand", 2) * hidden
    d_state = f.get_int("mamba_d_state", 16)
    d_conv = f.get_int("mamba_d_conv", 4)
    rank_raw = f.raw("mamba_dt_rank")
    dt_rank = math.ceil(hidden / 16) if rank_raw in (None, "auto") else f.get_int("mamba_dt_rank")
    return (hidden * 2 * inner + inner * d_conv + inner * (dt_rank + 2 * d_state)
            + dt_rank * inner + inner * d_state + inner * hidden)


def _mamba2_params(f: ConfigFields) -> int:
    hidden = f.get_int("hidden_size")
    heads = f.get_int("mamba_num_heads")
    inner = heads * f.get_int("mamba_head_dim")
    groups_state = 2 * f.get_int("n_groups", f.raw("mamba_n_groups") or 8) * f.get_int(
        "ssm_state_size")
    return (hidden * (2 * inner + groups_state + heads) + (inner + groups_state)
            * f.get_int("conv_kernel", 4) + inner * hidden)


def _delta_net_params(f: ConfigFields) -> int:
    hidden = f.get_int("hidden_size")
    key_dim = f.get_int("linear_num_key_heads", 16) * f.get_int("linear_key_head_dim", 128)
    v_heads = f.get_int("linear_num_value_heads", 32)
    value_dim = v_heads * f.get_int("linear_value_head_dim", 128)
    kernel = f.get_int("linear_conv_kernel_dim", 4)
    return (hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * v_heads
            + (2 * key_dim + value_dim) * kernel + value_dim * hidden)


def _embedding_params(f: ConfigFields, tied_default: bool) -> int:
    per_table = f.get_int("vocab_size") * f.get_int("hidden_size")
    return per_table if f.get_bool("tie_word_embeddings", tied_default) else 2 * per_table


def _qwen_moe_layer(f: ConfigFields, index: int, hidden: int, shared: bool) -> int:
    experts = f.get_int("num_experts", 0, minimum=0)
    step = f.get_int("decoder_sparse_step", 1)
    only_mlp = f.raw("mlp_only_layers") or []
    if experts and (index + 1) % step == 0 and index not in only_mlp:
        shared_size = f.get_int("shared_expert_intermediate_size", 0, minimum=0) if shared else 0
        return _moe(hidden, experts, f.get_int("moe_intermediate_size"), shared_size)
    return _gated_mlp(hidden, f.get_int("intermediate_size"))


#: Model types mixing attention with state-space or linear-attention layers.
_HYBRID_TYPES = ("qwen3_next", "jamba", "nemotron_h")


def _hybrid_layers_params(f: ConfigFields, model_type: str, hidden: int, layers: int) -> int:
    """Parameters of the layers of a ``_HYBRID_TYPES`` model (embeddings apart)."""
    if model_type == "qwen3_next":
        interval = f.get_int("full_attention_interval", 4)
        layer_types = f.str_list("layer_types", length=layers) or [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)]
        attention = _attention_params(f, head_dim_default=256)
        delta_net = _delta_net_params(f)
        return sum(
            (attention if kind == "full_attention" else delta_net)
            + _qwen_moe_layer(f, i, hidden, shared=True)
            for i, kind in enumerate(layer_types))
    if model_type == "jamba":
        period = f.get_int("attn_layer_period", 8)
        offset = f.get_int("attn_layer_offset", 4, minimum=0)
        e_period = f.get_int("expert_layer_period", 2)
        e_offset = f.get_int("expert_layer_offset", 1, minimum=0)
        moe = _moe(hidden, f.get_int("num_experts", 16), f.get_int("intermediate_size"))
        dense = _gated_mlp(hidden, f.get_int("intermediate_size"))
        attention, mamba = _attention_params(f), _mamba1_params(f)
        return sum(
            (attention if i % period == offset else mamba)
            + (moe if i % e_period == e_offset else dense)
            for i in range(layers))
    if model_type == "nemotron_h":
        pattern = f.get_str("hybrid_override_pattern")
        counts = {char: pattern.count(char) for char in "M*-E"}
        total = 0
        if counts["*"]:
            total += counts["*"] * _attention_params(f, "attention_head_dim", 128)
        if counts["M"]:
            total += counts["M"] * _mamba2_params(f)
        if counts["-"]:
            total += counts["-"] * 2 * hidden * f.get_int("intermediate_size")
        if counts["E"]:
            total += counts["E"] * _moe(
                hidden, f.get_int("n_routed_experts"), f.get_int("moe_intermediate_size"),
                f.get_int("moe_shared_expert_intermediate_size", 0, minimum=0), gated=False)
        return total
    raise AssertionError(f"no parameter formula for {model_type}")  # pragma: no cover


def estimate_num_parameters(config: Mapping[str, Any], *, source: str = "config.json") -> int:
    """Parameters of the language model described by ``config`` (all experts counted).

    Raises:
        UnsupportedModelError: unknown ``model_type``.
        InputFileError: a needed field is missing or mistyped.
    """
    f, model_type = fields_for(config, source)
    hidden = f.get_int("hidden_size")
    layers = f.get_int("num_hidden_layers")
    total = _embedding_params(f, tied_default=model_type in ("gemma", "gemma2", "gemma3_text"))
    if model_type in ("llama", "mistral", "gemma", "gemma2", "gemma3_text", "qwen2", "qwen3"):
        head_default = 256 if model_type in ("gemma", "gemma2") else None
        per_layer = _attention_params(f, head_dim_default=head_default) + _gated_mlp(
            hidden, f.get_int("intermediate_size"))
        return total + layers * per_layer
    if model_type == "mixtral":
        per_layer = _attention_params(f) + _moe(
            hidden, f.get_int("num_local_experts", 8), f.get_int("intermediate_size"))
        return total + layers * per_layer
    if model_type == "gpt_oss":
        per_layer = _attention_params(f, head_dim_default=64) + _moe(
            hidden, f.get_int("num_local_experts", 128), f.get_int("intermediate_size"))
        return total + layers * per_layer
    if model_type in ("qwen2_moe", "qwen3_moe"):
        attention = _attention_params(f)
        return total + sum(
            attention + _qwen_moe_layer(f, i, hidden, shared=model_type == "qwen2_moe")
            for i in range(layers))
    if model_type in _HYBRID_TYPES:
        return total + _hybrid_layers_params(f, model_type, hidden, layers)
    if model_type == "llama4_text":
        step = f.get_int("interleave_moe_layer_step")
        moe_layers = set(f.raw("moe_layers") or range(step - 1, layers, step))
        expert_size = f.get_int("intermediate_size")
        moe = _moe(hidden, f.get_int("num_local_experts"), expert_size, expert_size)
        dense = _gated_mlp(hidden, f.get_int("intermediate_size_mlp"))
        attention = _attention_params(f)
        return total + sum(attention + (moe if i in moe_layers else dense)
                           for i in range(layers))
    if model_type in ("deepseek_v2", "deepseek_v3"):
        first_dense = f.get_int("first_k_dense_replace", 0, minimum=0)
        freq = f.get_int("moe_layer_freq", 1)
        routed = f.opt_int("n_routed_experts") or 0
        expert_size = f.get_int("moe_intermediate_size") if routed else 0
        shared = (f.opt_int("n_shared_experts") or 0) * expert_size
        moe = _moe(hidden, routed, expert_size, shared)
        dense = _gated_mlp(hidden, f.get_int("intermediate_size"))
        attention = _mla_params(f)
        return total + sum(
            attention + (moe if routed and i >= first_dense and i % freq == 0 else dense)
            for i in range(layers))
    raise AssertionError(f"no parameter formula for {model_type}")  # pragma: no cover


def _auto_weight_dtype(config: Mapping[str, Any], f: ConfigFields) -> str:
    quant = config.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        bits = quant.get("bits") or quant.get("weight_bits")
        if method == "fp8":
            return "fp8"
        if method in ("mxfp4", "nvfp4", "fp4"):
            return "fp4"
        if bits in (4, 8):
            return "int4" if bits == 4 else "int8"
        if quant.get("load_in_4bit"):
            return "int4"
        if quant.get("load_in_8bit"):
            return "int8"
    return resolve_dtype_name(f)


def estimate_weights(
    config: Mapping[str, Any], *, source: str = "config.json", tp_size: int = 1,
    weight_dtype: str = "auto",
) -> WeightEstimate:
    """Parameter count and weight bytes per rank of ``config``.

    ``weight_dtype`` is ``auto`` (``quantization_config`` -- fp8, fp4, 4/8-bit -- else
    ``torch_dtype``) or a key of :data:`WEIGHT_DTYPE_BYTES`.

    Raises:
        InvalidArgumentError: unknown ``weight_dtype``; ``tp_size`` not positive.
        UnsupportedModelError, InputFileError: as :func:`estimate_num_parameters`.
    """
    if weight_dtype != "auto" and weight_dtype not in WEIGHT_DTYPE_BYTES:
        raise InvalidArgumentError(
            f"weight_dtype must be auto or one of {', '.join(WEIGHT_DTYPE_BYTES)}, "
            f"got {weight_dtype!r}"
        )
    if tp_size <= 0:
        raise InvalidArgumentError(f"tp_size must be positive, got {tp_size}")
    num_parameters = estimate_num_parameters(config, source=source)
    if weight_dtype == "auto":
        weight_dtype = _auto_weight_dtype(config, fields_for(config, source)[0])
    return WeightEstimate(num_parameters=num_parameters, weight_dtype=weight_dtype,
                          tp_size=tp_size)
