"""Helpers for the host-tier tests: a checked host-tiered manager and a step driver."""

from __future__ import annotations

from typing import Any

from pagedkv import CacheConfig, FullAttentionSpec
from pagedkv.host import HostTierConfig, HostTieredKVCacheManager

BS = 4


class Checked:
    """Proxy over a HostTieredKVCacheManager that walks both tiers after every call."""

    def __init__(self, mgr: HostTieredKVCacheManager) -> None:
        self.mgr = mgr

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.mgr, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            finally:
                self.mgr.check_invariants()

        return call


def spec(block_size: int = BS) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=8, dtype_bytes=2)


def make(num_blocks: int = 10, host_blocks: int = 16, *, events: bool = False,
         **host_options: Any) -> Any:
    cfg = CacheConfig(groups=(spec(),), num_blocks=num_blocks, max_model_len=256,
                      enable_events=events)
    return Checked(HostTieredKVCacheManager(cfg, HostTierConfig(num_blocks=host_blocks,
                                                                **host_options)))


def run(m: Any, rid: str, tokens: list[int], *, complete: bool = True) -> tuple[Any, Any, Any]:
    """Lookup + allocate the whole prompt; completes every plan (success) when
    ``complete``; returns (request, hit, new block ids)."""
    req = m.new_request(rid, tokens)
    hit = m.host.lookup(req)
    new = m.allocate_slots(req, len(tokens) - hit.num_computed_tokens, new_computed_blocks=hit)
    if new is not None and complete:
        finish_step(m)
        req.num_computed_tokens = len(tokens)
    return req, hit, new


def finish_step(m: Any, *, store_ok: bool = True, load_ok: bool = True) -> tuple[list[Any],
                                                                               list[Any]]:
    """Execute (confirm) every store and load plan of the step; returns them."""
    stores = m.host.take_store_plans()
    loads = m.host.take_load_plans()
    for p in stores:
        m.host.complete_store(p, store_ok)
    for p in loads:
        m.host.complete_load(p, load_ok)
    return stores, loads
