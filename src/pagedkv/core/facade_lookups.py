"""The façade's lookups: the prefix-cache probes an engine makes before admitting a
request, and the statistics they keep.

Functions taking the manager; :class:`pagedkv.KVCacheManager` holds each as its method of
the same name (documented here). None changes the pool: a hit's blocks are claimed only by
``allocate_slots`` (:mod:`pagedkv.core.facade_allocation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pagedkv.core import cached_tokens, validation
from pagedkv.core.coordinator import ComputedBlocks
from pagedkv.core.group_hits import find_hit_per_group
from pagedkv.core.request import RequestLike
from pagedkv.errors import InvalidArgumentError, InvalidHitError

if TYPE_CHECKING:
    from pagedkv.core.facade_state import Facade


def get_computed_blocks(self: Facade, request: RequestLike) -> ComputedBlocks:
    """The longest cached prefix of ``request`` valid for every group.

    At most ``num_tokens - 1`` tokens hit, so a fully cached prompt still recomputes
    its last token (the engine needs its logits); the hit is block aligned. Records
    lookup statistics (preempted re-lookups apart). Does not change the pool: the hit
    blocks are claimed only by :meth:`allocate_slots`.

    Raises:
        InvalidArgumentError: not a request, or longer than ``max_model_len``.
    """
    try:
        num_tokens = request.num_tokens
    except AttributeError:
        validation.check_lookup(self, request)
        raise
    if num_tokens > self.max_model_len:
        validation.check_lookup(self, request)
    # the coordinator's lookup, counted and built (kernels_hybrid_hits.lookup_request)
    return self.coordinator.lookup_request(  # type: ignore[attr-defined,no-any-return]
        self, request, num_tokens)


def lookup_with_components(self: Facade, request: RequestLike) -> ComputedBlocks:
    """:meth:`get_computed_blocks`, then each component's ``after_lookup``."""
    hit = get_computed_blocks(self, request)
    for after in self._hooks.after_lookup:
        after(request, hit)
    return hit


def lookup_prefix(self: Facade, request: RequestLike, max_hit_tokens: int | None = None, *,
                  record_stats: bool = True) -> ComputedBlocks:
    """:meth:`get_computed_blocks` bounded at ``max_hit_tokens`` (default
    ``num_tokens - 1``; an engine may lower it, e.g. to replay a window's tokens).
    ``record_stats=False`` leaves the lookup statistics to :meth:`record_lookup`, for
    engines that count a request once, when it is admitted (vLLM 0.33). Components'
    ``after_lookup`` hooks run as for :meth:`get_computed_blocks`.

    Raises:
        InvalidArgumentError: not a request, longer than ``max_model_len``, or
            ``max_hit_tokens`` not an int in ``[0, num_tokens]``.
    """
    limit = lookup_limit(self, request, max_hit_tokens)
    found = self.coordinator.find_longest_cache_hit(request.block_hashes, limit)
    if found is None:
        return self._empty_hit
    blocks, num_hit = found
    if record_stats:
        record_lookup(self, request, num_hit)
    hit = ComputedBlocks(blocks, num_hit, self.issuer_token, request.request_id,
                         self.pool.prefix.index_generation, (num_hit, *map(tuple, blocks)))
    for after in self._hooks.after_lookup:
        after(request, hit)
    return hit


def lookup_limit(self: Facade, request: RequestLike, max_hit_tokens: int | None) -> int:
    """The checked request and the longest hit a lookup may return (default
    ``num_tokens - 1``); raises as the lookups document."""
    validation.check_lookup(self, request)
    num_tokens = request.num_tokens
    limit = num_tokens - 1 if max_hit_tokens is None else validation.check_count(
        "max_hit_tokens", max_hit_tokens)
    if limit > num_tokens:
        raise InvalidArgumentError(
            f"max_hit_tokens={limit} is more than the request's {num_tokens} tokens")
    return limit


def lookup_prefix_per_group(self: Facade, request: RequestLike,
                            max_hit_tokens: int | None = None, *,
                            reference_group: int = 0) -> ComputedBlocks:
    """Each group's own longest hit within ``max_hit_tokens`` (default
    ``num_tokens - 1``), the groups looked up independently (vLLM 0.33's
    ``find_longest_cache_hit_per_group``, :mod:`pagedkv.core.group_hits`): under
    block pressure a hybrid model's groups hit at different depths. The result's
    ``group_tokens`` holds each group's length and ``num_computed_tokens`` the
    ``reference_group``'s (a KV connector restoring the other groups' state adopts
    that many tokens). :meth:`allocate_slots` adopts it only when no group's hit is
    longer than the reference's (``InvalidHitError`` otherwise). Records no lookup
    statistics (:meth:`record_lookup`) and runs no ``after_lookup`` hook: the groups
    do not agree on it. No state change.

    Raises:
        InvalidArgumentError: not a request, longer than ``max_model_len``,
            ``max_hit_tokens`` not an int in ``[0, num_tokens]``, or
            ``reference_group`` not a group index.
    """
    limit = lookup_limit(self, request, max_hit_tokens)
    groups = len(self.config.groups)
    if type(reference_group) is not int or not 0 <= reference_group < groups:
        raise InvalidArgumentError(
            f"reference_group must be a group index in [0, {groups}), got "
            f"{reference_group!r}")
    if not self.config.enable_caching:
        return self._empty_hit
    blocks, lengths = find_hit_per_group(self.coordinator, request.block_hashes,
                                         max(limit, 0))
    n = lengths[reference_group]
    return ComputedBlocks(blocks, n, self.issuer_token, request.request_id,
                          self.pool.prefix.index_generation, (n, *map(tuple, blocks)), lengths)


