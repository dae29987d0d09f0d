"""DeepSeek V2 / V3: multi-head latent attention on every layer."""

from __future__ import annotations

from pagedkv.core.specs import KVCacheSpec, MLAAttentionSpec
from pagedkv.planner.readers.base import (
    ReaderContext,
    register_reader,
    split_heads,
)


@register_reader("deepseek_v2", "deepseek_v3")
def _read_deepseek(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """DeepSeek V2 / V3: multi-head latent attention on every layer, one latent of
    ``kv_lora_rank + qk_rope_head_dim`` elements per token, not split by TP.
    DeepSeek-V3: 61 x (512 + 64) x 2 bytes = 70,272 bytes per token."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    split_heads(ctx, "num_attention_heads", f.get_int("num_attention_heads"))
    latent = f.get_int("kv_lora_rank") + f.get_int("qk_rope_head_dim")
    spec = MLAAttentionSpec(
        block_size=ctx.block_size, num_kv_heads=1, head_size=latent,
        dtype_bytes=ctx.kv_dtype_bytes,
    )
    return [spec] * num_layers
