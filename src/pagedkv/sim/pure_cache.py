"""Pure-cache mode: the setting in which hit-rate-vs-capacity curves are drawn.

Each request, in workload order, is looked up (``get_computed_blocks``), its whole prompt
is "computed" in one ``allocate_slots`` call — which stores its full prompt blocks in the
prefix index — and it is freed at once. No decode, no concurrency, no clock: the only
thing that varies with capacity is which blocks the manager's eviction (LRU, deepest
block of a chain first) has kept.

A prompt longer than the whole cache stores only its first ``num_blocks - 1`` blocks (it
could not be held at once); its lookup is still counted in full, and seen again it hits
all of them, under both semantics (as the reference simulator's LRU, which keeps a
prompt's first ``capacity`` entries).

Worked case, block size 4, 3 usable blocks (``num_blocks=4``): prompt A = blocks
``a1 a2 a3`` + 2 tokens (14 tokens), then B = ``a1 a2 b3`` + 1 token (13 tokens).
A misses (0 of 14 tokens hit) and, longer than the cache, stores ``a1 a2 a3`` only; freed
tail first, the LRU order is a3, a2, a1. B hits ``a1 a2`` (8 of 13 tokens), stores ``b3``
(truncated to 12 tokens) and so evicts ``a3``, the front of the queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagedkv import InvalidArgumentError, KVCacheManager
from pagedkv.sim.bounds import (
    AccessSequence,
    BoundResult,
    access_sequence,
    belady_hits,
    infinite_cache_hits,
)
from pagedkv.sim.results import SimResult
from pagedkv.sim.scheduler import ManagerFactory, build_manager, make_request
from pagedkv.sim.semantics import Semantics, get_semantics
from pagedkv.sim.workloads import Workload

__all__ = [
    "PureCacheResult",
    "SweepRow",
    "capacity_sweep",
    "run_pure_cache",
    "unlimited_num_blocks",
]

PureCacheResult = SimResult


def run_pure_cache(
    workload: Workload,
    *,
    block_size: int,
    num_blocks: int,
    semantics: str | Semantics = "vllm",
    progress: Callable[[int, int], None] | None = None,
    check_invariants: bool = False,
    manager_factory: ManagerFactory | None = None,
) -> SimResult:
    """Replay ``workload`` in pure-cache mode on a fresh manager of ``num_blocks`` blocks.

    ``semantics``: "vllm" (default) or "reference" (:mod:`pagedkv.sim.semantics`);
    ``hit_tokens`` are the tokens credited. ``lookup_time_s`` of request ``i`` is its
    nominal arrival time. ``check_invariants`` walks the manager's state after every
    request (slow; for tests). ``manager_factory`` builds the manager (default: one
    full-attention group, :func:`~pagedkv.sim.scheduler.build_manager`).

    Raises:
        InvalidArgumentError: a block size the workload cannot be replayed at.
    """
    wall0 = time.perf_counter()
    sem = get_semantics(semantics)
    sem.check(workload, block_size)
    factory = manager_factory or build_manager
    mgr = factory(workload, block_size=block_size, num_blocks=num_blocks, kv_events=None)
    reqs = workload.requests
    n = len(reqs)
    max_tokens = _max_tokens(mgr, num_blocks - 1)
    res = SimResult(
        mode="pure-cache", workload=workload.name, block_size=block_size,
        num_blocks=num_blocks, query_tokens=[r.num_prompt_tokens for r in reqs],
        hit_tokens=[0] * n, lookup_time_s=[r.arrival_s for r in reqs],
    )
    hits = res.hit_tokens
    reference = sem.name != "vllm"
    for i in range(n):
        num = reqs[i].num_prompt_tokens
        if reference:
            req = make_request(mgr, workload, i, block_size,
                               num_tokens=sem.manager_tokens(num, block_size),
                               num_hashed_blocks=sem.num_stored_blocks(num, block_size))
        else:
            req = make_request(mgr, workload, i, block_size)
        hits[i] = sem.replay(mgr, req, req.num_tokens if not reference else num, block_size,
                             max_tokens)
        if check_invariants:
            mgr.check_invariants()
        if progress is not None and i % 512 == 0:
            progress(i, n)
    if progress is not None:
        progress(n, n)
    res.evicted_blocks = mgr.num_evicted_blocks
    res.wall_s = time.perf_counter() - wall0
    return res


def _max_tokens(mgr: KVCacheManager, capacity_blocks: int) -> int:
    """The longest prompt the manager's groups can hold at once in ``capacity_blocks``."""
    groups = mgr.config.groups

    def need(tokens: int) -> int:
        return sum(g.max_admission_blocks(tokens) for g in groups)

    lo, hi = 0, capacity_blocks * max(g.block_size for g in groups)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= capacity_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRow:
    """Hit rates at one capacity: LRU (pagedkv in pure-cache mode), the Belady bound and
    the infinite ceiling, over all requests and over those after the warm-up."""

    capacity_tokens: int | None
    num_blocks: int
    lru: float
    lru_after_warmup: float
    belady: float
    belady_after_warmup: float
    infinite: float
    infinite_after_warmup: float
    evicted_blocks: int


