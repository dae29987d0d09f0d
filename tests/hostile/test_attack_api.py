"""Every public configuration dataclass's every field, found by introspection, attacked
with every value of :data:`catalogue.API_VALUES`: the constructor raises a documented
pagedkv error, or what it accepted is of the annotated type, finite, within 64 bits,
valid Unicode, and a duration (``*_s``) of at most 1e9 s (:func:`catalogue.field_problem`).
The instance attacked is left as it was."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing
from typing import Any

import pytest
from catalogue import API_VALUES, field_problem

import pagedkv
from pagedkv.errors import PagedKVError

_SUFFIXES = ("Config", "Settings", "Retention", "Spec", "Options")
#: Sub-packages not attacked here: optional extras (need torch / vLLM / Ray installed).
_SKIP = ("pagedkv.torch", "pagedkv.vllm", "pagedkv.sweep.ray_backend", "pagedkv.__main__")
_ATTN = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype_bytes": 2}


def _required() -> dict[str, dict[str, Any]]:
    """Required fields of classes without a default for them: one valid value each."""
    from pagedkv import FullAttentionSpec
    from pagedkv.sweep.grid import Grid

    return {
        "AttentionSpec": _ATTN, "FullAttentionSpec": _ATTN, "MLAAttentionSpec": _ATTN,
        "SinkFullAttentionSpec": {**_ATTN, "sink_len": 4},
        "SlidingWindowSpec": {**_ATTN, "sliding_window": 128},
        "SlidingWindowMLASpec": {**_ATTN, "sliding_window": 128},
        "ChunkedLocalAttentionSpec": {**_ATTN, "attention_chunk_size": 128},
        "CrossAttentionSpec": {**_ATTN, "max_encoder_len": 1024},
        "MambaSpec": {"block_size": 16, "state_bytes": 4096},
        "KVCacheSpec": {"block_size": 16},
        "GpuSpec": {"name": "g", "bf16_tflops": 100.0, "fp8_tflops": None, "hbm_tb_s": 1.0,
                    "memory_gib": 16.0, "interconnect_gb_s": 64.0},
        "CacheConfig": {"groups": (FullAttentionSpec(**_ATTN),), "num_blocks": 8,
                        "max_model_len": 64},
        "EngineConfig": {"num_blocks": 120}, "HostTierSettings": {"num_blocks": 8},
        "HostTierConfig": {"num_blocks": 8}, "HostMemoryConfig": {"memory_bytes": 2**20},
        "ReplicaOptions": {"replicas": 1},
        "SourceSpec": {"pod": "p0", "endpoint": "tcp://127.0.0.1:5557"},
        "SweepSpec": {"grid": Grid(fixed={}, axes=())},
    }


#: Output records rather than configuration (built by the planner, not by a caller).
_NOT_CONFIG = {"ModelSpec"}


def _classes() -> list[type]:
    out: dict[str, type] = {}
    for info in pkgutil.walk_packages(pagedkv.__path__, "pagedkv."):
        if info.name.startswith(_SKIP):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue
        for name in getattr(module, "__all__", ()):
            cls = getattr(module, name, None)
            if inspect.isclass(cls) and dataclasses.is_dataclass(cls) \
                    and name.endswith(_SUFFIXES) and cls.__module__ == info.name \
                    and name not in _NOT_CONFIG:
                out[f"{cls.__module__}.{name}"] = cls
    return [out[k] for k in sorted(out)]


def _instance(cls: type) -> Any | None:
    try:
        return cls(**REQUIRED.get(cls.__name__, {}))
    except (TypeError, PagedKVError):
        return None


REQUIRED = _required()
CLASSES = _classes()
FIELDS = [(cls, f) for cls in CLASSES for f in dataclasses.fields(cls) if f.init]


def test_classes_found() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"CacheConfig", "KVEventsConfig", "RetentionConfig", "TokenRangeRetention",
            "HostTierConfig", "ObserveConfig", "SimConfig"} <= names
    assert all(_instance(c) is not None for c in CLASSES), \
        [c.__name__ for c in CLASSES if _instance(c) is None]


@pytest.mark.parametrize(("cls", "field"), FIELDS,
                         ids=[f"{c.__name__}.{f.name}" for c, f in FIELDS])
def test_field(cls: type, field: dataclasses.Field[Any]) -> None:
    base = _instance(cls)
    assert base is not None
    hints = typing.get_type_hints(cls)
    before = repr(base)
    bad = []
    for value in API_VALUES:
        try:
            made = dataclasses.replace(base, **{field.name: value})
        except PagedKVError:
            continue
        except Exception as exc:  # a raw error is the defect this test hunts
            bad.append(f"{value!r:.30}: raw {type(exc).__name__}: {exc}"[:200])
            continue
        why = field_problem(field.name, getattr(made, field.name), hints[field.name])
        if why is not None:
            bad.append(f"{value!r:.30}: {why}")
    assert repr(base) == before  # the attacked instance is unchanged
    assert not bad, bad


def test_the_pairs_counted() -> None:
    print(f"api: {len(CLASSES)} classes, {len(FIELDS)} fields x {len(API_VALUES)} values "
          f"= {len(FIELDS) * len(API_VALUES)} pairs")
    assert len(FIELDS) * len(API_VALUES) >= 3000
