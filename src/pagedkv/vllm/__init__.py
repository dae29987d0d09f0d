"""pagedkv inside vLLM 0.33: its own scheduler on pagedkv's KV-cache manager.

Run vLLM with ``--scheduler-cls pagedkv.vllm.PagedKVScheduler`` (or
``pagedkv.vllm.PagedKVAsyncScheduler`` with ``--async-scheduling``), or install the
``vllm`` extra and set ``PAGEDKV_VLLM=1`` (the general plugin picks the class). The
scheduler is vLLM's own; only its ``kv_cache_manager`` is pagedkv's façade behind
:class:`~pagedkv.vllm.manager.VLLMKVCacheManager`, which presents the members vLLM's
scheduler, KV connectors and engine core read. Layouts pagedkv cannot run exactly are
refused at construction with one line naming the kind and the fallback
(:mod:`pagedkv.vllm.layout`). See ``docs/vllm.md``.

Importing this package needs no vLLM; its classes do (``pagedkv doctor`` prints the install
command for this machine: vLLM's CPU build where no GPU is seen).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PagedKVAsyncScheduler", "PagedKVScheduler", "VLLMKVCacheManager"]

_LAZY = {
    "PagedKVScheduler": "pagedkv.vllm.scheduler",
    "PagedKVAsyncScheduler": "pagedkv.vllm.scheduler",
    "VLLMKVCacheManager": "pagedkv.vllm.manager",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pagedkv.vllm' has no attribute {name!r}")
    from pagedkv.vllm.compat import require_vllm

    require_vllm()
    import importlib

    return getattr(importlib.import_module(module), name)
