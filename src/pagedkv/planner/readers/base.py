"""What every family reader shares: the reader context, the registry, and the pieces that
turn heads, windows and state sizes into per-rank specs.

A reader is registered for one or more ``model_type`` values with :func:`register_reader`
(as the managers are registered by spec class) and returns one spec per layer (``None``
for a layer without a cache). Tensor parallelism is applied here, so the specs are those
of **one rank**:

* KV heads are split across ranks, never below one per rank: 8 KV heads on TP 4 -> 2 per
  rank; 8 KV heads on TP 16 -> 1 per rank (each head replicated on 2 ranks).
* MLA keeps its one latent vector per token on every rank (it is not split).
* Mamba / linear-attention state is split along its channel / head dimension, which must
  divide evenly.

Worked case (Llama-3.1-70B, bf16, TP 1): 80 layers x 2 x 8 KV heads x 128 x 2 bytes =
327,680 bytes per token; at TP 4 each rank holds 2 KV heads: 81,920 bytes per token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pagedkv.core.specs import FullAttentionSpec, KVCacheSpec, MambaSpec, SlidingWindowSpec
from pagedkv.errors import ConfigError, UnsupportedModelError
from pagedkv.planner._fields import ConfigFields
from pagedkv.planner.model_spec import TORCH_DTYPE_TO_NAME

__all__ = [
    "AttentionShape",
    "ReaderContext",
    "fields_for",
    "full_spec",
    "read_attention",
    "reader_for",
    "register_reader",
    "register_wrapper",
    "resolve_dtype_name",
    "sliding_spec",
    "specs_from_layer_types",
    "split_dim",
    "split_heads",
    "state_spec",
    "supported_model_types",
]

#: Fields every decoder-only transformer config carries; named in the error for a
#: ``model_type`` no reader knows, so the user can see what a layer-spec file would need.
GENERIC_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "hidden_size")


@dataclass(slots=True, kw_only=True)
class ReaderContext:
    """What a family reader needs: the fields, TP size, dtypes and the block size.

    ``state_dtype_bytes`` is the conv-state element size (the model dtype unless
    overridden); ``ssm_state_dtype`` the SSM / recurrent state dtype the user asked for
    (``auto``: the family's default, which the reader resolves). The reader records the
    mixer it found and the state dtypes it used in ``mamba_mixer`` / ``state_dtypes``.
    """

    f: ConfigFields
    tp_size: int
    kv_dtype_bytes: int
    state_dtype_bytes: int
    model_dtype: str
    ssm_state_dtype: str
    block_size: int
    mamba_mixer: str | None = None
    state_dtypes: tuple[str, ...] = field(default=())

    def error(self, problem: str) -> ConfigError:
        """A :class:`ConfigError` naming the file and the model type."""
        return ConfigError(f"{self.f.source}: model_type {self.f.model_type!r}: {problem}")

    def ssm_dtype_bytes(self, family_default: str | None) -> int:
        """Bytes per SSM-state element: the user's choice, else ``family_default`` (a
        ``torch_dtype`` name), else the conv-state dtype; records both dtypes."""
        name = self.ssm_state_dtype
        if name == "auto":
            name = family_default or _name_of(self.model_dtype)
        short = TORCH_DTYPE_TO_NAME[name]
        self.state_dtypes = (_name_of(self.model_dtype), name)
        return {"bf16": 2, "fp16": 2, "fp32": 4}[short]


def _name_of(short: str) -> str:
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(short, short)


Reader = Callable[[ReaderContext], list[KVCacheSpec | None]]
_READERS: dict[str, Reader] = {}
_WRAPPERS: dict[str, tuple[str, Mapping[str, Any]]] = {}
_TOP_LEVEL_DEFAULTS: dict[str, Mapping[str, Any]] = {}


def register_reader(*model_types: str) -> Callable[[Reader], Reader]:
    """Decorator: ``reader`` handles configs of these ``model_type`` values."""
    def register(reader: Reader) -> Reader:
        for model_type in model_types:
            _READERS[model_type] = reader
        return reader

    return register


def register_wrapper(model_type: str, inner_type: str, defaults: Mapping[str, Any]) -> None:
    """A multimodal ``model_type`` whose ``text_config`` is read by ``inner_type``'s reader,
    with ``defaults`` for the text-config fields the file omits (also applied when the
    inner type is the file's own top-level ``model_type``)."""
    _WRAPPERS[model_type] = (inner_type, defaults)
    _TOP_LEVEL_DEFAULTS[inner_type] = defaults


def supported_model_types() -> list[str]:
    """Every ``model_type`` with a reader (wrappers with a nested text config included)."""
    return sorted(set(_READERS) | set(_WRAPPERS))


def resolve_dtype_name(f: ConfigFields) -> str:
    """The model dtype's short name (``bf16``...) from ``torch_dtype`` / ``dtype``.

    Raises:
        InputFileError: an unknown dtype.
    """
    raw = f.raw("torch_dtype") or f.raw("dtype")
    if raw is None:
        f.notes.append("torch_dtype absent: assuming bfloat16")
        return "bf16"
    if not isinstance(raw, str) or raw.removeprefix("torch.") not in TORCH_DTYPE_TO_NAME:
        raise f.error("torch_dtype", f"unknown dtype {raw!r}")
    return TORCH_DTYPE_TO_NAME[raw.removeprefix("torch.")]


def reader_for(config: Mapping[str, Any], source: str) -> tuple[ConfigFields, Reader]:
    """:func:`fields_for` and the reader registered for the model type it names."""
    fields, model_type = fields_for(config, source)
    return fields, _READERS[model_type]


def fields_for(config: Mapping[str, Any], source: str) -> tuple[ConfigFields, str]:
    """The fields a family reader reads (the nested ``text_config`` of a multimodal
    wrapper, with its defaults) and the ``model_type`` whose reader applies.

    Raises:
        UnsupportedModelError: ``model_type`` absent or unknown.
        InputFileError: ``text_config`` is not an object.
    """
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or (
        model_type not in _READERS and model_type not in _WRAPPERS
    ):
        missing = [key for key in GENERIC_FIELDS if key not in config]
        text = config.get("text_config")
        if isinstance(text, Mapping):
            missing = [key for key in missing if key not in text]
        what = "no model_type" if model_type is None else f"unknown model_type {model_type!r}"
        raise UnsupportedModelError(
            f"{source}: {what}; supported: {', '.join(supported_model_types())}; "
            + (f"fields missing for a generic decoder: {', '.join(missing)}; " if missing
               else "all generic decoder fields are present, but guessing is not safe; ")
            + "describe the layers in a layer-spec file instead"
        )
    fields = ConfigFields(config, source=source, model_type=model_type)
    if model_type in _WRAPPERS:
        inner_type, defaults = _WRAPPERS[model_type]
        text = config.get("text_config")
        if text is None:
            text = {}
        if not isinstance(text, Mapping):
            raise fields.error("text_config", f"expected an object, got {text!r}")
        fields = ConfigFields(
            text, source=source, model_type=model_type, prefix="text_config.",
            fallback=config, defaults=defaults,
        )
        model_type = inner_type
    elif model_type in _TOP_LEVEL_DEFAULTS:
        fields = ConfigFields(
            config, source=source, model_type=model_type,
            defaults=_TOP_LEVEL_DEFAULTS[model_type],
        )
    return fields, model_type


# -- shared pieces ---------------------------------------------------------------------------


def split_heads(ctx: ReaderContext, key: str, num_heads: int) -> int:
    """Heads per rank for ``num_heads`` split over ``tp_size`` ranks (exact division)."""
    return split_dim(ctx, key, num_heads, why="choose a TP size that divides it")


def _split_kv_heads(ctx: ReaderContext, num_kv_heads: int) -> int:
    """KV heads per rank: split when there are at least as many heads as ranks, else one
    per rank (replicated), which needs the ranks to be a multiple of the heads."""
    tp = ctx.tp_size
    if num_kv_heads >= tp:
        return split_heads(ctx, "num_key_value_heads", num_kv_heads)
    if tp % num_kv_heads:
        raise ctx.error(
            f"tensor-parallel size {tp} is neither a divisor nor a multiple of "
            f"num_key_value_heads = {num_kv_heads}, so KV heads cannot be replicated evenly"
        )
    return 1


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape:
    """Per-rank attention shape: KV heads and head size."""

    num_kv_heads: int
    head_size: int


def read_attention(
    ctx: ReaderContext, *, head_dim_key: str = "head_dim", head_dim_default: int | None = None
) -> AttentionShape:
    """Read heads / KV heads / head size, check them against each other and TP.

    The head size is ``head_dim_key`` when present, else ``head_dim_default`` when the
    family fixes one, else ``hidden_size / num_attention_heads``.
    """
    f = ctx.f
    num_heads = f.get_int("num_attention_heads")
    num_kv_heads = f.get_int("num_key_value_heads", num_heads)
    if num_kv_heads > num_heads or num_heads % num_kv_heads:
        raise f.error(
            "num_key_value_heads",
            f"{num_kv_heads} does not divide num_attention_heads = {num_heads}",
        )
    if f.has(head_dim_key) or head_dim_key in f.defaults:
        head_size = f.get_int(head_dim_key)
    elif head_dim_default is not None:
        head_size = f.get_int(head_dim_key, head_dim_default)
    else:
        hidden = f.get_int("hidden_size")
        if hidden % num_heads:
            raise f.error(
                "hidden_size",
                f"{hidden} is not a multiple of num_attention_heads = {num_heads} and "
                f"{head_dim_key} is absent, so the head size is unknown",
            )
        head_size = hidden // num_heads
    split_heads(ctx, "num_attention_heads", num_heads)
    return AttentionShape(num_kv_heads=_split_kv_heads(ctx, num_kv_heads),
                          head_size=head_size)


def full_spec(ctx: ReaderContext, att: AttentionShape) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=ctx.block_size, num_kv_heads=att.num_kv_heads, head_size=att.head_size,
        dtype_bytes=ctx.kv_dtype_bytes,
    )


