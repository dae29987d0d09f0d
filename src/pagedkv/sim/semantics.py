"""Hit-accounting semantics: what a prompt stores, what it may hit and what a hit credits.

Two legitimate conventions, each a class:

* :class:`VllmSemantics` (default) — what vLLM and pagedkv do: only *full* blocks are
  hashed and stored; a lookup covers at most ``n - 1`` tokens (the last token is always
  recomputed for its logits), so a prompt of ``n`` tokens queries ``floor((n-1)/b)``
  blocks, stores ``floor(n/b)``, and a hit of ``h`` blocks credits ``h*b`` tokens.
* :class:`ReferenceSemantics` — the convention of the published Mooncake hit-rate curves
  (the FAST'25 paper, kvcache-simulator): every ``hash_id`` is a cache entry, the partial
  last block included, so a prompt stores and queries ``ceil(n/b)`` blocks, and a hit of
  ``h`` blocks credits ``min(h*b, n)`` (the last block is weighted by its remainder).

Worked case, ``b`` = 512, a 1200-token prompt whose 3 ids are all cached: vLLM credits
1024 tokens (2 full blocks; the 3rd is partial and never stored), reference credits 1200.

In pure-cache mode the reference convention is replayed on the real manager: the request
is given ``ceil(n/b)*b + 1`` tokens, so the lookup may hit all ``ceil(n/b)`` blocks; only
those blocks are stored (the extra token never is; a prompt whose every block hits still
computes that token, so one block is allocated for it and freed unstored, as an engine
would); the credit is capped at ``n``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from pagedkv import ComputedBlocks, InvalidArgumentError, KVCacheManager, Request
from pagedkv.sim.workloads import Workload, check_block_size

__all__ = ["SEMANTICS", "ReferenceSemantics", "Semantics", "VllmSemantics", "get_semantics"]


class Semantics(ABC):
    """How prompts are stored, looked up and credited (module docstring)."""

    name: str

    @abstractmethod
    def check(self, workload: Workload, block_size: int) -> None:
        """Raise :class:`InvalidArgumentError` when ``workload`` cannot be replayed."""

    @abstractmethod
    def num_stored_blocks(self, num_tokens: int, block_size: int) -> int:
        """Blocks a prompt of ``num_tokens`` stores."""

    @abstractmethod
    def num_queried_blocks(self, num_tokens: int, block_size: int) -> int:
        """Blocks a prompt of ``num_tokens`` may hit."""

    def tail_tokens(self, num_tokens: int, block_size: int) -> int:
        """Tokens credited by a hit on the last queried block (``block_size`` unless it is
        a partial block)."""
        return block_size

    @abstractmethod
    def manager_tokens(self, num_tokens: int, block_size: int) -> int:
        """Tokens of the manager request replaying a prompt of ``num_tokens``."""

    @abstractmethod
    def replay(
        self, mgr: KVCacheManager, req: Request, num_tokens: int, block_size: int,
        max_tokens: int,
    ) -> int:
        """Look ``req`` up, store its blocks (at most ``max_tokens`` slots), free it;
        return the tokens credited."""


class VllmSemantics(Semantics):
    name = "vllm"

    def check(self, workload: Workload, block_size: int) -> None:
        check_block_size(block_size, workload.source_block_size)

    def num_stored_blocks(self, num_tokens: int, block_size: int) -> int:
        return num_tokens // block_size

    def num_queried_blocks(self, num_tokens: int, block_size: int) -> int:
        return (num_tokens - 1) // block_size

    def manager_tokens(self, num_tokens: int, block_size: int) -> int:
        return num_tokens

    def replay(
        self, mgr: KVCacheManager, req: Request, num_tokens: int, block_size: int,
        max_tokens: int,
    ) -> int:
        hit = mgr.get_computed_blocks(req)
        claim_and_free(mgr, req, hit, min(num_tokens, max_tokens), block_size)
        return hit.num_computed_tokens


class ReferenceSemantics(Semantics):
    name = "reference"

    def check(self, workload: Workload, block_size: int) -> None:
        src = workload.source_block_size
        check_block_size(block_size, src)
        if src is not None and block_size > src:
            raise InvalidArgumentError(
                f"reference semantics stores each trace hash id's block, the partial last "
                f"one included: use a block size dividing {src}, got {block_size}"
            )
        if any(r.hash_ids is None and r.prompt_token_ids is not None
               for r in workload.requests):
            raise InvalidArgumentError(
                "reference semantics replays traces with hash ids (or lengths only); "
                "generated token ids are hashed by full blocks only: use --semantics vllm"
            )

    def num_stored_blocks(self, num_tokens: int, block_size: int) -> int:
        return -(-num_tokens // block_size)

    def num_queried_blocks(self, num_tokens: int, block_size: int) -> int:
        return -(-num_tokens // block_size)

    def tail_tokens(self, num_tokens: int, block_size: int) -> int:
        return num_tokens - (-(-num_tokens // block_size) - 1) * block_size

    def manager_tokens(self, num_tokens: int, block_size: int) -> int:
        return -(-num_tokens // block_size) * block_size + 1

    def replay(
        self, mgr: KVCacheManager, req: Request, num_tokens: int, block_size: int,
        max_tokens: int,
    ) -> int:
        padded = -(-num_tokens // block_size) * block_size
        hit = mgr.get_computed_blocks(req)
        claim_and_free(mgr, req, hit, min(padded, max_tokens), block_size)
        return min(hit.num_computed_tokens, num_tokens)


def claim_and_free(
    mgr: KVCacheManager, req: Request, hit: ComputedBlocks, num_stored_tokens: int,
    block_size: int,
) -> None:
    """Adopt ``hit``, compute ``req`` up to ``num_stored_tokens`` (so its full blocks are
    stored), then free it (tail first). The hit blocks are claimed either way, an LRU
    touch: when every block to store hit, one more token is computed (its block is never
    stored), and when the cache has no block left for that token — the hit fills the
    whole cache, a prompt at least as long as the cache seen again — the hit's last block
    is computed again instead: it is then the only free block, so it is taken back and
    stored under the same hash, and the same blocks end up claimed.

    Worked case, block 4, 3 usable blocks, a 14-token prompt stored as ``a1 a2 a3`` seen
    again: the hit ``a1 a2 a3`` fills the cache; ``a1 a2`` are adopted and ``a3`` computed
    again, in the block it was in; all three end up most recently used.

    Raises:
        InvalidArgumentError: the cache cannot hold even one block of the prompt.
    """
    num_hit = hit.num_computed_tokens
    new = mgr.allocate_slots(req, max(1, num_stored_tokens - num_hit), new_computed_blocks=hit)
    if new is None and num_hit >= max(block_size, num_stored_tokens):
        cut = mgr.truncate_computed_blocks(hit, num_hit - block_size)
        new = mgr.allocate_slots(req, num_hit - cut.num_computed_tokens, new_computed_blocks=cut)
    if new is None:
        raise InvalidArgumentError(
            f"request {req.request_id!r}: a cache of {mgr.config.num_blocks - 1} usable "
            f"blocks of {block_size} tokens cannot hold its first block; give more blocks"
        )
    mgr.free(req)


SEMANTICS: dict[str, Semantics] = {s.name: s for s in (VllmSemantics(), ReferenceSemantics())}


def get_semantics(name: str | Semantics) -> Semantics:
    """The semantics called ``name`` ("vllm" or "reference"); a :class:`Semantics` as is.

    Raises:
        InvalidArgumentError: an unknown name.
    """
    if isinstance(name, Semantics):
        return name
    try:
        return SEMANTICS[name]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown semantics {name!r}; choose {' or '.join(SEMANTICS)}"
        ) from None
