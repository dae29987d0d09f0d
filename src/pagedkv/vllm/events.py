"""pagedkv's KV-cache event records as vLLM 0.33's event objects: the fields vLLM's
own manager fills (group kind and sliding window per group, LoRA, medium, extra keys as
tuples, lookahead tokens) and the session of the request that stored the blocks."""

from __future__ import annotations

from typing import Any

from pagedkv.vllm.compat import require_vllm

require_vllm()  # before vLLM's modules: one line when vLLM is missing or another release

from vllm.distributed import kv_events as vk  # noqa: E402
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash  # noqa: E402
from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window  # noqa: E402

from pagedkv.core.records import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent  # noqa: E402

__all__ = ["EventConverter"]


def _keys(keys: Any) -> Any:
    if keys is None:
        return None
    return tuple(tuple(k) if isinstance(k, list) else k for k in keys)


class EventConverter:
    """Converts records of one manager (its groups' kinds from ``kv_cache_config``)."""

    def __init__(self, kv_cache_config: Any) -> None:
        self.group_meta = [
            (get_kv_cache_spec_kind(g.kv_cache_spec).value,
             get_kv_cache_spec_sliding_window(g.kv_cache_spec))
            for g in kv_cache_config.kv_cache_groups
        ]

    def convert(self, records: list[KVCacheEvent], session_id: str | None) -> list[Any]:
        """vLLM events for ``records``; stored blocks get ``session_id``."""
        out: list[Any] = []
        for r in records:
            if isinstance(r, BlockStored):
                kind, window = self.group_meta[r.group_idx]
                out.append(vk.BlockStored(
                    block_hashes=[maybe_convert_block_hash(h) for h in r.block_hashes],
                    parent_block_hash=None if r.parent_block_hash is None
                    else maybe_convert_block_hash(r.parent_block_hash),
                    token_ids=list(r.token_ids), block_size=r.block_size,
                    lora_id=r.lora_id, medium=r.medium, lora_name=r.lora_name,
                    extra_keys=None if r.extra_keys is None
                    else [_keys(k) for k in r.extra_keys],
                    group_idx=r.group_idx, kv_cache_spec_kind=kind,
                    kv_cache_spec_sliding_window=window, session_id=session_id,
                    lookahead_token_ids=r.lookahead_token_ids))
            elif isinstance(r, BlockRemoved):
                out.append(vk.BlockRemoved(
                    block_hashes=[maybe_convert_block_hash(h) for h in r.block_hashes],
                    medium=r.medium, group_idx=r.group_idx))
            elif isinstance(r, AllBlocksCleared):
                out.append(vk.AllBlocksCleared())
        return out
