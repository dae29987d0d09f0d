"""Prefill lookahead: the computed tokens a drafter may prefill again are not registered.

A drafter that reads P prefill tokens past the computed range (vLLM's
``num_prefill_lookahead_tokens``: 1 for EAGLE-family drafters, the speculative token
count for multi-module MTP) writes KV for the last ``R = max(0, P - 1)`` computed tokens
that the next chunk may overwrite (vLLM's ``num_reprefillable_tokens``), so a block is
registered only once its tokens are finalized::

    | finalized (registered when full) | R re-prefillable | new | lookahead |
                                        ^ num_computed_tokens - R

The rule differs by coordinator, as vLLM's (``get_num_cacheable_tokens``):

* one group (:func:`unitary_cacheable_tokens`): ``max(0, n - R)`` of ``n`` computed
  tokens. Block 16, R = 2: n = 32 registers 30 tokens, one block; n = 34 registers two.
* several groups (:func:`hybrid_cacheable_tokens`), ``A`` the cache alignment (the lcm
  of the block sizes, 1 with sub-block hits): a group without the EAGLE drop registers
  ``n // A * A`` (R plays no part); a group with it, when that is positive, registers
  ``min(n - R, (n - R) // A * A + block_size)`` (the drop looks one of its blocks past the
  aligned boundary), else nothing. A = 32, block 16, R = 2: n = 64 registers
  ``min(62, 32 + 16)`` = 48 tokens (three blocks) in a dropping group and 64 in the
  others; n = 20 registers nothing.

R = 0 leaves every rule as the coordinator's plain one (the callers only come here when
R > 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["cache_finalized", "hybrid_cacheable_tokens", "unitary_cacheable_tokens"]


class _Group(Protocol):
    @property
    def block_size(self) -> int: ...
    @property
    def drop_last_hit(self) -> bool: ...
    @property
    def hash_lookahead_tokens(self) -> int: ...
    def cache_blocks(self, request: Any, request_id: str, num_tokens: int) -> None: ...


class _Coordinator(Protocol):
    @property
    def pool(self) -> Any: ...
    def cacheable_tokens(self, num_tokens: int, m: Any) -> int: ...


def unitary_cacheable_tokens(num_computed_tokens: int, num_reprefillable_tokens: int) -> int:
    """The finalized prefix of ``num_computed_tokens`` (module docstring). O(1)."""
    return max(0, num_computed_tokens - num_reprefillable_tokens)


def hybrid_cacheable_tokens(num_computed_tokens: int, num_reprefillable_tokens: int,
                            alignment_tokens: int, group: _Group) -> int:
    """The prefix of ``num_computed_tokens`` that ``group`` registers on a hybrid
    coordinator aligned at ``alignment_tokens`` (module docstring). O(1)."""
    aligned = num_computed_tokens // alignment_tokens * alignment_tokens
    if not group.drop_last_hit or aligned <= 0:
        return aligned
    finalized = max(0, num_computed_tokens - num_reprefillable_tokens)
    return min(finalized, finalized // alignment_tokens * alignment_tokens + group.block_size)


def cache_finalized(coordinator: _Coordinator,
                    cache_plan: Sequence[tuple[_Group, int, Any, bool]],
                    request: Any, num_tokens: int) -> None:
    """Register what each caching group of ``cache_plan`` (the coordinator's
    ``(manager, block size, counts, caps itself)`` rows) may of ``num_tokens`` computed
    tokens: its ``coordinator.cacheable_tokens``, capped at the request's hashed tokens
    with hash lookahead unless the group caps itself (as ``Coordinator.cache_blocks``).
    O(groups) plus the blocks registered."""
    hashed = len(request.block_hashes) * coordinator.pool.hash_block_size
    capped = any(m.hash_lookahead_tokens for m, _, _, _ in cache_plan)
    for m, _, _, caps_itself in cache_plan:
        n = coordinator.cacheable_tokens(num_tokens, m)
        if capped and not caps_itself and hashed < n:
            n = hashed
        m.cache_blocks(request, request.request_id, n)
