"""Bounds: LRU achieved (pagedkv, pure-cache mode) <= Belady <= infinite ceiling on random
traces, Belady reaches the ceiling when the cache holds every block, and Belady is optimal
on tiny instances (checked against exhaustive search)."""

from __future__ import annotations

import itertools

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pagedkv.sim import SimRequest, Workload, run_pure_cache
from pagedkv.sim.bounds import access_sequence, belady_hits, infinite_cache_hits
from pagedkv.sim.pure_cache import unlimited_num_blocks


@st.composite
def traces(
    draw: st.DrawFn, max_requests: int = 14, max_new_ids: int = 4
) -> tuple[Workload, int]:
    """Prompts that extend a prefix of an earlier prompt with fresh ids (prefix sharing),
    source blocks of 4 tokens, replayed at block size 4 or 2 (derived sub-blocks)."""
    n = draw(st.integers(1, max_requests))
    next_id = 0
    prompts: list[list[int]] = []
    reqs = []
    for i in range(n):
        ids: list[int] = []
        share: bool = draw(st.booleans())
        if prompts and share:
            base: list[int] = draw(st.sampled_from(prompts))
            ids = base[: draw(st.integers(0, len(base)))]
        extra = draw(st.integers(0 if ids else 1, max_new_ids))
        ids = ids + list(range(next_id, next_id + extra))
        next_id += extra
        prompts.append(ids)
        length = (len(ids) - 1) * 4 + draw(st.integers(1, 4))
        reqs.append(SimRequest(request_id=f"r{i}", arrival_s=float(i),
                               num_prompt_tokens=length, num_output_tokens=1,
                               hash_ids=tuple(ids)))
    wl = Workload(name="random", requests=tuple(reqs), source_block_size=4)
    return wl, draw(st.sampled_from([2, 4]))


@settings(max_examples=150, deadline=None)
@given(traces(), st.integers(1, 12))
def test_lru_le_belady_le_infinite(trace: tuple[Workload, int], capacity_blocks: int) -> None:
    wl, bs = trace
    seq = access_sequence(wl, bs)
    inf = infinite_cache_hits(seq)
    bel = belady_hits(seq, capacity_blocks)
    lru = run_pure_cache(wl, block_size=bs, num_blocks=capacity_blocks + 1)
    assert sum(lru.hit_tokens) <= sum(bel.hit_tokens) <= sum(inf.hit_tokens)
    # the infinite ceiling is what an unlimited pagedkv achieves
    big = run_pure_cache(wl, block_size=bs, num_blocks=unlimited_num_blocks(seq))
    assert big.hit_tokens == inf.hit_tokens
    assert belady_hits(seq, len(set(seq.items))).hit_tokens == inf.hit_tokens


def _best_by_search(items: list[int], counted: list[bool], cap: int) -> int:
    """Most counted hits over every keep/evict choice (exhaustive; tiny inputs)."""
    states: dict[frozenset[int], int] = {frozenset(): 0}
    for x, c in zip(items, counted, strict=True):
        nxt: dict[frozenset[int], int] = {}
        for cache, hits in states.items():
            h = hits + (1 if c and x in cache else 0)
            pool = cache | {x}
            for k in range(min(cap, len(pool)) + 1):
                for keep in itertools.combinations(sorted(pool), k):
                    key = frozenset(keep)
                    if nxt.get(key, -1) < h:
                        nxt[key] = h
        states = nxt
    return max(states.values())


@settings(max_examples=400, deadline=None)
@given(traces(max_requests=6, max_new_ids=2), st.integers(1, 3))
def test_belady_is_optimal_on_tiny_traces(trace: tuple[Workload, int], cap: int) -> None:
    wl, bs = trace
    seq = access_sequence(wl, bs)
    assume(len(seq.items) <= 12)
    counted = []
    for i, q in enumerate(seq.num_queried):
        counted += [j < q for j in range(seq.starts[i + 1] - seq.starts[i])]
    bel = belady_hits(seq, cap)
    assert sum(bel.hit_tokens) // bs == _best_by_search(seq.items, counted, cap)
