"""From a Hugging Face ``config.json`` to the per-layer KV-cache specs of one worker.

One reader per model family, registered by ``model_type``. Each reader decides, layer by
layer, how the layer stores its cache (full attention, sliding window, chunked local, MLA,
Mamba-1 / Mamba-2 / gated-delta-net state, or nothing) the way the family's reference
implementation does, including the defaults it applies when a field is absent. Every
default used is recorded in :attr:`ModelSpec.notes`.

Tensor parallelism (``tp_size``) is applied here, so the specs are those of **one rank**:

* KV heads are split across ranks, never below one per rank: 8 KV heads on TP 4 -> 2 per
  rank; 8 KV heads on TP 16 -> 1 per rank (each head replicated on 2 ranks). The query
  heads must divide evenly, and so must the KV heads when there are at least as many as
  ranks (else the ranks must be a multiple of the heads).
* MLA keeps its one latent vector per token on every rank (it is not split).
* Mamba / linear-attention state is split along its channel / head dimension, which must
  divide evenly.

Worked case (Llama-3.1-70B, bf16, TP 1): 80 layers x 2 x 8 KV heads x 128 x 2 bytes =
327,680 bytes per token; at TP 4 each rank holds 2 KV heads: 81,920 bytes per token.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

from pagedkv.errors import (
    ConfigError,
    InputFileError,
    InvalidArgumentError,
    UnsupportedModelError,
)
from pagedkv.planner._fields import ConfigFields
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

__all__ = [
    "KV_DTYPE_BYTES",
    "ModelSpec",
    "bundled_model_names",
    "load_config",
    "load_model_spec",
    "model_spec_from_config",
    "supported_model_types",
]

#: Bytes per element of each KV-cache dtype accepted by ``kv_dtype`` (``auto`` = the
#: model's own dtype).
KV_DTYPE_BYTES: Mapping[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}

_TORCH_DTYPE_TO_NAME: Mapping[str, str] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
}

_BUNDLED_PACKAGE = "pagedkv"
_BUNDLED_DIR = ("data", "model_configs")

#: Fields every decoder-only transformer config carries; named in the error for a
#: ``model_type`` this module does not know, so the user can see what a layer-spec file
#: would need.
_GENERIC_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "hidden_size")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """The KV-cache layers of one model on one tensor-parallel rank.

    ``layer_specs`` lists ``(layer name, spec)`` in model order; layers without a cache
    (e.g. the MLP-only layers of Nemotron-H) are absent. ``notes`` lists the defaults that
    were assumed for absent config fields.
    """

    name: str
    model_type: str
    tp_size: int
    kv_dtype: str
    layer_specs: tuple[tuple[str, KVCacheSpec], ...]
    num_hidden_layers: int
    max_position_embeddings: int | None
    notes: tuple[str, ...] = ()

    @property
    def layer_to_spec(self) -> dict[str, KVCacheSpec]:
        """Layer name -> spec, in model order."""
        return dict(self.layer_specs)

    @property
    def kind_to_num_layers(self) -> dict[str, int]:
        """Spec kind (``full_attention``, ``sliding_window``, ...) -> number of layers."""
        return dict(Counter(spec.kind for _, spec in self.layer_specs))

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token costs across all layers of this rank (states excluded)."""
        return sum(spec.bytes_per_token for _, spec in self.layer_specs)


# -- loading ---------------------------------------------------------------------------------


def _bundled_folder() -> Traversable:
    folder = resources.files(_BUNDLED_PACKAGE)
    for part in _BUNDLED_DIR:
        folder = folder.joinpath(part)
    return folder


def bundled_model_names() -> list[str]:
    """Names of the configs shipped with pagedkv (file names without ``.json``), sorted."""
    return sorted(
        entry.name[: -len(".json")]
        for entry in _bundled_folder().iterdir()
        if entry.name.endswith(".json")
    )


def _resolve_bundled(model: str) -> str | None:
    """The bundled name ``model`` stands for: exact (case-insensitive, ``.json`` optional),
    else the one bundled name containing it. ``None`` when nothing matches.

    Raises:
        ConfigError: ``model`` is contained in several bundled names.
    """
    query = model.lower().removesuffix(".json")
    names = bundled_model_names()
    for name in names:
        if name.lower() == query:
            return name
    matches = [name for name in names if query in name.lower()]
    if len(matches) > 1:
        raise ConfigError(
            f"model {model!r} matches several bundled configs: {', '.join(matches)}; "
            "give the full name"
        )
    return matches[0] if matches else None


