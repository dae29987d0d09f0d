"""Helpers shared by the hybrid tests: spec builders, a request driver, and an independent
statement of what makes a hit valid for each kind (used as the reference model)."""

from __future__ import annotations

import math
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


def skipped_tokens(spec: KVCacheSpec, num_computed_tokens: int) -> int:
    """Leading tokens no future token reads once ``num_computed_tokens`` are computed, from
    each kind's definition (the managers are not consulted)."""
    c = num_computed_tokens
    if isinstance(spec, SlidingWindowSpec):
        return max(0, c - spec.sliding_window + 1)  # token c reads c - w + 1 .. c
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return c // spec.attention_chunk_size * spec.attention_chunk_size  # chunk of token c
    if isinstance(spec, MambaSpec) and spec.cache_checkpoints:
        return max(0, -(-c // spec.block_size) - 1) * spec.block_size  # finished checkpoints
    return 0


def _needed_blocks(spec: KVCacheSpec, num_hit: int) -> range | None:
    """Block positions a hit of ``num_hit`` tokens must have cached for the next token
    (``num_hit``) to be computed; None if the kind can never hit (then only 0 is valid)."""
    bs = spec.block_size
    end = num_hit // bs
    if isinstance(spec, CrossAttentionSpec):
        return None
    if isinstance(spec, MambaSpec):
        if not spec.cache_checkpoints:
            return None
        return range(max(0, end - 1), end)  # the state after num_hit tokens only
    if isinstance(spec, SlidingWindowSpec):
        return range(max(0, num_hit - spec.sliding_window + 1) // bs, end)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        chunk = spec.attention_chunk_size
        return range(num_hit // chunk * chunk // bs, end)
    return range(end)  # full attention, MLA, sinks: the whole prefix


def oracle_longest_hit(mgr: KVCacheManager, block_hashes: list[bytes], max_length: int,
                       drop_last_hit: bool) -> int:
    """The longest hit (tokens) valid for every group, by brute force over every candidate
    length from the spec formulas alone: a multiple of the lcm of the block sizes, at most
    ``max_length``, and for each group every needed block position (``_needed_blocks``) is
    registered in the prefix index under the hash ending at its boundary. With
    ``drop_last_hit`` (speculative decoding) the block right after the hit must be
    registered too in every group but a Mamba one: vLLM (0.32 and 0.33) gives a Mamba
    group no EAGLE margin and its finder never drops, so its hit ends at the candidate
    length. That block may end past ``max_length``: a dropping group looks one block past
    the candidate, capped at the request's hashed tokens, not at the lookup's bound
    (``pagedkv.core.eagle_hits``; e.g. 48 hashed tokens at block 8, bound 47: a hit of 40
    whose block 40-48 is cached). 0 (a miss) is always valid."""
    pool = mgr.pool
    hbs = pool.hash_block_size
    specs = [m.spec for m in mgr.managers]
    lcm = math.lcm(*(s.block_size for s in specs))

    def cached(g: int, i: int) -> bool:
        k = specs[g].block_size // hbs
        j = (i + 1) * k - 1
        return j < len(block_hashes) and block_hashes[j] in pool.index[g]

    for length in range(max_length // lcm * lcm, 0, -lcm):
        ok = True
        for g, spec in enumerate(specs):
            needed = _needed_blocks(spec, length)
            if needed is None:
                ok = False
                break
            if (drop_last_hit and not isinstance(spec, MambaSpec)
                    and not cached(g, length // spec.block_size)):
                ok = False
                break
            if not all(cached(g, i) for i in needed):
                ok = False
                break
        if ok:
            return length
    return 0
