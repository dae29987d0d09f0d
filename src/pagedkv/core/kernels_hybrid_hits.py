"""A coordinator's whole lookup as one kernel: every group's hit and, for several groups,
the fixed point over them (pure form; the compiled twin is ``_ccore.HybridHit``,
``pagedkv/_csrc/ccore_hybrid_fixed_point.h``).

:func:`hybrid_hit` takes a *plan*, built once per coordinator
(:func:`pagedkv.core.lookup_plan.hit_plan`), and returns the lookup
``(block_hashes, max_length) -> (per-group block ids, hit tokens)``: what
:meth:`HybridCoordinator.find_longest_cache_hit
<pagedkv.core.coordinator_hybrid.HybridCoordinator.find_longest_cache_hit>` (no group
dropping its last hit block) or :meth:`UnitaryCoordinator.find_longest_cache_hit
<pagedkv.core.coordinator_simple.UnitaryCoordinator.find_longest_cache_hit>` returns,
block for block, with each group's rule inline instead of a method call per group and
pass.

A plan is ``(num_groups, lcm, unitary, full, others)``: ``unitary`` (one group, asked
once, no rounding) or the fixed point with lengths rounded down to ``lcm``; ``full`` and
``others`` the groups looked up once (prefix-closed hits) and the ones asked again in each
pass, in lookup order, each an entry ``(group, kind, index, stride, block_size, a, b)``:

=================  ===========================================================
``KIND_PREFIX``    full attention: the run of cached blocks from block 0
``KIND_WINDOW``    sliding window: ``a`` the run of blocks a hit ends with
``KIND_CHUNK``     chunked local: ``a`` the chunk's tokens, ``b`` its blocks
``KIND_STATE``     Mamba align: ``a`` the hit alignment in tokens
=================  ===========================================================

``index`` is the group's dict (hash -> block) and block ``i``'s hash
``block_hashes[(i + 1) * stride - 1]``. Groups in neither list get ``[]``.

>>> index = {b"a": 4, b"b": 5}
>>> find = hybrid_hit((1, 1, True, ((0, KIND_PREFIX, index, 1, 4, 0, 0),), ()))
>>> find([b"a", b"b", b"c"], 11)
(([4, 5],), 8)
>>> window = {b"b": 7}
>>> find = hybrid_hit((2, 4, False, ((0, KIND_PREFIX, index, 1, 4, 0, 0),),
...                                  ((1, KIND_WINDOW, window, 1, 4, 1, 0),)))
>>> find([b"a", b"b", b"c"], 11)
(([4, 5], [0, 7]), 8)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pagedkv.core.kernels_hybrid import chunk_hit, state_hit, window_hit

__all__ = ["KIND_CHUNK", "KIND_PREFIX", "KIND_STATE", "KIND_WINDOW", "HitFinder",
           "group_hit", "hybrid_hit", "lookup_request"]

KIND_PREFIX, KIND_WINDOW, KIND_CHUNK, KIND_STATE = 0, 1, 2, 3

#: ``(block_hashes, max_length) -> (per-group block ids, hit tokens)``.
HitFinder = Callable[[list[bytes], int], tuple[tuple[list[int], ...], int]]


def group_hit(entry: Sequence[Any], block_hashes: list[bytes], length: int) -> list[int]:
    """One group's hit within ``length`` tokens by its kind's rule (module docstring): its
    manager's ``find_longest_cache_hit``, no last block dropped. No state change."""
    _g, kind, index, k, bs, a, b = entry
    n = min(length // bs, len(block_hashes) // k)
    if kind == KIND_PREFIX:
        get = index.get
        out: list[int] = []
        for i in range(k - 1, n * k, k):
            blk = get(block_hashes[i])
            if blk is None:
                break
            out.append(blk)
        return out
    if kind == KIND_WINDOW:
        return window_hit(index, block_hashes, k, n, a)
    if kind == KIND_CHUNK:
        return chunk_hit(index, block_hashes, k, length // a * b, n)
    return state_hit(index, block_hashes, k, n, bs, a)


def hybrid_hit(plan: Sequence[Any]) -> HitFinder:
    """The lookup of ``plan`` (module docstring) as a function of ``(block_hashes,
    max_length)``; it changes no state. O(one scan per full group, one per other group
    and pass)."""
    num_groups, lcm, unitary, full, others = plan
    if unitary:
        entry: Sequence[Any] = (*full, *others)[0]
        bs = entry[4]

        def one_group(block_hashes: list[bytes], max_length: int
                      ) -> tuple[tuple[list[int], ...], int]:
            if type(block_hashes) is not list:
                block_hashes = list(block_hashes)
            blocks = group_hit(entry, block_hashes, max_length)
            return (blocks,), len(blocks) * bs
        return one_group

    def fixed_point(block_hashes: list[bytes], max_length: int
                    ) -> tuple[tuple[list[int], ...], int]:
        if type(block_hashes) is not list:
            block_hashes = list(block_hashes)
        length = max_length // lcm * lcm
        hits: list[list[int]] = [[] for _ in range(num_groups)]
        for entry in full:
            hit = hits[entry[0]] = group_hit(entry, block_hashes, length)
            got = len(hit) * entry[4]
            if got < length:
                length = got // lcm * lcm
        changed = True
        while changed and length:
            changed = False
            for entry in others:
                hit = hits[entry[0]] = group_hit(entry, block_hashes, length)
                got = len(hit) * entry[4]
                if got < length:
                    changed = True
                    length = got // lcm * lcm
        if not length:
            return tuple([] for _ in range(num_groups)), 0
        for entry in full:
            del hits[entry[0]][length // entry[4]:]
        return tuple(hits), length
    return fixed_point


#: A hit of every field, built without the hit type's ``__new__`` Python frame.
_new_hit = tuple.__new__


def lookup_request(find: HitFinder | Callable[[list[bytes], int], Any], mgr: Any,
                   request: Any, num_tokens: int) -> Any:
    """A façade's lookup of ``request`` (``num_tokens`` tokens, checked by the caller)
    after its checks: ``find``'s hit within ``num_tokens - 1`` tokens (a coordinator's
    ``find_longest_cache_hit``; ``None``, caching off: ``mgr._empty_hit``), counted in
    ``mgr.lookups`` (a preempted request's in the preempted counters) and a fresh one in
    ``mgr.hit_rate_window``, returned as a hit of ``mgr._empty_hit``'s type: block ids,
    count, ``mgr.issuer_token``, the request's id, the index generation of ``mgr.pool``
    and the fingerprint ``(count, *map(tuple, block ids))``. Mutates the statistics only.
    The compiled twin: ``_ccore.lookup_request``."""
    found = find(request.block_hashes, num_tokens - 1)
    if found is None:  # caching off: no lookup, nothing counted
        return mgr._empty_hit
    blocks, num_hit = found
    lookups = mgr.lookups
    if request.num_preemptions:
        lookups.preempted_requests += 1
        lookups.preempted_queries += num_tokens
        lookups.preempted_hits += num_hit
    else:
        lookups.requests += 1
        lookups.queries += num_tokens
        lookups.hits += num_hit
        mgr.hit_rate_window.observe(num_tokens, num_hit)
    return _new_hit(type(mgr._empty_hit), (
        blocks, num_hit, mgr.issuer_token, request.request_id,
        mgr.pool.prefix.index_generation, (num_hit, *map(tuple, blocks)), None))
