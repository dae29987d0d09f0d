"""Qwen3-Next: gated delta-net (linear attention) layers with full attention every few."""

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


@register_reader("qwen3_next")
def read_qwen3_next(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """Qwen3-Next: ``layer_types`` of ``full_attention`` / ``linear_attention``, default
    every ``full_attention_interval``-th layer (default 4) full. Linear layers are gated
    delta nets with a state per rank of conv ``(2 x k_heads x k_dim + v_heads x v_dim)/tp x
    (kernel - 1)`` plus ``v_heads/tp x k_dim x v_dim`` elements (``linear_*`` fields,
    transformers' defaults 16 / 32 / 128 / 128 / 4), both in the model dtype unless
    ``--mamba-ssm-cache-dtype`` says otherwise. Qwen3-Next-80B-A3B, TP 2: 4,096 x 3 +
    16 x 128 x 128 = 274,432 elements = 548,864 bytes."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    layer_types = f.str_list("layer_types", length=num_layers)
    if layer_types is None:
        interval = f.get_int("full_attention_interval", 4)
        layer_types = [
            "full_attention" if (index + 1) % interval == 0 else "linear_attention"
            for index in range(num_layers)
        ]
    att = read_attention(ctx, head_dim_default=256)
    k_heads = f.get_int("linear_num_key_heads", 16)
    v_heads = f.get_int("linear_num_value_heads", 32)
    k_dim = f.get_int("linear_key_head_dim", 128)
    v_dim = f.get_int("linear_value_head_dim", 128)
    kernel = f.get_int("linear_conv_kernel_dim", 4, minimum=2)
    if v_heads % k_heads:
        raise f.error("linear_num_value_heads",
                      f"{v_heads} is not a multiple of linear_num_key_heads = {k_heads}")
    split_dim(ctx, "linear_num_key_heads", k_heads)
    conv_dim = split_dim(ctx, "the delta-net conv dimension",
                         2 * k_heads * k_dim + v_heads * v_dim)
    ctx.mamba_mixer = "gated_delta_net"
    ssm_bytes = ctx.ssm_dtype_bytes(None)
    state = state_spec(ctx, conv_dim * (kernel - 1) * ctx.state_dtype_bytes
                       + split_dim(ctx, "linear_num_value_heads", v_heads) * k_dim * v_dim
                       * ssm_bytes)
    specs: list[KVCacheSpec | None] = []
    for index, layer_type in enumerate(layer_types):
        if layer_type == "full_attention":
            specs.append(full_spec(ctx, att))
        elif layer_type == "linear_attention":
            specs.append(state)
        else:
            raise f.error("layer_types", f"entry {index} is {layer_type!r}; expected "
                          "'full_attention' or 'linear_attention'")
    return specs
