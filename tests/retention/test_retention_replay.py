"""The simulator-facing replay: with the LRU policy it is the simulator's pure-cache mode
exactly; each policy changes what it should on a workload built to show it."""

from __future__ import annotations

from pagedkv.sim import SimRequest, Workload, run_pure_cache, system_prompts
from pagedkv.sim.retention_replay import (
    LRU,
    PinPopularPrefixes,
    PopularityPriority,
    TenantQuota,
    replay_pure_cache,
)


def test_lru_policy_is_the_simulators_pure_cache_mode() -> None:
    w = system_prompts(num_groups=3, questions_per_group=6, system_tokens=96,
                       question_tokens=40, output_tokens=4)
    for num_blocks in (12, 20, 60):
        ours = replay_pure_cache(w, block_size=16, num_blocks=num_blocks, policy=LRU(),
                                 check_invariants=True)
        sims = run_pure_cache(w, block_size=16, num_blocks=num_blocks)
        assert ours.hit_tokens == sims.hit_tokens
        assert ours.evicted_blocks == sims.evicted_blocks


def test_pinning_popular_prefixes_beats_lru_when_prompts_thrash() -> None:
    w = system_prompts(num_groups=4, questions_per_group=8, system_tokens=160,
                       question_tokens=32, output_tokens=4)
    # 4 x 10 system blocks + questions do not fit 30 blocks: LRU never hits.
    lru = replay_pure_cache(w, block_size=16, num_blocks=31, policy=LRU())
    pin = replay_pure_cache(w, block_size=16, num_blocks=31, policy=PinPopularPrefixes(),
                            check_invariants=True)
    assert lru.hit_rate() == 0.0
    assert pin.hit_rate() > 0.1


def chat_and_batch(num_docs: int = 3, doc_tokens: int = 96) -> Workload:
    """Chat requests sharing a 4-block prefix, each followed by one-off batch documents
    that flush a 13-block LRU cache."""
    reqs = []
    for i in range(30):
        reqs.append(SimRequest(request_id=f"chat/{i}", arrival_s=float(len(reqs)),
                               num_prompt_tokens=80, num_output_tokens=1,
                               prompt_token_ids=tuple([7] * 64 + [1000 + i] * 16)))
        for k in range(num_docs):
            reqs.append(SimRequest(request_id=f"batch/{i}-{k}", arrival_s=float(len(reqs)),
                                   num_prompt_tokens=doc_tokens, num_output_tokens=1,
                                   prompt_token_ids=tuple([5000 + 10 * i + k] * doc_tokens)))
    return Workload(name="chat-and-batch", requests=tuple(reqs))


def test_popularity_priority_keeps_shared_prefixes_over_one_offs() -> None:
    w = chat_and_batch()
    lru = replay_pure_cache(w, block_size=16, num_blocks=14, policy=LRU())
    pop = replay_pure_cache(w, block_size=16, num_blocks=14, policy=PopularityPriority(),
                            check_invariants=True)
    assert lru.hit_rate() == 0.0
    assert pop.hit_rate() > 0.1


def test_tenant_quota_stops_a_flooding_tenant() -> None:
    w = chat_and_batch()
    lru = replay_pure_cache(w, block_size=16, num_blocks=14, policy=LRU())
    quota = replay_pure_cache(w, block_size=16, num_blocks=14,
                              policy=TenantQuota(fractions={"batch": 0.2}),
                              check_invariants=True)
    assert lru.hit_rate() == 0.0
    assert quota.hit_rate() > 0.1
