"""PyTorch integration (optional ``torch`` extra): KV-cache tensors laid out as a
:class:`~pagedkv.planner.KVCachePlan` says, block tables and slot mappings as tensors, a
reference paged attention, and a tiny decoder driven by :class:`~pagedkv.KVCacheManager`
that checks prefix caching changes no logit (``pagedkv check-attention``).

Importing ``pagedkv.torch`` needs nothing; the first attribute access imports PyTorch and
raises :class:`~pagedkv.errors.MissingDependencyError` (naming the extra) without it.
See ``docs/torch.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedkv.torch.attention import (
        AttentionMask,
        CausalMask,
        ChunkedLocalMask,
        SlidingWindowMask,
        attend,
        gather_kv,
        gather_latent,
        paged_attention,
        paged_latent_attention,
        write_kv,
        write_latent,
    )
    from pagedkv.torch.engine import Engine, EngineStats
    from pagedkv.torch.model import TinyDecoder, TinyModelConfig, checkpoint_state_io
    from pagedkv.torch.tables import (
        BatchTables,
        Placement,
        ShuffledPlacement,
        build_batch_tables,
    )
    from pagedkv.torch.tensors import KVCacheTensors

_NAME_TO_MODULE = {
    "AttentionMask": "attention",
    "BatchTables": "tables",
    "CausalMask": "attention",
    "ChunkedLocalMask": "attention",
    "Engine": "engine",
    "EngineStats": "engine",
    "KVCacheTensors": "tensors",
    "Placement": "tables",
    "ShuffledPlacement": "tables",
    "SlidingWindowMask": "attention",
    "TinyDecoder": "model",
    "TinyModelConfig": "model",
    "attend": "attention",
    "build_batch_tables": "tables",
    "checkpoint_state_io": "model",
    "gather_kv": "attention",
    "gather_latent": "attention",
    "paged_attention": "attention",
    "paged_latent_attention": "attention",
    "write_kv": "attention",
    "write_latent": "attention",
}

__all__ = [
    "AttentionMask",
    "BatchTables",
    "CausalMask",
    "ChunkedLocalMask",
    "Engine",
    "EngineStats",
    "KVCacheTensors",
    "Placement",
    "ShuffledPlacement",
    "SlidingWindowMask",
    "TinyDecoder",
    "TinyModelConfig",
    "attend",
    "build_batch_tables",
    "checkpoint_state_io",
    "gather_kv",
    "gather_latent",
    "paged_attention",
    "paged_latent_attention",
    "write_kv",
    "write_latent",
]


def __getattr__(name: str) -> Any:
    module = _NAME_TO_MODULE.get(name)
    if module is None:
        raise AttributeError(f"module 'pagedkv.torch' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pagedkv.torch.{module}"), name)
