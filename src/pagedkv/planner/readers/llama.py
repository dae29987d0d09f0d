"""Llama 2/3, Mistral, Mixtral, Gemma 1 and Qwen 2/2.5/3: dense decoders, all layers full
attention or sliding by documented config fields."""

from __future__ import annotations

from pagedkv.core.specs import KVCacheSpec
from pagedkv.planner.readers.base import (
    ReaderContext,
    full_spec,
    read_attention,
    register_reader,
    sliding_spec,
    specs_from_layer_types,
)


@register_reader("llama", "mixtral", "mistral", "gemma")
def _read_llama_like(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """Llama 2/3, Mistral, Mixtral and similar: every layer full attention, or every layer
    sliding when ``sliding_window`` is set (Mistral 7B v0.1: 4096). Gemma 1 fixes the head
    size at 256 unless ``head_dim`` says otherwise."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = read_attention(ctx, head_dim_default=256 if f.model_type == "gemma" else None)
    window = f.opt_int("sliding_window")
    if window is not None:
        return [sliding_spec(ctx, att, window) for _ in range(num_layers)]
    return [full_spec(ctx, att) for _ in range(num_layers)]


@register_reader("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
def _read_qwen(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """Qwen 2 / 2.5 / 3: ``layer_types`` when present; else the window applies only when
    ``use_sliding_window`` is true (default false), and then to layers with index >=
    ``max_window_layers`` (default 28). Qwen2.5-7B ships ``use_sliding_window: false`` with
    ``sliding_window: 131072``: all full attention."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = read_attention(ctx)
    use_window = f.get_bool("use_sliding_window", False)
    window = f.opt_int("sliding_window") if use_window else None
    layer_types = f.str_list("layer_types", length=num_layers)
    if layer_types is not None:
        return specs_from_layer_types(ctx, layer_types, att, f.opt_int("sliding_window"),
                                 "layer_types")
    if use_window and window is None:
        raise f.error("sliding_window", "null, but use_sliding_window is true")
    if window is None:
        return [full_spec(ctx, att) for _ in range(num_layers)]
    first_windowed = f.get_int("max_window_layers", 28, minimum=0)
    return [
        sliding_spec(ctx, att, window) if index >= first_windowed else full_spec(ctx, att)
        for index in range(num_layers)
    ]
