"""What the clock needs to know about a model, read through the planner's ``config.json``
readers: weights per rank (dense part and experts), FLOPs per token, the attention layers
of every KV-cache kind with the bytes one token costs in them, and Mamba state sizes.

Mixture of experts: the parameter count of the same config with ``top-k`` experts instead
of ``E`` gives the active parameters; the difference over ``E - k`` is one expert (all
its layers). A step of ``T`` tokens touches on average ``E (1 - (1 - k/E)^T)`` experts
(tokens routed independently), and those are the expert weights it reads.

Worked case, Llama-3.1-8B on one GPU: 8,029,995,008 parameters (the planner's count), of
which 525,336,576 are
the input embedding table (gathered, not streamed); a decode step streams the
other 7.5 G parameters = 15.0 GB in BF16; a token costs 2 x 7.5 G = 15.0 GFLOP of matrices and
32 layers x 2 x 8 KV heads x 128 x 2 bytes = 131,072 bytes of KV::

    >>> s = model_shape("Llama-3.1-8B")
    >>> s.streamed_params, s.kv_bytes_per_token, s.weight_bytes_per_param
    (7504658432, 131072, 2.0)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagedkv import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    planner,
)
from pagedkv.errors import ConfigError, InvalidArgumentError, PagedKVError
from pagedkv.planner.readers.base import fields_for

__all__ = ["AttentionKind", "ModelShape", "model_shape", "shape_from_config"]

#: model_type -> (expert-count key, top-k key)
_EXPERT_KEYS: Mapping[str, tuple[str, str]] = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "gpt_oss": ("num_local_experts", "num_experts_per_tok"),
    "llama4_text": ("num_local_experts", "num_experts_per_tok"),
    "qwen2_moe": ("num_experts", "num_experts_per_tok"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok"),
    "qwen3_next": ("num_experts", "num_experts_per_tok"),
    "jamba": ("num_experts", "num_experts_per_tok"),
    "deepseek_v2": ("n_routed_experts", "num_experts_per_tok"),
    "deepseek_v3": ("n_routed_experts", "num_experts_per_tok"),
    "nemotron_h": ("n_routed_experts", "num_experts_per_tok"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionKind:
    """Layers of one attention pattern on one rank.

    ``kind``: "full", "window" (sliding window), "chunk" (chunked local), "cross",
    "state" (Mamba / linear attention). ``span``: the window, chunk or encoder length in
    tokens (None for full and state). ``kv_bytes_per_token``: bytes one token's KV costs
    in all these layers together; ``state_bytes``: one request's state in all of them.
    ``flops_per_pair``: FLOPs of one (query, key) pair in all of them (QK^T and PV)."""

    kind: str
    num_layers: int
    span: int | None
    kv_bytes_per_token: int
    state_bytes: int
    flops_per_pair: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """One model on one tensor-parallel rank, as the clock costs it (module docstring).

    ``streamed_params``: parameters a step reads with every expert of the model counted
    (the input embedding table excluded); ``expert_params``: one routed expert across
    all its layers (0 for a dense model); ``num_experts`` / ``top_k`` the routing;
    ``head_params``: the output head (applied once per sequence per step). All per rank
    (``tp``). ``hidden_size`` sizes the all-reduces; ``num_layers`` the per-layer costs."""

    name: str
    tp: int
    num_layers: int
    hidden_size: int
    num_parameters: int
    streamed_params: int
    expert_params: int
    num_experts: int
    top_k: int
    head_params: int
    weight_bytes_per_param: float
    weight_dtype: str
    kv_dtype_bytes: int
    attention: tuple[AttentionKind, ...]

    @property
    def dense_params(self) -> int:
        """Parameters read whatever the routing (all but the routed experts)."""
        return self.streamed_params - self.num_experts * self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters one token multiplies by (shared + top-k experts)."""
        return self.dense_params + self.top_k * self.expert_params

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(a.kv_bytes_per_token for a in self.attention)

    def touched_experts(self, num_tokens: int) -> float:
        """Experts a step of ``num_tokens`` tokens reads on average (module docstring)."""
        e, k = self.num_experts, self.top_k
        if not e or num_tokens <= 0:
            return 0.0
        return e * (1.0 - (1.0 - k / e) ** num_tokens)


def model_shape(model: str, *, tp: int = 1, kv_dtype: str = "auto") -> ModelShape:
    """The shape of ``model`` (a bundled name or a ``config.json`` path) on one of ``tp``
    ranks.

    Raises:
        ConfigError: the model's size cannot be derived (names the model and the fix).
        InputFileError, UnsupportedModelError: from the planner's readers.
    """
    config, source, name = planner.load_config(model)
    return shape_from_config(config, name=name, source=source, tp=tp, kv_dtype=kv_dtype)


