"""The adapter's per-step calls in C: :func:`install_entry`.

vLLM's scheduler calls its KV-cache manager's ``allocate_slots(request, n,
num_lookahead_tokens=0)`` for every running request every step, and ``cache_blocks(request,
n)`` (async scheduling). With the compiled core, :func:`install_entry` makes an adapter's
``allocate_slots`` and ``cache_blocks`` the compiled core's ``VllmEntry``
(``pagedkv/_csrc/ccore_vllm.h``): the steady-state call (a request the adapter holds; at
most ``num_lookahead_tokens=0``; no admitting request under a watermark) is translated in
C — the request's live view, vLLM's counting as the façade's keywords, the answer as
vLLM's block objects — and every other call goes, unchanged and before anything changes,
to :class:`~pagedkv.vllm.manager.VLLMKVCacheManager`'s Python methods, which are its
specification (``tests/vllm_sched/test_vllm_entry.py`` runs whole schedules both ways).
Not installed with KV-cache events (each call drains them) nor, for ``cache_blocks``,
without prefix caching; never with the pure core.
"""

from __future__ import annotations

from typing import Any

from pagedkv.core import native

__all__ = ["install_entry"]


def install_entry(adapter: Any, admitting: tuple[Any, ...]) -> bool:
    """Install the compiled entry on ``adapter`` (a ``VLLMKVCacheManager`` at the end of
    its construction; its class's ``allocate_slots`` and ``cache_blocks`` take every call
    the entry does not); whether it was installed. ``admitting``: the request statuses
    that count the watermark. Calling it again rebuilds the entry from the adapter's
    current settings (``watermark_blocks``, ``enable_caching``)."""
    cls = type(adapter)
    ccore = native.active()
    if ccore is None or adapter.enable_kv_cache_events:
        return False
    entry = ccore.VllmEntry(
        adapter=adapter, facade=adapter.pagedkv, views=adapter._views,
        allocate_function=cls.allocate_slots,
        cache_function=cls.cache_blocks, wrap=adapter._table.blocks,
        empty=adapter.empty_kv_cache_blocks,
        admitting=admitting if adapter.watermark_blocks else None,
        hash_block_size=adapter._hash_block_size)
    adapter.allocate_slots = entry.allocate_slots
    if adapter.enable_caching:
        adapter.cache_blocks = entry.cache_blocks
    else:
        adapter.__dict__.pop("cache_blocks", None)
    return True
