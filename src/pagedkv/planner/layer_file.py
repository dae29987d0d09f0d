"""Explicit layer specs from a JSON (or YAML) file, for models no config reader knows.

Format (values are per tensor-parallel rank; ``block_size`` defaults to the plan's)::

    {
      "name": "my-model",                      optional
      "max_position_embeddings": 32768,        optional: default max_model_len
      "num_parameters": 7000000000,            optional: for the weights estimate
      "weight_dtype": "bf16",                  optional (default bf16)
      "layers": [
        {"kind": "full_attention", "count": 4,
         "num_kv_heads": 8, "head_size": 128, "dtype_bytes": 2},
        {"kind": "sliding_window", "count": 20, "sliding_window": 4096,
         "num_kv_heads": 8, "head_size": 128, "dtype_bytes": 2},
        {"kind": "mamba", "names": ["mixer.0", "mixer.1"], "state_bytes": 311296}
      ]
    }

``kind`` is the ``kind`` of a spec class (``full_attention``, ``mla_attention``,
``full_attention_sink``, ``sliding_window``, ``chunked_local_attention``,
``cross_attention``, ``mamba``); the other keys are that class's fields. An entry stands
for ``count`` layers (default 1) named ``layers.<i>`` in file order, or for the layers in
``names``. From Python, pass specs to :func:`pagedkv.planner.plan_kv_cache` directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.core.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.errors import InputFileError, InvalidArgumentError
from pagedkv.input_files import load_document
from pagedkv.planner.model_spec import ModelSpec
from pagedkv.planner.weights import WEIGHT_DTYPE_BYTES

__all__ = ["LayerFileModel", "is_layer_file", "load_layer_file", "parse_layer_file"]

_KIND_TO_CLASS: Mapping[str, type[KVCacheSpec]] = {
    cls.kind: cls
    for cls in (FullAttentionSpec, MLAAttentionSpec, SinkFullAttentionSpec, SlidingWindowSpec,
                ChunkedLocalAttentionSpec, CrossAttentionSpec, MambaSpec)
}
_YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerFileModel:
    """A model read from a layer-spec file: its specs and, if given, its parameters."""

    spec: ModelSpec
    num_parameters: int | None
    weight_dtype: str


def is_layer_file(path: Path, data: Mapping[str, Any] | None = None) -> bool:
    """Whether ``path`` (with its parsed JSON ``data``, if read) is a layer-spec file: a
    YAML file, or a JSON object with a ``layers`` list and no ``model_type``."""
    if path.suffix.lower() in _YAML_SUFFIXES:
        return True
    return data is not None and isinstance(data.get("layers"), list) and "model_type" not in data


def load_layer_file(path: str | Path, *, block_size: int = 16) -> LayerFileModel:
    """Read and parse a layer-spec file (JSON, or YAML when PyYAML is installed).

    Raises:
        InputFileError: unreadable, malformed, or an entry that is not a valid spec.
        MissingDependencyError: a YAML file without PyYAML installed.
    """
    path = Path(path)
    fmt = "yaml" if path.suffix.lower() in _YAML_SUFFIXES else "json"
    data = load_document(path, what="layer-spec file", fmt=fmt)
    return parse_layer_file(data, source=str(path), block_size=block_size)


def _required_fields(cls: type[KVCacheSpec]) -> list[str]:
    return [
        f.name for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        and f.name != "block_size"
    ]


def parse_layer_file(
    data: Any, *, source: str = "layers.json", block_size: int = 16
) -> LayerFileModel:
    """Build the model a parsed layer-spec document describes.

    Raises:
        InputFileError: the document or one of its entries is malformed (names the entry).
    """
    if not isinstance(data, Mapping):
        raise InputFileError(source, "expected an object with a 'layers' list")
    entries = data.get("layers")
    if not isinstance(entries, list) or not entries:
        raise InputFileError(source, "expected a non-empty list", key="layers")
    layer_specs: list[tuple[str, KVCacheSpec]] = []
    for index, entry in enumerate(entries):
        key = f"layers[{index}]"
        if not isinstance(entry, Mapping):
            raise InputFileError(source, f"expected an object, got {entry!r}", key=key)
        kind = entry.get("kind")
        if not isinstance(kind, str) or kind not in _KIND_TO_CLASS:
            raise InputFileError(
                source, f"kind {kind!r} is not one of {', '.join(_KIND_TO_CLASS)}", key=key
            )
        cls = _KIND_TO_CLASS[kind]
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(entry) - allowed - {"kind", "count", "names"})
        if unknown:
            raise InputFileError(
                source, f"unknown fields {', '.join(unknown)} for kind {kind!r}; its fields "
                f"are {', '.join(sorted(allowed))}", key=key,
            )
        missing = [name for name in _required_fields(cls) if name not in entry]
        if missing:
            raise InputFileError(source, f"kind {kind!r} needs {', '.join(missing)}", key=key)
        values = {name: entry[name] for name in allowed if name in entry}
        values.setdefault("block_size", block_size)
        try:
            spec = cls(**values)
        except InvalidArgumentError as exc:
            raise InputFileError(source, str(exc), key=key) from exc
        names = entry.get("names")
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise InputFileError(source, "'names' must be a list of strings", key=key)
            if "count" in entry and entry["count"] != len(names):
                raise InputFileError(source, f"count {entry['count']!r} contradicts the "
                                     f"{len(names)} names", key=key)
        else:
            count = entry.get("count", 1)
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                raise InputFileError(source, f"count must be a positive integer, got "
                                     f"{count!r}", key=key)
            names = [f"layers.{len(layer_specs) + i}" for i in range(count)]
        layer_specs.extend((name, spec) for name in names)
    seen = [name for name, _ in layer_specs]
    if len(set(seen)) != len(seen):
        duplicate = next(name for name in seen if seen.count(name) > 1)
        raise InputFileError(source, f"layer name {duplicate!r} used twice", key="layers")
    num_parameters = data.get("num_parameters")
    if num_parameters is not None and (
        isinstance(num_parameters, bool) or not isinstance(num_parameters, int)
        or num_parameters <= 0
    ):
        raise InputFileError(source, f"expected a positive integer, got {num_parameters!r}",
                             key="num_parameters")
    weight_dtype = data.get("weight_dtype", "bf16")
    if weight_dtype not in WEIGHT_DTYPE_BYTES:
        raise InputFileError(source, f"expected one of {', '.join(WEIGHT_DTYPE_BYTES)}, got "
                             f"{weight_dtype!r}", key="weight_dtype")
    max_len = data.get("max_position_embeddings")
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int)
                                or max_len <= 0):
        raise InputFileError(source, f"expected a positive integer, got {max_len!r}",
                             key="max_position_embeddings")
    name = data.get("name", Path(source).stem)
    model = ModelSpec(
        name=str(name), model_type="layer-spec file", tp_size=1, kv_dtype="as given",
        layer_specs=tuple(layer_specs), num_hidden_layers=len(layer_specs),
        max_position_embeddings=max_len,
    )
    return LayerFileModel(spec=model, num_parameters=num_parameters, weight_dtype=weight_dtype)