def shape_from_config(config: Mapping[str, Any], *, name: str, source: str, tp: int = 1,
                      kv_dtype: str = "auto") -> ModelShape:
    """:func:`model_shape` of a loaded config."""
    if tp < 1:
        raise InvalidArgumentError(f"--tp must be >= 1, got {tp}")
    try:
        f, model_type = fields_for(config, source)
        weights = planner.estimate_weights(config, source=source, tp_size=1)
        total = weights.num_parameters
        hidden = f.get_int("hidden_size")
        layers = f.get_int("num_hidden_layers")
        vocab = f.get_int("vocab_size")
        heads = f.get_int("num_attention_heads")
        spec = planner.model_spec_from_config(config, name=name, source=source, tp_size=tp,
                                              kv_dtype=kv_dtype)
    except PagedKVError:
        raise
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ConfigError(f"{name}: the model's size cannot be derived from {source} "
                          f"({exc}); give a config.json with its layer sizes") from None
    num_experts, top_k, expert = _experts(config, f, model_type, total, source)
    embed = vocab * hidden
    streamed = total - (0 if _tied(f, model_type) else embed)
    if streamed <= 0:
        raise ConfigError(f"{name}: the model's size cannot be derived from {source}; give "
                          "a config.json with hidden_size, num_hidden_layers, vocab_size")
    return ModelShape(
        name=name, tp=tp, num_layers=layers, hidden_size=hidden, num_parameters=total,
        streamed_params=-(-streamed // tp), expert_params=-(-expert // tp),
        num_experts=num_experts, top_k=top_k, head_params=-(-embed // tp),
        weight_bytes_per_param=weights.bytes_per_parameter, weight_dtype=weights.weight_dtype,
        kv_dtype_bytes=planner.KV_DTYPE_BYTES.get(spec.kv_dtype, 2),
        attention=_attention_kinds(spec.layer_specs, heads=-(-heads // tp)),
    )


def _tied(f: Any, model_type: str) -> bool:
    default = model_type in ("gemma", "gemma2", "gemma3_text")
    return bool(f.get_bool("tie_word_embeddings", default))


def _experts(config: Mapping[str, Any], f: Any, model_type: str, total: int,
             source: str) -> tuple[int, int, int]:
    """(experts, top-k, parameters of one expert over all layers); (0, 0, 0) if dense."""
    keys = _EXPERT_KEYS.get(model_type)
    if keys is None:
        return 0, 0, 0
    e_key, k_key = keys
    num_experts = f.opt_int(e_key) or 0
    top_k = f.opt_int(k_key) or 0
    if num_experts <= 0 or top_k <= 0 or top_k >= num_experts:
        return 0, 0, 0
    reduced = copy.deepcopy(dict(config))
    target = reduced["text_config"] if e_key not in reduced and isinstance(
        reduced.get("text_config"), dict) else reduced
    target[e_key] = top_k
    with_k = planner.estimate_num_parameters(reduced, source=source)
    expert = max(0, (total - with_k) // (num_experts - top_k))
    return num_experts, top_k, expert


def _attention_kinds(layer_specs: tuple[tuple[str, KVCacheSpec], ...], *, heads: int
                     ) -> tuple[AttentionKind, ...]:
    groups: dict[tuple[str, int | None], list[KVCacheSpec]] = {}
    for _, spec in layer_specs:
        kind, span = _kind_of(spec)
        groups.setdefault((kind, span), []).append(spec)
    out = []
    for (kind, span), specs in groups.items():
        flops = 0.0
        for s in specs:
            head_size = getattr(s, "head_size", 0)
            flops += 4.0 * heads * head_size
        out.append(AttentionKind(
            kind=kind, num_layers=len(specs), span=span,
            kv_bytes_per_token=sum(s.bytes_per_token for s in specs),
            state_bytes=sum(s.state_bytes for s in specs if isinstance(s, MambaSpec)),
            flops_per_pair=flops))
    return tuple(out)


def _kind_of(spec: KVCacheSpec) -> tuple[str, int | None]:
    if isinstance(spec, MambaSpec):
        return "state", None
    if isinstance(spec, SlidingWindowSpec):
        return "window", spec.sliding_window
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return "chunk", spec.attention_chunk_size
    if isinstance(spec, CrossAttentionSpec):
        return "cross", spec.max_encoder_len
    if isinstance(spec, FullAttentionSpec) and not isinstance(spec, MLAAttentionSpec):
        # a windowed layer costed as full (hybrid allocator off) still reads its window
        if spec.sliding_window:
            return "window", spec.sliding_window
        if spec.attention_chunk_size:
            return "chunk", spec.attention_chunk_size
    return "full", None
