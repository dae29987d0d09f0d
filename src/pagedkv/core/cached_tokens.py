"""How many of a live request's tokens sit in registered (prefix-cached) blocks.

:func:`estimate_cached_tokens` answers vLLM 0.33's ``estimate_cached_tokens`` question from
the block tables alone: it reads, never writes (no statistics, no free-queue order, no
events), so calling it any number of times leaves ``debug_state()`` identical.

Per group, the answer is the token count the request's last registered block covers: a
block registered at table position ``i`` covers ``(i + 1) * block_size`` tokens, or, when
its key is a partial-prefix key (``BlockPool.cache_partial_block``), the tokens of that
prefix. Groups that are never prefix cached (cross attention) are skipped; the result is
the minimum over the remaining groups, 0 when there are none or the request holds nothing.

Worked case (one full-attention group, block size 4): a request holding ``[7, 8, 9]``
whose first two blocks are registered and whose third is still filling -> 8 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.core.managers import SingleTypeManager
from pagedkv.core.pool import BlockPool
from pagedkv.core.request import RequestLike

__all__ = ["estimate_cached_tokens"]


def estimate_cached_tokens(
    managers: Sequence[SingleTypeManager], pool: BlockPool, request: RequestLike
) -> int:
    """Tokens of ``request`` covered by its registered blocks, minimum over the prefix-cached
    groups (see the module docstring). O(blocks the request holds)."""
    rid = request.request_id
    block_hash = pool.block_hash
    result: int | None = None
    for m in managers:
        if not m.cacheable:
            continue
        table = m.req_to_blocks.get(rid)
        n = 0
        if table:
            for i in range(len(table) - 1, -1, -1):
                b = table[i]
                if b and block_hash[b] is not None:
                    n = _tokens_of_key(pool, request, m.block_size, i, block_hash[b])
                    break
        result = n if result is None else min(result, n)
    return result or 0


def _tokens_of_key(
    pool: BlockPool, request: RequestLike, block_size: int, pos: int, key: bytes | None
) -> int:
    """Tokens covered by ``key``, the primary key of the block at table position ``pos``:
    the whole block unless the key is one of the request's partial-prefix hashes inside it."""
    hbs = pool.hash_block_size
    k = block_size // hbs
    full = (pos + 1) * block_size
    if k == 1:
        return full
    hashes = request.block_hashes
    last = (pos + 1) * k - 1
    if last < len(hashes) and hashes[last] == key:
        return full
    for j in range(pos * k, min(last, len(hashes))):
        if hashes[j] == key:
            return (j + 1) * hbs
    return full