def load_config(model: str) -> tuple[dict[str, Any], str, str]:
    """Read a model's config: a path to a ``config.json``, or a bundled name.

    Returns ``(config, source, name)``: the parsed JSON object, the path or
    ``bundled:<file>`` it came from (for error messages), and a display name (the bundled
    name, or the parent folder of a ``config.json``, or the file stem).

    Raises:
        InputFileError: no such file or bundled name; not valid JSON; not a JSON object.
        ConfigError: an ambiguous bundled name.
    """
    path = Path(model)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        source = str(path)
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    else:
        bundled = _resolve_bundled(model)
        if bundled is None:
            raise InputFileError(
                model,
                "no such file and no bundled config of that name; bundled configs: "
                + ", ".join(bundled_model_names()),
            )
        entry = _bundled_folder().joinpath(bundled + ".json")
        text = entry.read_text(encoding="utf-8")
        source = f"bundled:{bundled}.json"
        name = bundled
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(source, f"not valid JSON: {exc.msg}", line=exc.lineno) from exc
    if not isinstance(data, dict):
        raise InputFileError(source, f"expected a JSON object, got {type(data).__name__}")
    return data, source, name


def load_model_spec(
    model: str, *, tp_size: int = 1, kv_dtype: str = "auto", block_size: int = 16
) -> ModelSpec:
    """:func:`load_config` then :func:`model_spec_from_config`."""
    config, source, name = load_config(model)
    return model_spec_from_config(
        config, name=name, source=source, tp_size=tp_size, kv_dtype=kv_dtype,
        block_size=block_size,
    )


# -- the reader context ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ctx:
    """What a family reader needs: the fields, TP size, dtypes and the block size."""

    f: ConfigFields
    tp_size: int
    kv_dtype_bytes: int
    state_dtype_bytes: int
    block_size: int

    def error(self, problem: str) -> ConfigError:
        return ConfigError(f"{self.f.source}: model_type {self.f.model_type!r}: {problem}")


_Reader = Callable[[_Ctx], list[KVCacheSpec | None]]
_READERS: dict[str, _Reader] = {}
_SUBCONFIG: dict[str, tuple[str, Mapping[str, Any]]] = {}


def _family(*model_types: str) -> Callable[[_Reader], _Reader]:
    def register(reader: _Reader) -> _Reader:
        for model_type in model_types:
            _READERS[model_type] = reader
        return reader

    return register


def supported_model_types() -> list[str]:
    """Every ``model_type`` with a reader (wrappers with a nested text config included)."""
    return sorted(set(_READERS) | set(_SUBCONFIG))


def _resolve_dtype_name(f: ConfigFields) -> str:
    raw = f.raw("torch_dtype") or f.raw("dtype")
    if raw is None:
        f.notes.append("torch_dtype absent: assuming bfloat16")
        return "bf16"
    if not isinstance(raw, str) or raw.removeprefix("torch.") not in _TORCH_DTYPE_TO_NAME:
        raise f.error("torch_dtype", f"unknown dtype {raw!r}")
    return _TORCH_DTYPE_TO_NAME[raw.removeprefix("torch.")]


def _fields_for(config: Mapping[str, Any], source: str) -> tuple[ConfigFields, str]:
    """The fields a family reader reads (the nested ``text_config`` of a multimodal
    wrapper, with its defaults) and the ``model_type`` whose reader applies.

    Raises:
        UnsupportedModelError: ``model_type`` absent or unknown.
        InputFileError: ``text_config`` is not an object.
    """
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or (
        model_type not in _READERS and model_type not in _SUBCONFIG
    ):
        missing = [key for key in _GENERIC_FIELDS if key not in config]
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
    if model_type in _SUBCONFIG:
        inner_type, defaults = _SUBCONFIG[model_type]
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


