"""Compatibility names: the config reader now lives in :mod:`pagedkv.planner.model_spec`
(the :class:`ModelSpec` type), :mod:`pagedkv.planner.bundled` (config files and bundled
names) and :mod:`pagedkv.planner.readers` (one reader module per family)."""

from pagedkv.planner.bundled import bundled_model_names, load_config
from pagedkv.planner.model_spec import KV_DTYPE_BYTES, ModelSpec
from pagedkv.planner.readers import load_model_spec, model_spec_from_config
from pagedkv.planner.readers.base import supported_model_types

__all__ = [
    "KV_DTYPE_BYTES",
    "ModelSpec",
    "bundled_model_names",
    "load_config",
    "load_model_spec",
    "model_spec_from_config",
    "supported_model_types",
]
