"""Helpers shared by the hybrid tests: spec builders, a request driver, and an independent
statement of what makes a hit valid for each kind (used as the reference model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    Request,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

HEADS = {"num_kv_heads": 2, "head_size": 8, "dtype_bytes": 2}


def full(bs: int) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, **HEADS)


def mla(bs: int) -> MLAAttentionSpec:
    return MLAAttentionSpec(block_size=bs, num_kv_heads=1, head_size=16, dtype_bytes=2)


def sink(bs: int, sink_len: int) -> SinkFullAttentionSpec:
    return SinkFullAttentionSpec(block_size=bs, sink_len=sink_len, **HEADS)


def sliding(bs: int, window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size=bs, sliding_window=window, **HEADS)


def chunked(bs: int, chunk: int) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(block_size=bs, attention_chunk_size=chunk, **HEADS)


def mamba(bs: int, checkpoints: bool = True) -> MambaSpec:
    return MambaSpec(block_size=bs, state_bytes=4096, cache_checkpoints=checkpoints)


def cross(bs: int, max_encoder_len: int) -> CrossAttentionSpec:
    return CrossAttentionSpec(block_size=bs, max_encoder_len=max_encoder_len, **HEADS)


def make_mgr(
    groups: Sequence[KVCacheSpec], *, num_blocks: int = 64, max_model_len: int = 4096,
    **options: Any,
) -> KVCacheManager:
    mgr = KVCacheManager(CacheConfig(groups=tuple(groups), num_blocks=num_blocks,
                                     max_model_len=max_model_len, **options))
    mgr.check_invariants()
    return mgr


def tokens(n: int, base: int = 1000) -> list[int]:
    return list(range(base, base + n))


@dataclass
class Driven:
    """A request driven through the manager step by step."""

    req: Request
    hit_tokens: int = 0
    hits: tuple[list[int], ...] = field(default_factory=tuple)


def admit(mgr: KVCacheManager, rid: str, prompt: list[int], *,
          chunk_tokens: int | None = None) -> Driven:
    """Look the prompt up and compute it (in chunks of ``chunk_tokens``), checking
    invariants after every call. Raises AssertionError if an allocation is refused."""
    req = mgr.new_request(rid, prompt)
    hit = mgr.get_computed_blocks(req)
    d = Driven(req, hit.num_computed_tokens, hit.block_ids)
    done = hit.num_computed_tokens
    first = True
    while done < len(prompt):
        n = len(prompt) - done if chunk_tokens is None else min(chunk_tokens, len(prompt) - done)
        out = mgr.allocate_slots(req, n, new_computed_blocks=hit if first else None)
        assert out is not None, f"{rid}: allocation refused"
        mgr.check_invariants()
        done += n
        req.num_computed_tokens = done
        first = False
    return d


def decode(mgr: KVCacheManager, d: Driven, token: int) -> tuple[list[int], ...] | None:
    """One decode step: the last token is computed, one new token appended."""
    req = d.req
    req.append_output_tokens(token)
    out = mgr.allocate_slots(req, 1)
    mgr.check_invariants()
    if out is not None:
        req.num_computed_tokens += 1
    return out


def real_blocks(table: Sequence[int]) -> int:
    return sum(1 for b in table if b)


def hit_is_valid(mgr: KVCacheManager, block_hashes: list[bytes],
                 hit: tuple[list[int], ...], num_hit: int) -> str | None:
    """Why ``hit`` is not a valid hit of ``num_hit`` tokens, or None if it is.

    Restates each kind's rule independently of the managers: the table covers exactly
    ``num_hit`` tokens, every real block is registered under the hash ending at its
    boundary, and every position the next token reads is real.
    """
    pool = mgr.pool
    hbs = pool.hash_block_size
    for g, m in enumerate(mgr.managers):
        spec = m.spec
        bs = spec.block_size
        blocks = hit[g]
        never_hits = isinstance(spec, CrossAttentionSpec) or (
            isinstance(spec, MambaSpec) and not spec.cache_checkpoints
        )
        if never_hits:
            if num_hit:
                return f"group {g}: {type(spec).__name__} cannot hit"
            continue
        if len(blocks) * bs != num_hit:
            return f"group {g}: {len(blocks)} blocks of {bs} for a {num_hit}-token hit"
        k = bs // hbs
        for i, b in enumerate(blocks):
            if b and pool.index[g].get(block_hashes[(i + 1) * k - 1]) is None:
                return f"group {g}: block {i} ({b}) is not cached"
            if b and pool.block_hash[b] != block_hashes[(i + 1) * k - 1]:
                return f"group {g}: block {i} ({b}) holds other content"
        if isinstance(spec, SlidingWindowSpec):
            first_needed = max(0, num_hit - spec.sliding_window + 1) // bs
        elif isinstance(spec, ChunkedLocalAttentionSpec):
            first_needed = num_hit // spec.attention_chunk_size * spec.attention_chunk_size // bs
        elif isinstance(spec, MambaSpec):
            first_needed = max(0, num_hit // bs - 1)
        else:
            first_needed = 0
        for i in range(first_needed, len(blocks)):
            if not blocks[i]:
                return f"group {g}: block {i} is needed but null"
    return None