def model_spec_from_config(
    config: Mapping[str, Any],
    *,
    name: str = "model",
    source: str = "config.json",
    tp_size: int = 1,
    kv_dtype: str = "auto",
    block_size: int = 16,
) -> ModelSpec:
    """The per-layer KV specs of ``config`` on one of ``tp_size`` ranks.

    ``kv_dtype`` is ``auto`` (the model's ``torch_dtype``) or a key of
    :data:`KV_DTYPE_BYTES`; it applies to attention KV only (Mamba state keeps the model
    dtype). ``block_size`` is the tokens per block of every layer; the planner may grow it
    for Mamba hybrids. Layers are named ``layers.<i>`` after their index in the model.

    Raises:
        UnsupportedModelError: ``model_type`` absent or unknown (names it and the generic
            fields the config lacks).
        InputFileError: a field the family needs is missing, mistyped or contradicts
            another (names file and key).
        ConfigError: ``tp_size`` does not divide the heads or state dimension.
        InvalidArgumentError: ``tp_size``/``block_size`` not positive, unknown ``kv_dtype``.
    """
    if not isinstance(tp_size, int) or tp_size <= 0:
        raise InvalidArgumentError(f"tp_size must be a positive int, got {tp_size!r}")
    if not isinstance(block_size, int) or block_size <= 0:
        raise InvalidArgumentError(f"block_size must be a positive int, got {block_size!r}")
    if kv_dtype != "auto" and kv_dtype not in KV_DTYPE_BYTES:
        raise InvalidArgumentError(
            f"kv_dtype must be auto or one of {', '.join(KV_DTYPE_BYTES)}, got {kv_dtype!r}"
        )
    fields, model_type = _fields_for(config, source)
    model_dtype = _resolve_dtype_name(fields)
    kv_name = model_dtype if kv_dtype == "auto" else kv_dtype
    ctx = _Ctx(
        f=fields,
        tp_size=tp_size,
        kv_dtype_bytes=KV_DTYPE_BYTES[kv_name],
        state_dtype_bytes=KV_DTYPE_BYTES[model_dtype],
        block_size=block_size,
    )
    per_layer = _READERS[model_type](ctx)
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
    )


# -- shared pieces ---------------------------------------------------------------------------


def _split_heads(ctx: _Ctx, key: str, num_heads: int) -> int:
    """Heads per rank for ``num_heads`` split over ``tp_size`` ranks (exact division)."""
    if num_heads % ctx.tp_size:
        raise ctx.error(
            f"tensor-parallel size {ctx.tp_size} does not divide {key} = {num_heads}; "
            "choose a TP size that divides it"
        )
    return num_heads // ctx.tp_size


def _split_kv_heads(ctx: _Ctx, num_kv_heads: int) -> int:
    """KV heads per rank: split when there are at least as many heads as ranks, else one
    per rank (replicated), which needs the ranks to be a multiple of the heads."""
    tp = ctx.tp_size
    if num_kv_heads >= tp:
        return _split_heads(ctx, "num_key_value_heads", num_kv_heads)
    if tp % num_kv_heads:
        raise ctx.error(
            f"tensor-parallel size {tp} is neither a divisor nor a multiple of "
            f"num_key_value_heads = {num_kv_heads}, so KV heads cannot be replicated evenly"
        )
    return 1


@dataclass(frozen=True, slots=True, kw_only=True)
class _Attention:
    """Per-rank attention shape: KV heads and head size."""

    num_kv_heads: int
    head_size: int


