"""Nemotron-H: Mamba-2, attention, MLP and MoE layers in the order a pattern gives."""

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

#: ``layers_block_type`` entries (both spellings transformers accepts) -> pattern chars.
_BLOCK_TYPE_CHAR = {"mamba": "M", "linear_attention": "M", "attention": "*",
                    "full_attention": "*", "mlp": "-", "moe": "E"}

#: vLLM keeps Nemotron-H's SSM state in float32 unless the config says otherwise.
DEFAULT_SSM_STATE_DTYPE = "float32"


def _pattern(ctx: ReaderContext, num_layers: int | None) -> str:
    """One character per layer from ``hybrid_override_pattern`` or ``layers_block_type``
    (both: they must agree)."""
    f = ctx.f
    pattern = f.get_str("hybrid_override_pattern") if f.has("hybrid_override_pattern") \
        else None
    block_types = f.str_list("layers_block_type")
    if block_types is not None:
        unknown = sorted(set(block_types) - set(_BLOCK_TYPE_CHAR))
        if unknown:
            raise f.error("layers_block_type", f"unknown layer types {unknown}; expected "
                          f"{', '.join(sorted(_BLOCK_TYPE_CHAR))}")
        from_list = "".join(_BLOCK_TYPE_CHAR[t] for t in block_types)
        if pattern is not None and pattern != from_list:
            raise f.error("hybrid_override_pattern", "disagrees with layers_block_type; "
                          "remove one of them")
        pattern = from_list
    if pattern is None:
        raise f.error("hybrid_override_pattern",
                      "absent (and no layers_block_type): the layer kinds are unknown")
    if num_layers is not None and len(pattern) != num_layers:
        raise f.error(
            "hybrid_override_pattern",
            f"has {len(pattern)} characters but num_hidden_layers is {num_layers}",
        )
    unknown_chars = sorted(set(pattern) - set("M*-E"))
    if unknown_chars:
        raise f.error("hybrid_override_pattern",
                      f"unknown layer characters {''.join(unknown_chars)!r}; expected M, *, "
                      "- or E")
    return pattern


def _alias(ctx: ReaderContext, key: str, alias: str, default: int | None) -> int:
    """``key`` or its older spelling ``alias`` (both present: they must agree)."""
    f = ctx.f
    if f.has(key) and f.has(alias) and f.get_int(key) != f.get_int(alias):
        raise f.error(key, f"{f.get_int(key)} disagrees with {alias} = {f.get_int(alias)}")
    if f.has(key) or not f.has(alias):
        return f.get_int(key, default) if default is not None else f.get_int(key)
    return f.get_int(alias)


@register_reader("nemotron_h")
def read_nemotron_h(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """Nemotron-H: ``hybrid_override_pattern`` has one character per layer (``M`` Mamba-2,
    ``*`` attention, ``-`` MLP, ``E`` mixture of experts; the last two hold no cache), or
    ``layers_block_type`` lists them by name. Mamba-2 state per rank: conv
    ``(heads x head_dim + 2 x groups x ssm_state_size)/tp x (conv_kernel - 1)`` in the model
    dtype plus SSM ``heads/tp x head_dim x ssm_state_size`` in ``mamba_ssm_cache_dtype``
    (default float32, as vLLM keeps it). Groups that TP cannot split are replicated up to
    ``tp``. Attention head size: ``head_dim`` (or ``attention_head_dim``), else
    ``hidden_size / num_attention_heads``."""
    f = ctx.f
    num_layers = f.opt_int("num_hidden_layers")
    pattern = _pattern(ctx, num_layers)
    att = None
    if "*" in pattern:
        key = "attention_head_dim" if f.has("attention_head_dim") and not f.has("head_dim") \
            else "head_dim"
        if f.has("attention_head_dim") and f.has("head_dim") and \
                f.get_int("attention_head_dim") != f.get_int("head_dim"):
            raise f.error("head_dim", "disagrees with attention_head_dim; remove one")
        att = read_attention(ctx, head_dim_key=key)
    mamba = None
    if "M" in pattern:
        num_heads = f.get_int("mamba_num_heads")
        head_dim = f.get_int("mamba_head_dim")
        n_groups = _alias(ctx, "n_groups", "mamba_n_groups", None)
        d_state = f.get_int("ssm_state_size")
        kernel = _alias(ctx, "conv_kernel", "mamba_d_conv", 4)
        split_dim(ctx, "mamba_num_heads", num_heads)
        if n_groups % ctx.tp_size:
            n_groups = ctx.tp_size
        conv_dim = split_dim(ctx, "the Mamba-2 conv dimension",
                             num_heads * head_dim + 2 * n_groups * d_state)
        ctx.mamba_mixer = "mamba2"
        family_default = f.raw("mamba_ssm_cache_dtype")
        if family_default is not None and family_default not in ("float32", "bfloat16",
                                                                  "float16"):
            raise f.error("mamba_ssm_cache_dtype", f"unknown dtype {family_default!r}")
        ssm_bytes = ctx.ssm_dtype_bytes(family_default or DEFAULT_SSM_STATE_DTYPE)
        mamba = state_spec(ctx, conv_dim * (kernel - 1) * ctx.state_dtype_bytes
                           + num_heads // ctx.tp_size * head_dim * d_state * ssm_bytes)
    specs: list[KVCacheSpec | None] = []
    for char in pattern:
        if char == "*" and att is not None:
            specs.append(full_spec(ctx, att))
        elif char == "M":
            specs.append(mamba)
        else:
            specs.append(None)
    return specs