def sliding_spec(ctx: ReaderContext, att: AttentionShape, window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=ctx.block_size, num_kv_heads=att.num_kv_heads, head_size=att.head_size,
        dtype_bytes=ctx.kv_dtype_bytes, sliding_window=window,
    )


def specs_from_layer_types(
    ctx: ReaderContext, layer_types: list[str], att: AttentionShape, window: int | None,
    key: str,
) -> list[KVCacheSpec | None]:
    """Specs for a ``layer_types`` list of ``full_attention`` / ``sliding_attention``."""
    specs: list[KVCacheSpec | None] = []
    for index, layer_type in enumerate(layer_types):
        if layer_type == "full_attention":
            specs.append(full_spec(ctx, att))
        elif layer_type == "sliding_attention":
            if window is None:
                raise ctx.f.error(
                    "sliding_window",
                    f"absent or null, but {key}[{index}] is 'sliding_attention'",
                )
            specs.append(sliding_spec(ctx, att, window))
        else:
            raise ctx.f.error(
                key, f"entry {index} is {layer_type!r}; expected 'full_attention' or "
                "'sliding_attention' for this model_type",
            )
    return specs


def state_spec(ctx: ReaderContext, state_bytes: int) -> MambaSpec:
    """A state spec of ``state_bytes`` per request and layer (block size: the context's)."""
    return MambaSpec(block_size=ctx.block_size, state_bytes=state_bytes)


def split_dim(ctx: ReaderContext, key: str, size: int, *,
              why: str = "the state is split along it") -> int:
    """``size`` split over the TP ranks (exact division); ``why`` ends the error."""
    if size % ctx.tp_size:
        raise ctx.error(
            f"tensor-parallel size {ctx.tp_size} does not divide {key} = {size}; {why}"
        )
    return size // ctx.tp_size