def _attention(
    ctx: _Ctx, *, head_dim_key: str = "head_dim", head_dim_default: int | None = None
) -> _Attention:
    """Read heads / KV heads / head size, check them against each other and TP.

    The head size is ``head_dim`` when present, else ``head_dim_default`` when the family
    fixes one, else ``hidden_size / num_attention_heads``.
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
    _split_heads(ctx, "num_attention_heads", num_heads)
    return _Attention(num_kv_heads=_split_kv_heads(ctx, num_kv_heads), head_size=head_size)


def _full(ctx: _Ctx, att: _Attention) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=ctx.block_size, num_kv_heads=att.num_kv_heads, head_size=att.head_size,
        dtype_bytes=ctx.kv_dtype_bytes,
    )


def _sliding(ctx: _Ctx, att: _Attention, window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=ctx.block_size, num_kv_heads=att.num_kv_heads, head_size=att.head_size,
        dtype_bytes=ctx.kv_dtype_bytes, sliding_window=window,
    )


def _from_layer_types(
    ctx: _Ctx, layer_types: list[str], att: _Attention, window: int | None, key: str
) -> list[KVCacheSpec | None]:
    """Specs for a ``layer_types`` list of ``full_attention`` / ``sliding_attention``."""
    specs: list[KVCacheSpec | None] = []
    for index, layer_type in enumerate(layer_types):
        if layer_type == "full_attention":
            specs.append(_full(ctx, att))
        elif layer_type == "sliding_attention":
            if window is None:
                raise ctx.f.error(
                    "sliding_window",
                    f"absent or null, but {key}[{index}] is 'sliding_attention'",
                )
            specs.append(_sliding(ctx, att, window))
        else:
            raise ctx.f.error(
                key, f"entry {index} is {layer_type!r}; expected 'full_attention' or "
                "'sliding_attention' for this model_type",
            )
    return specs


# -- dense transformer families --------------------------------------------------------------


@_family("llama", "mixtral", "mistral", "gemma")
def _read_llama_like(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """Llama 2/3, Mistral, Mixtral and similar: every layer full attention, or every layer
    sliding when ``sliding_window`` is set (Mistral 7B v0.1: 4096). Gemma 1 fixes the head
    size at 256 unless ``head_dim`` says otherwise."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = _attention(ctx, head_dim_default=256 if f.model_type == "gemma" else None)
    window = f.opt_int("sliding_window")
    if window is not None:
        return [_sliding(ctx, att, window) for _ in range(num_layers)]
    return [_full(ctx, att) for _ in range(num_layers)]


