"""From a Hugging Face ``config.json`` to the per-layer KV-cache specs of one worker.

One reader module per model family, registered by ``model_type`` with
:func:`~pagedkv.planner.readers.base.register_reader` (as managers are registered by spec
class). Each reader decides, layer by layer, how the layer stores its cache (full
attention, sliding window, chunked local, MLA, Mamba-1 / Mamba-2 / gated-delta-net state,
or nothing) from the family's documented config fields, the way the family's reference
implementation does, including the defaults it applies when a field is absent (recorded in
:attr:`ModelSpec.notes`). A field the layout depends on that is missing without a
documented default, or contradicts another, is an error naming it.

To add a family: write ``readers/<family>.py`` with a function decorated
``@register_reader("<model_type>")`` and import it below.

>>> model = load_model_spec("Llama-3.1-70B", tp_size=4)
>>> model.bytes_per_token
81920
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedkv.errors import InvalidArgumentError
from pagedkv.planner.bundled import load_config
from pagedkv.planner.model_spec import KV_DTYPE_BYTES, STATE_DTYPE_NAMES, ModelSpec
from pagedkv.planner.readers import (  # noqa: F401  (imported to register the readers)
    deepseek,
    gemma,
    gpt_oss,
    jamba,
    llama,
    llama4,
    nemotron_h,
    qwen3_next,
)
from pagedkv.planner.readers.base import (
    ReaderContext,
    reader_for,
    resolve_dtype_name,
    supported_model_types,
)

__all__ = ["load_model_spec", "model_spec_from_config", "supported_model_types"]


def model_spec_from_config(
    config: Mapping[str, Any],
    *,
    name: str = "model",
    source: str = "config.json",
    tp_size: int = 1,
    kv_dtype: str = "auto",
    block_size: int = 16,
    mamba_ssm_cache_dtype: str = "auto",
) -> ModelSpec:
    """The per-layer KV specs of ``config`` on one of ``tp_size`` ranks.

    ``kv_dtype`` is ``auto`` (the model's ``torch_dtype``) or a key of
    :data:`KV_DTYPE_BYTES`; it applies to attention KV only (Mamba conv state keeps the
    model dtype). ``mamba_ssm_cache_dtype`` is the SSM / recurrent state dtype (``auto``:
    the family's default, e.g. float32 for Nemotron-H, else the model dtype).
    ``block_size`` is the tokens per block of every layer; the planner may grow it for
    Mamba hybrids. Layers are named ``layers.<i>`` after their index in the model.

    Raises:
        UnsupportedModelError: ``model_type`` absent or unknown (names it and the generic
            fields the config lacks).
        InputFileError: a field the family needs is missing, mistyped or contradicts
            another (names file and key).
        ConfigError: ``tp_size`` does not divide the heads or state dimension.
        InvalidArgumentError: ``tp_size``/``block_size`` not positive, unknown dtypes.
    """
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size <= 0:
        raise InvalidArgumentError(f"tp_size must be a positive int, got {tp_size!r}")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise InvalidArgumentError(f"block_size must be a positive int, got {block_size!r}")
    if kv_dtype != "auto" and kv_dtype not in KV_DTYPE_BYTES:
        raise InvalidArgumentError(
            f"kv_dtype must be auto or one of {', '.join(KV_DTYPE_BYTES)}, got {kv_dtype!r}"
        )
    if mamba_ssm_cache_dtype not in STATE_DTYPE_NAMES:
        raise InvalidArgumentError(
            f"mamba_ssm_cache_dtype must be one of {', '.join(STATE_DTYPE_NAMES)}, got "
            f"{mamba_ssm_cache_dtype!r}"
        )
    fields, reader = reader_for(config, source)
    model_dtype = resolve_dtype_name(fields)
    kv_name = model_dtype if kv_dtype == "auto" else kv_dtype
    ctx = ReaderContext(
        f=fields, tp_size=tp_size, kv_dtype_bytes=KV_DTYPE_BYTES[kv_name],
        state_dtype_bytes=KV_DTYPE_BYTES[model_dtype], model_dtype=model_dtype,
        ssm_state_dtype=mamba_ssm_cache_dtype, block_size=block_size,
    )
    per_layer = reader(ctx)
    layer_specs = tuple(
        (f"layers.{index}", spec) for index, spec in enumerate(per_layer) if spec is not None
    )
    return ModelSpec(
        name=name,
        model_type=str(config["model_type"]),
        tp_size=tp_size,
        kv_dtype=kv_name,
        layer_specs=layer_specs,
        num_hidden_layers=len(per_layer),
        max_position_embeddings=fields.opt_int("max_position_embeddings"),
        notes=tuple(dict.fromkeys(fields.notes)),
        mamba_mixer=ctx.mamba_mixer,
        state_dtypes=ctx.state_dtypes,
    )


def load_model_spec(
    model: str, *, tp_size: int = 1, kv_dtype: str = "auto", block_size: int = 16,
    mamba_ssm_cache_dtype: str = "auto",
) -> ModelSpec:
    """:func:`~pagedkv.planner.bundled.load_config` then :func:`model_spec_from_config`."""
    config, source, name = load_config(model)
    return model_spec_from_config(
        config, name=name, source=source, tp_size=tp_size, kv_dtype=kv_dtype,
        block_size=block_size, mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
    )
