"""Llama 4: chunked local attention with every few layers global (NoPE) full attention."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedkv.core.specs import ChunkedLocalAttentionSpec, KVCacheSpec
from pagedkv.planner.readers.base import (
    ReaderContext,
    full_spec,
    read_attention,
    register_reader,
    register_wrapper,
)

_LLAMA4_TEXT_DEFAULTS: Mapping[str, Any] = {
    # transformers Llama4TextConfig defaults (see _GEMMA3_TEXT_DEFAULTS for why).
    "vocab_size": 202_048,
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16_384,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131_072,
    "num_local_experts": 16,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 1,
    "attention_chunk_size": 8192,
    "no_rope_layer_interval": 4,
    "tie_word_embeddings": False,
}


@register_reader("llama4_text")
def _read_llama4(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """Llama 4: ``no_rope_layers[i] == 0`` marks a NoPE layer with global (full) attention;
    the other layers use chunked local attention (``attention_chunk_size``, default 8192).
    Absent ``no_rope_layers``: every ``no_rope_layer_interval``-th layer (default 4) is NoPE.
    Llama-4-Scout: 48 layers -> 12 full + 36 chunked."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = read_attention(ctx)
    chunk = f.opt_int("attention_chunk_size")
    no_rope = f.int_list("no_rope_layers", length=num_layers)
    if no_rope is None:
        interval = f.get_int("no_rope_layer_interval")
        no_rope = [int((index + 1) % interval != 0) for index in range(num_layers)]
    specs: list[KVCacheSpec | None] = []
    for uses_rope in no_rope:
        if uses_rope and chunk is not None:
            specs.append(ChunkedLocalAttentionSpec(
                block_size=ctx.block_size, num_kv_heads=att.num_kv_heads,
                head_size=att.head_size, dtype_bytes=ctx.kv_dtype_bytes,
                attention_chunk_size=chunk,
            ))
        else:
            specs.append(full_spec(ctx, att))
    return specs



register_wrapper("llama4", "llama4_text", _LLAMA4_TEXT_DEFAULTS)
