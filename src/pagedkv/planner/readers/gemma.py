"""Gemma 2 and Gemma 3: alternating sliding-window and full-attention layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedkv.core.specs import KVCacheSpec
from pagedkv.planner.readers.base import (
    ReaderContext,
    read_attention,
    register_reader,
    register_wrapper,
    specs_from_layer_types,
)


def alternating_layers(
    ctx: ReaderContext, *, head_dim_default: int | None, window_default: int
) -> list[KVCacheSpec | None]:
    """``layer_types`` when present, else even layers sliding and odd layers full."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = read_attention(ctx, head_dim_default=head_dim_default)
    window = f.get_int("sliding_window", window_default)
    layer_types = f.str_list("layer_types", length=num_layers) or [
        "sliding_attention" if index % 2 == 0 else "full_attention"
        for index in range(num_layers)
    ]
    return specs_from_layer_types(ctx, layer_types, att, window, "layer_types")


@register_reader("gemma2")
def _read_gemma2(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """Gemma 2: ``layer_types`` when present, else even layers sliding (window default
    4096) and odd layers full; head size 256 unless ``head_dim`` says otherwise."""
    return alternating_layers(ctx, head_dim_default=256, window_default=4096)


_GEMMA3_TEXT_DEFAULTS: Mapping[str, Any] = {
    # transformers Gemma3TextConfig defaults; a multimodal Gemma 3 config.json omits the
    # text_config fields that equal them.
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "tie_word_embeddings": True,
}


@register_reader("gemma3_text")
def _read_gemma3(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """Gemma 3: ``layer_types`` when present, else layer i is full attention iff
    ``(i + 1) % sliding_window_pattern == 0`` (pattern default 6) and sliding otherwise.
    Gemma-3-27B: 62 layers -> 10 full + 52 sliding (window 1024)."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = read_attention(ctx)
    window = f.get_int("sliding_window")
    layer_types = f.str_list("layer_types", length=num_layers)
    if layer_types is None:
        pattern = f.get_int("sliding_window_pattern")
        layer_types = [
            "full_attention" if (index + 1) % pattern == 0 else "sliding_attention"
            for index in range(num_layers)
        ]
    return specs_from_layer_types(ctx, layer_types, att, window, "layer_types")



register_wrapper("gemma3", "gemma3_text", _GEMMA3_TEXT_DEFAULTS)