@_family("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
def _read_qwen(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """Qwen 2 / 2.5 / 3: ``layer_types`` when present; else the window applies only when
    ``use_sliding_window`` is true (default false), and then to layers with index >=
    ``max_window_layers`` (default 28). Qwen2.5-7B ships ``use_sliding_window: false`` with
    ``sliding_window: 131072``: all full attention."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = _attention(ctx)
    use_window = f.get_bool("use_sliding_window", False)
    window = f.opt_int("sliding_window") if use_window else None
    layer_types = f.str_list("layer_types", length=num_layers)
    if layer_types is not None:
        return _from_layer_types(ctx, layer_types, att, f.opt_int("sliding_window"),
                                 "layer_types")
    if use_window and window is None:
        raise f.error("sliding_window", "null, but use_sliding_window is true")
    if window is None:
        return [_full(ctx, att) for _ in range(num_layers)]
    first_windowed = f.get_int("max_window_layers", 28, minimum=0)
    return [
        _sliding(ctx, att, window) if index >= first_windowed else _full(ctx, att)
        for index in range(num_layers)
    ]


def _alternating_layers(
    ctx: _Ctx, *, head_dim_default: int | None, window_default: int
) -> list[KVCacheSpec | None]:
    """``layer_types`` when present, else even layers sliding and odd layers full."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = _attention(ctx, head_dim_default=head_dim_default)
    window = f.get_int("sliding_window", window_default)
    layer_types = f.str_list("layer_types", length=num_layers) or [
        "sliding_attention" if index % 2 == 0 else "full_attention"
        for index in range(num_layers)
    ]
    return _from_layer_types(ctx, layer_types, att, window, "layer_types")


@_family("gemma2")
def _read_gemma2(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """Gemma 2: ``layer_types`` when present, else even layers sliding (window default
    4096) and odd layers full; head size 256 unless ``head_dim`` says otherwise."""
    return _alternating_layers(ctx, head_dim_default=256, window_default=4096)


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


@_family("gemma3_text")
def _read_gemma3(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """Gemma 3: ``layer_types`` when present, else layer i is full attention iff
    ``(i + 1) % sliding_window_pattern == 0`` (pattern default 6) and sliding otherwise.
    Gemma-3-27B: 62 layers -> 10 full + 52 sliding (window 1024)."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = _attention(ctx)
    window = f.get_int("sliding_window")
    layer_types = f.str_list("layer_types", length=num_layers)
    if layer_types is None:
        pattern = f.get_int("sliding_window_pattern")
        layer_types = [
            "full_attention" if (index + 1) % pattern == 0 else "sliding_attention"
            for index in range(num_layers)
        ]
    return _from_layer_types(ctx, layer_types, att, window, "layer_types")


@_family("gpt_oss")
def _read_gpt_oss(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """gpt-oss: ``layer_types`` (default: even layers sliding, odd full), window default
    128, head size default 64."""
    return _alternating_layers(ctx, head_dim_default=64, window_default=128)


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


@_family("llama4_text")
def _read_llama4(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """Llama 4: ``no_rope_layers[i] == 0`` marks a NoPE layer with global (full) attention;
    the other layers use chunked local attention (``attention_chunk_size``, default 8192).
    Absent ``no_rope_layers``: every ``no_rope_layer_interval``-th layer (default 4) is NoPE.
    Llama-4-Scout: 48 layers -> 12 full + 36 chunked."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    att = _attention(ctx)
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
            specs.append(_full(ctx, att))
    return specs


_SUBCONFIG["gemma3"] = ("gemma3_text", _GEMMA3_TEXT_DEFAULTS)
_SUBCONFIG["llama4"] = ("llama4_text", _LLAMA4_TEXT_DEFAULTS)
_TOP_LEVEL_DEFAULTS: dict[str, Mapping[str, Any]] = {
    "gemma3_text": _GEMMA3_TEXT_DEFAULTS,
    "llama4_text": _LLAMA4_TEXT_DEFAULTS,
}


@_family("deepseek_v2", "deepseek_v3")
def _read_deepseek(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """DeepSeek V2 / V3: multi-head latent attention on every layer, one latent of
    ``kv_lora_rank + qk_rope_head_dim`` elements per token, not split by TP.
    DeepSeek-V3: 61 x (512 + 64) x 2 bytes = 70,272 bytes per token."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    _split_heads(ctx, "num_attention_heads", f.get_int("num_attention_heads"))
    latent = f.get_int("kv_lora_rank") + f.get_int("qk_rope_head_dim")
    spec = MLAAttentionSpec(
        block_size=ctx.block_size, num_kv_heads=1, head_size=latent,
        dtype_bytes=ctx.kv_dtype_bytes,
    )
    return [spec] * num_layers


# -- state-space hybrids ---------------------------------------------------------------------


def _mamba(ctx: _Ctx, num_elements: int) -> MambaSpec:
    return MambaSpec(block_size=ctx.block_size,
                     state_bytes=num_elements * ctx.state_dtype_bytes)


def _split_dim(ctx: _Ctx, key: str, size: int) -> int:
    if size % ctx.tp_size:
        raise ctx.error(
            f"tensor-parallel size {ctx.tp_size} does not divide {key} = {size}, which the "
            "state is split along"
        )
    return size // ctx.tp_size


@_family("jamba")
def _read_jamba(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """Jamba (Mamba-1 + attention): layer i is attention iff ``i % attn_layer_period ==
    attn_layer_offset`` (defaults 8, 4), else Mamba-1. Mamba-1 state per rank: a conv state
    of ``inner/tp x (d_conv - 1)`` plus an SSM state of ``inner/tp x d_state`` elements,
    ``inner = mamba_expand x hidden_size``. Jamba-1.5-Mini: 4 attention + 28 Mamba;
    8192 x (3 + 16) x 2 = 311,296 state bytes per layer."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    period = f.get_int("attn_layer_period", 8)
    offset = f.get_int("attn_layer_offset", 4, minimum=0)
    if offset >= period:
        raise f.error("attn_layer_offset", f"{offset} is not below attn_layer_period {period}")
    att = _attention(ctx)
    inner = f.get_int("mamba_expand", 2) * f.get_int("hidden_size")
    inner_per_rank = _split_dim(ctx, "mamba_expand x hidden_size", inner)
    conv = f.get_int("mamba_d_conv", 4, minimum=2)
    state = f.get_int("mamba_d_state", 16)
    mamba = _mamba(ctx, inner_per_rank * (conv - 1) + inner_per_rank * state)
    return [
        _full(ctx, att) if index % period == offset else mamba for index in range(num_layers)
    ]


def _mamba2_state_elements(
    ctx: _Ctx, *, inner: int, num_heads: int, head_dim: int, n_groups: int, d_state: int,
    conv_kernel: int,
) -> int:
    """Mamba-2 state elements per rank: conv state ``(inner + 2 x groups x d_state)/tp x
    (kernel - 1)`` plus SSM state ``heads/tp x head_dim x d_state``. Groups that TP cannot
    split are replicated up to ``tp`` (as the reference implementation does for one group).
    """
    heads = _split_dim(ctx, "mamba_num_heads", num_heads)
    if n_groups % ctx.tp_size:
        n_groups = ctx.tp_size
    conv_dim = _split_dim(ctx, "the Mamba-2 conv dimension", inner + 2 * n_groups * d_state)
    return conv_dim * (conv_kernel - 1) + heads * head_dim * d_state


@_family("nemotron_h")
def _read_nemotron_h(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """Nemotron-H: ``hybrid_override_pattern`` has one character per layer: ``M`` Mamba-2,
    ``*`` attention, ``-`` MLP and ``E`` mixture of experts (no cache). Mamba-2 width is
    ``mamba_num_heads x mamba_head_dim``."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    pattern = f.get_str("hybrid_override_pattern")
    if len(pattern) != num_layers:
        raise f.error(
            "hybrid_override_pattern",
            f"has {len(pattern)} characters but num_hidden_layers is {num_layers}",
        )
    unknown = sorted(set(pattern) - set("M*-E"))
    if unknown:
        raise f.error("hybrid_override_pattern",
                      f"unknown layer characters {''.join(unknown)!r}; expected M, *, - or E")
    att = _attention(ctx, head_dim_key="attention_head_dim", head_dim_default=128) \
        if "*" in pattern else None
    mamba: MambaSpec | None = None
    if "M" in pattern:
        num_heads = f.get_int("mamba_num_heads")
        head_dim = f.get_int("mamba_head_dim")
        n_groups = f.get_int("n_groups", f.raw("mamba_n_groups") or 8)
        mamba = _mamba(ctx, _mamba2_state_elements(
            ctx, inner=num_heads * head_dim, num_heads=num_heads, head_dim=head_dim,
            n_groups=n_groups, d_state=f.get_int("ssm_state_size"),
            conv_kernel=f.get_int("conv_kernel", 4, minimum=2),
        ))
    specs: list[KVCacheSpec | None] = []
    for char in pattern:
        if char == "*" and att is not None:
            specs.append(_full(ctx, att))
        elif char == "M":
            specs.append(mamba)
        else:
            specs.append(None)
    return specs


@_family("qwen3_next")
def _read_qwen3_next(ctx: _Ctx) -> list[KVCacheSpec | None]:
    """Qwen3-Next: ``layer_types`` of ``full_attention`` / ``linear_attention``, default
    every ``full_attention_interval``-th layer (default 4) full. Linear layers are gated
    delta nets with a state per rank of conv ``(2 x k_heads x k_dim + v_heads x v_dim)/tp x
    (kernel - 1)`` plus ``v_heads/tp x k_dim x v_dim`` elements."""
    f = ctx.f
    num_layers = f.get_int("num_hidden_layers")
    layer_types = f.str_list("layer_types", length=num_layers)
    if layer_types is None:
        interval = f.get_int("full_attention_interval", 4)
        layer_types = [
            "full_attention" if (index + 1) % interval == 0 else "linear_attention"
            for index in range(num_layers)
        ]
    att = _attention(ctx, head_dim_default=256)
    k_heads = f.get_int("linear_num_key_heads", 16)
    v_heads = f.get_int("linear_num_value_heads", 32)
    k_dim = f.get_int("linear_key_head_dim", 128)
    v_dim = f.get_int("linear_value_head_dim", 128)
    kernel = f.get_int("linear_conv_kernel_dim", 4, minimum=2)
    if v_heads % k_heads:
        raise f.error("linear_num_value_heads",
                      f"{v_heads} is not a multiple of linear_num_key_heads = {k_heads}")
    _split_dim(ctx, "linear_num_key_heads", k_heads)
    conv_dim = _split_dim(ctx, "the delta-net conv dimension",
                          2 * k_heads * k_dim + v_heads * v_dim)
    state = _mamba(ctx, conv_dim * (kernel - 1)
                   + _split_dim(ctx, "linear_num_value_heads", v_heads) * k_dim * v_dim)
    specs: list[KVCacheSpec | None] = []
    for index, layer_type in enumerate(layer_types):
        if layer_type == "full_attention":
            specs.append(_full(ctx, att))
        elif layer_type == "linear_attention":
            specs.append(state)
        else:
            raise f.error("layer_types", f"entry {index} is {layer_type!r}; expected "
                          "'full_attention' or 'linear_attention'")
    return specs
