"""Helpers for the observability tests: observed managers whose every call is checked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager, KVCacheSpec, Request
from pagedkv.observe import LookupExplanation, ObserveConfig, ObservedKVCacheManager, Reason

HEADS = {"num_kv_heads": 2, "head_size": 8, "dtype_bytes": 2}


def full(bs: int) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, **HEADS)


class Clock:
    """A settable clock for eviction records and residency."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def observed(
    groups: Sequence[KVCacheSpec], *, num_blocks: int = 64, max_model_len: int = 4096,
    observe: ObserveConfig | None = None, **options: Any,
) -> KVCacheManager:
    mgr = ObservedKVCacheManager(
        CacheConfig(groups=tuple(groups), num_blocks=num_blocks, max_model_len=max_model_len,
                    **options),
        observe,
    )
    mgr.check_invariants()
    return mgr


def compute(mgr: KVCacheManager, req: Request) -> None:
    """Look up, allocate and compute the whole prompt of ``req`` (checked)."""
    hit = mgr.get_computed_blocks(req)
    out = mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                             new_computed_blocks=hit)
    assert out is not None, f"{req.request_id}: allocation refused"
    req.num_computed_tokens = req.num_tokens
    mgr.check_invariants()


def spans(e: LookupExplanation) -> list[tuple[int, int, str]]:
    return [(s.start, s.end, s.label) for s in e.segments]


def check_partition(e: LookupExplanation) -> None:
    """Segments are contiguous, cover the prompt, and the hit part is the hit."""
    pos = 0
    for s in e.segments:
        assert s.start == pos and s.end > s.start, (pos, s)
        pos = s.end
    assert pos == e.num_tokens
    hit = sum(s.num_tokens for s in e.segments if s.reason is Reason.HIT)
    assert hit == e.num_hit_tokens
    assert not e.segments or e.segments[0].reason is Reason.HIT or hit == 0
