"""Jamba: Mamba-1 layers with an attention layer every ``attn_layer_period`` layers."""

from __future__ import annotations

from pagedkv.core.specs import KVCacheSpec
from pagedkv.planner.readers.base import (
    ReaderContext,
    full_spec,
    read_attention,
    register_reader,
    split_dim,
    state_spec,
)


@register_reader("jamba")
def read_jamba(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """Jamba (Mamba-1 + attention): layer i is attention iff ``i % attn_layer_period ==
    attn_layer_offset`` (defaults 8, 4), else Mamba-1. Mamba-1 state per rank: a conv state
    of ``inner/tp x (d_conv - 1)`` plus an SSM state of ``inner/tp x d_state`` elements,
    ``inner = mamba_expand x hidden_size``; both kept in the model dtype unless
    ``--mamba-ssm-cache-dtype`` says otherwise. Jamba-1.5-Mini: 4 attention + 28 Mamba;
    8192 x (3 + 16) x 2 = 311,296 state bytes per layer."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    period = f.get_int("attn_layer_period", 8)
    offset = f.get_int("attn_layer_offset", 4, minimum=0)
    if offset >= period:
        raise f.error("attn_layer_offset", f"{offset} is not below attn_layer_period {period}")
    att = read_attention(ctx)
    inner = f.get_int("mamba_expand", 2) * f.get_int("hidden_size")
    inner_per_rank = split_dim(ctx, "mamba_expand x hidden_size", inner)
    conv = f.get_int("mamba_d_conv", 4, minimum=2)
    state = f.get_int("mamba_d_state", 16)
    ctx.mamba_mixer = "mamba1"
    ssm_bytes = ctx.ssm_dtype_bytes(None)
    mamba = state_spec(ctx, inner_per_rank * (conv - 1) * ctx.state_dtype_bytes
                       + inner_per_rank * state * ssm_bytes)
    return [
        full_spec(ctx, att) if index % period == offset else mamba
        for index in range(num_layers)
    ]
