"""Property: for any history, hit + missed tokens by reason == prompt tokens, the hit part
is exactly get_computed_blocks, and observing changes no block id."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from observe_support import HEADS, check_partition, full

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    HashExtras,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from pagedkv.observe import ObserveConfig, ObservedKVCacheManager, Reason

CONFIGS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((full(4),), {}),
    ((full(4),), {"drop_last_hit": True}),
    ((SlidingWindowSpec(block_size=4, sliding_window=8, **HEADS),), {}),
    ((full(8), SlidingWindowSpec(block_size=4, sliding_window=8, **HEADS)), {}),
    ((full(4), MambaSpec(block_size=8, state_bytes=64, cache_checkpoints=True)), {}),
    ((full(4), ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **HEADS)),
     {"drop_last_hit": True}),
    # Sub-block hits (an align-mode Mamba group, hashes at 2 tokens): hits inside blocks.
    ((full(8), MambaSpec(block_size=8, state_bytes=64)), {"hash_block_size": 2}),
]

PREFIXES = [list(range(100, 140)), list(range(200, 230)), list(range(100, 116)) + [7] * 20]


def prompt_strategy() -> st.SearchStrategy[tuple[list[int], str | None]]:
    return st.tuples(
        st.sampled_from(range(len(PREFIXES))),
        st.integers(1, 40),
        st.lists(st.integers(0, 3), max_size=12),
        st.sampled_from([None, None, "s1", "s2"]),
    ).map(lambda t: (PREFIXES[t[0]][: t[1]] + t[2], t[3]))


@settings(max_examples=60, deadline=None)
@given(config=st.sampled_from(range(len(CONFIGS))), data=st.data())
def test_explanations_partition_the_prompt_and_match_the_hit(config: int, data: Any) -> None:
    groups, options = CONFIGS[config]
    cfg = CacheConfig(groups=groups, num_blocks=24, max_model_len=512, **options)
    plain = KVCacheManager(cfg)
    mgr = ObservedKVCacheManager(cfg, ObserveConfig(ghost_entries=16, residency_sample_every=3))
    live: dict[str, tuple[Request, Request]] = {}
    for step in range(data.draw(st.integers(1, 14))):
        mgr.observe.begin_step(step)
        op = data.draw(st.sampled_from(["admit", "admit", "free", "probe"]))
        if op == "free" and live:
            rid = data.draw(st.sampled_from(sorted(live)))
            a, b = live.pop(rid)
            plain.free(a)
            mgr.free(b)
            continue
        tokens, salt = data.draw(prompt_strategy())
        extras = HashExtras(cache_salt=salt) if salt else None
        rid = f"r{step}"
        a = plain.new_request(rid, tokens, hash_extras=extras)
        b = mgr.new_request(rid, tokens, hash_extras=extras)
        e = mgr.observe.explain_lookup(b)
        check_partition(e)
        assert sum(s.num_tokens for s in e.segments) == len(tokens)
        hit_a = plain.get_computed_blocks(a)
        hit_b = mgr.get_computed_blocks(b)
        assert (hit_a.block_ids, hit_a.num_computed_tokens) == (
            hit_b.block_ids, hit_b.num_computed_tokens)
        assert e.num_hit_tokens == hit_b.num_computed_tokens
        assert [list(g.hit_block_ids) for g in e.groups] == [list(t) for t in hit_b.block_ids]
        for g, ge in enumerate(e.groups):
            positions = [x.position for x in ge.blocks()]
            assert positions == list(range(len(positions))), (g, positions)
            for x in ge.blocks():
                assert (x.reason is Reason.HIT) == (x.position < len(ge.hit_block_ids))
        if op == "admit":
            n = len(tokens) - hit_a.num_computed_tokens
            out_a = plain.allocate_slots(a, n, new_computed_blocks=hit_a)
            out_b = mgr.allocate_slots(b, n, new_computed_blocks=hit_b)
            assert out_a == out_b
            if out_a is not None:
                a.num_computed_tokens = b.num_computed_tokens = len(tokens)
                live[rid] = (a, b)
        mgr.check_invariants()
        assert plain.debug_state()["pool"] == mgr.debug_state()["pool"]
    stats = mgr.observe.make_miss_stats()
    assert stats.queries == stats.hits + sum(stats.missed_tokens.values())
    assert stats.preempted_queries == 0
