"""The hybrid lookup under the EAGLE last-block drop, as vLLM 0.33 and 0.32 run it.

With a drafter that needs the last hit block's hidden states and no lookahead block hashes
(``CacheConfig.drop_last_hit``; vLLM's ``use_eagle``), every group drops the last block of
its hit. vLLM's ``HybridKVCacheCoordinator.find_longest_cache_hit`` then runs its fixed
point with three rules of its own (pagedkv's plain fixed point, in
:class:`~pagedkv.core.coordinator_hybrid.HybridCoordinator`, keeps to the others):

* a group asked with the drop looks one block past the candidate ``C`` (capped at the
  request's hashed tokens, not at the lookup's bound) and drops it again, landing on ``C``
  when that block matched; a Mamba group never drops, so it gets no extra block;
* a group applies the drop once per candidate: asked again at the same candidate, it is
  asked without the drop (``find_hit_without_drop``), within ``C``; a group that shortens
  ``C`` without the drop makes every group drop again at the new candidate;
* the first pass starts from the bound itself (not rounded to the block lcm); a model of
  one full-attention and one other group stops after one pass.

Full-attention groups are looked up once and afterwards only truncated, as without the
drop. Worked case (full attention 8 + sliding window 24 at block 8, a 32-token prompt whose
4 blocks are cached in both groups, bound 31): full attention looks within ``min(31 + 8,
32) = 32``, finds 4 blocks, drops one: 24; the window group looks within 32, finds its
run of 3 + 1 blocks ending at block 3, drops one: 24 too, ``[b0, b1, b2]``; the hit is 24
tokens (a plain lookup within 31 would give 16).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.core.managers.base import SingleTypeManager

__all__ = ["find_hit_with_drop"]


def find_hit_with_drop(
    managers: Sequence[SingleTypeManager],
    full: Sequence[int],
    others: Sequence[int],
    block_hashes: list[bytes],
    max_length: int,
    hashed_tokens: int,
) -> tuple[tuple[list[int], ...], int]:
    """Per-group hit blocks and the hit length within ``max_length`` (module docstring);
    ``full``: the groups whose hits are prefix closed (looked up once), ``others``: the
    rest, both in lookup order; ``hashed_tokens``: the request's hashed tokens. Every
    group of ``managers`` that joins lookups is in one of them. No state change.
    Cost: one scan per full-attention group, one per other group and pass."""
    hits: list[list[int] | None] = [None] * len(managers)
    lengths = [0] * len(managers)
    verified: set[int] = set()
    order = [*full, *others]
    simple = len(order) == 2 and len(full) >= 1
    hit_length = max_length
    while True:
        cur = hit_length
        for g in order:
            m = managers[g]
            if g in full and hits[g] is not None:
                cur = min(cur, lengths[g])
                continue
            drop = m.drop_last_hit and g not in verified
            bound = cur
            if drop and m.hit_shape != "state":
                bound = min(cur + m.block_size, hashed_tokens)
            blocks = (m.find_longest_cache_hit(block_hashes, bound) if drop
                      else m.find_hit_without_drop(block_hashes, bound))
            align = m.hit_alignment_tokens
            got = len(blocks) * m.block_size // align * align
            del blocks[-(-got // m.block_size):]
            if drop:
                verified.add(g)
            elif got < cur:
                verified.clear()
            cur = got
            hits[g], lengths[g] = blocks, got
        if cur >= hit_length:
            break
        hit_length = cur
        if simple:
            break
    for g in full:
        held = hits[g]
        if held is not None:
            del held[-(-hit_length // managers[g].block_size):]
    return tuple(h if h is not None else [] for h in hits), hit_length
