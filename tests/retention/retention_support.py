"""Helpers for the retention tests: a fake clock and small managers."""

from __future__ import annotations

from typing import Any

from pagedkv import CacheConfig, FullAttentionSpec, HashExtras, KVCacheManager, Request
from pagedkv.retention import RequestRetention, RetentionConfig

BS = 4


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_manager(num_blocks: int, clock: FakeClock, **retention: Any) -> KVCacheManager:
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2)
    mgr = KVCacheManager(CacheConfig(
        groups=(spec,), num_blocks=num_blocks, max_model_len=256,
        retention=RetentionConfig(clock=clock, **retention),
    ))
    mgr.check_invariants()
    return mgr


def run(mgr: KVCacheManager, rid: str, tokens: list[int], *,
        retention: RequestRetention | None = None, salt: str | None = None) -> Request:
    """Look up, allocate the whole prompt, free; checks invariants after each call.
    Returns the request (its hit length in ``num_computed_tokens`` before the run)."""
    extras = HashExtras(cache_salt=salt) if salt is not None else None
    req = mgr.new_request(rid, tokens, retention=retention, hash_extras=extras)
    hit = mgr.get_computed_blocks(req)
    new = mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                             new_computed_blocks=hit)
    assert new is not None, f"{rid}: no room"
    mgr.check_invariants()
    req.num_computed_tokens = req.num_tokens
    mgr.free(req)
    mgr.check_invariants()
    return req


def hit_tokens(mgr: KVCacheManager, tokens: list[int], *, salt: str | None = None) -> int:
    extras = HashExtras(cache_salt=salt) if salt is not None else None
    req = mgr.new_request("probe", tokens, hash_extras=extras)
    return mgr.get_computed_blocks(req).num_computed_tokens


def prompt(tag: int, num_blocks: int, extra: int = 1) -> list[int]:
    """``num_blocks`` full blocks of tokens unique to ``tag``, plus ``extra`` tokens."""
    return [tag * 1000 + i for i in range(num_blocks * BS + extra)]


def free_order(mgr: KVCacheManager) -> list[int]:
    order: list[int] = mgr.debug_state()["pool"]["free_queue"]
    return order
