"""The engine starts every scheduler step with ``manager.new_step_starts()``: a Mamba
group in vLLM's align mode refuses a hit on a state registered in the same step, and
only that call lets the state be hit in a later step."""

from __future__ import annotations

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager, MambaSpec
from pagedkv.events.config import KVEventsConfig
from pagedkv.sim import EngineSimulator, SchedulerConfig, agent_loops
from pagedkv.sim.scheduler import workload_max_len
from pagedkv.sim.workloads import Workload

FULL = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
MAMBA = MambaSpec(block_size=16, state_bytes=4096, page_size_padded_bytes=FULL.page_size_bytes)


def _hybrid(workload: Workload, *, block_size: int, num_blocks: int,
            kv_events: KVEventsConfig | None = None) -> KVCacheManager:
    return KVCacheManager(CacheConfig(
        groups=(FULL, MAMBA), num_blocks=num_blocks,
        max_model_len=workload_max_len(workload, block_size), kv_events=kv_events))


def test_mamba_state_registered_in_one_step_is_hit_in_a_later_step() -> None:
    # agent_loops: each step of an agent re-sends its whole context, so a later request
    # can hit the Mamba state its predecessor registered (several steps earlier). Without
    # new_step_starts() every registered state stays "this step's" and no hit happens.
    wl = agent_loops(num_agents=2, num_steps=3)
    sim = EngineSimulator(wl, block_size=16, num_blocks=4000,
                          config=SchedulerConfig(check_invariants_every_step=True),
                          manager_factory=_hybrid)
    for i, r in enumerate(wl.requests):
        if r.parent is None:
            sim.submit(i, at_s=r.arrival_s)
    for _ in range(20_000):  # bounded: a refused hit must fail the test, not hang it
        if not sim.has_work:
            break
        sim.step()
    assert not sim.has_work
    res = sim.result()
    assert res.num_steps > 1
    assert sum(res.hit_tokens) > 0
    later = [h for i, h in enumerate(res.hit_tokens) if wl.requests[i].parent is not None]
    assert later and all(h > 0 for h in later)