def record_lookup(self: Facade, request: RequestLike, num_hit_tokens: int) -> None:
    """Count one lookup of ``request`` that hit ``num_hit_tokens`` tokens in the
    prefix-cache statistics (:meth:`make_prefix_cache_stats`, the hit-rate window),
    as :meth:`get_computed_blocks` does itself (preempted requests apart).

    Raises:
        InvalidArgumentError: not a request, or a count outside ``[0, num_tokens]``.
    """
    validation.check_lookup(self, request)
    num_tokens = request.num_tokens
    hits = validation.check_count("num_hit_tokens", num_hit_tokens)
    if hits > num_tokens:
        raise InvalidArgumentError(
            f"num_hit_tokens={hits} is more than the request's {num_tokens} tokens")
    count_lookup(self, request, num_tokens, hits)


def count_lookup(self: Facade, request: RequestLike, num_tokens: int, hits: int) -> None:
    """The prefix-cache statistics of one checked lookup (preempted requests apart)."""
    lookups = self.lookups
    if request.num_preemptions:
        lookups.preempted_requests += 1
        lookups.preempted_queries += num_tokens
        lookups.preempted_hits += hits
    else:
        lookups.requests += 1
        lookups.queries += num_tokens
        lookups.hits += hits
        self.hit_rate_window.observe(num_tokens, hits)


def estimate_cached_tokens(self: Facade, request: RequestLike) -> int:
    """Tokens of ``request`` already in registered blocks: per prefix-cached group the
    tokens up to its last registered block, the minimum over groups (vLLM's method of
    this name; see :mod:`pagedkv.core.cached_tokens`). 0 for a request holding no blocks.

    Reads only: no statistics, no LRU touch, no events (``debug_state()`` unchanged).

    Raises:
        InvalidArgumentError: not a request.
    """
    validation.check_estimate(request)
    return cached_tokens.estimate_cached_tokens(self.managers, self.pool, request)


def truncate_computed_blocks(self: Facade, hit: ComputedBlocks,
                             num_computed_tokens: int) -> ComputedBlocks:
    """``hit`` cut at ``num_computed_tokens`` (vLLM 0.33's method): each group keeps
    its first ``num_computed_tokens // block_size`` blocks (see
    ``Coordinator.truncate``). Nothing is claimed; the result is checked like any hit
    when adopted (a group left without the blocks its next token reads raises
    :class:`~pagedkv.errors.InvalidHitError` then).

    Raises:
        InvalidHitError: ``hit`` was not issued by this manager.
        InvalidArgumentError: not an int in ``[0, hit tokens]``, or not a multiple of
            every caching group's block size.
    """
    if not isinstance(hit, ComputedBlocks) or hit.issuer is not self.issuer_token:
        raise InvalidHitError(
            "truncate_computed_blocks takes a hit get_computed_blocks returned on this "
            f"manager, got {type(hit).__name__}")
    n = validation.check_count("num_computed_tokens", num_computed_tokens)
    if n > hit.num_computed_tokens:
        raise InvalidArgumentError(
            f"cannot truncate a {hit.num_computed_tokens}-token hit to {n} tokens; "
            "truncation only shortens a hit")
    blocks = self.coordinator.truncate(hit.block_ids, n)
    return ComputedBlocks(blocks, n, self.issuer_token, hit.request_id)


def get_cached_block(self: Facade, block_hash: bytes,
                     groups: Sequence[int]) -> list[int] | None:
    """The cached block registered under ``block_hash`` in each of ``groups``, or
    ``None`` when any group has none (vLLM 0.33's ``BlockPool.get_cached_block``).
    Reads only: no LRU touch, no statistics.

    Raises:
        InvalidArgumentError: not bytes, or a group that does not exist.
    """
    if type(block_hash) is not bytes:
        raise InvalidArgumentError(f"block_hash must be bytes, got {block_hash!r}")
    out: list[int] = []
    index = self.pool.index
    for g in groups:
        if type(g) is not int or not 0 <= g < len(index):
            raise InvalidArgumentError(
                f"group {g!r} does not exist; this manager has {len(index)} groups")
        b = index[g].get(block_hash)
        if b is None:
            return None
        out.append(b)
    return out