def unlimited_num_blocks(seq: AccessSequence) -> int:
    """A pool size at which pure-cache mode never evicts: every distinct block plus the
    largest prompt (its partial block included) plus the null block."""
    largest = max(
        (seq.starts[i + 1] - seq.starts[i] for i in range(seq.num_requests)), default=0
    )
    seen = bytearray(seq.num_ids)
    for x in seq.items:
        seen[x] = 1
    return sum(seen) + largest + 2


def capacity_sweep(
    workload: Workload,
    *,
    block_size: int,
    capacities_tokens: Sequence[int | None],
    warmup_fraction: float = 0.5,
    semantics: str = "vllm",
    progress: Callable[[int, int], None] | None = None,
) -> list[SweepRow]:
    """Pure-cache hit rates at each capacity in tokens (None = unlimited; a capacity holds
    ``floor(tokens / block_size)`` blocks), one point after the other
    (:func:`pagedkv.sim.parallel.sweep_rows` runs them in parallel). "After warm-up"
    counts only requests from ``floor(n * warmup_fraction)`` on.

    Raises:
        InvalidArgumentError: a block size the workload cannot be replayed at, or a
            capacity below one block.
    """
    seq = access_sequence(workload, block_size, semantics=semantics)
    inf = infinite_cache_hits(seq)
    rows: list[SweepRow] = []
    for step, cap in enumerate(capacities_tokens):
        if progress is not None:
            progress(step, len(capacities_tokens))
        rows.append(sweep_point(workload, seq, inf, cap, warmup_fraction=warmup_fraction,
                                semantics=semantics))
    if progress is not None:
        progress(len(capacities_tokens), len(capacities_tokens))
    return rows


def sweep_point(
    workload: Workload,
    seq: AccessSequence,
    infinite: BoundResult,
    capacity_tokens: int | None,
    *,
    warmup_fraction: float,
    semantics: str,
) -> SweepRow:
    """One capacity of a sweep: LRU (a pure-cache replay), Belady and infinite."""
    block_size = seq.block_size
    start = int(len(workload.requests) * warmup_fraction)
    if capacity_tokens is None:
        num_blocks = unlimited_num_blocks(seq)
    else:
        if capacity_tokens < block_size:
            raise InvalidArgumentError(
                f"capacity {capacity_tokens} tokens is less than one block of {block_size} "
                "tokens")
        num_blocks = capacity_tokens // block_size + 1
    lru = run_pure_cache(workload, block_size=block_size, num_blocks=num_blocks,
                         semantics=semantics)
    bel = infinite if capacity_tokens is None else belady_hits(seq, num_blocks - 1)
    inf = infinite
    return SweepRow(
        capacity_tokens=capacity_tokens, num_blocks=num_blocks,
        lru=lru.hit_rate(), lru_after_warmup=lru.hit_rate(start),
        belady=bel.hit_rate(), belady_after_warmup=bel.hit_rate(start),
        infinite=inf.hit_rate(), infinite_after_warmup=inf.hit_rate(start),
        evicted_blocks=lru.evicted_blocks,
    )
