"""Generators: with a cache that holds everything, the measured hit rate equals the
analytic ideal exactly, in both modes and at several block sizes; with a small cache it
falls below."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pagedkv.sim import (
    EngineSimulator,
    SchedulerConfig,
    Workload,
    agent_loops,
    multi_turn,
    run_pure_cache,
    system_prompts,
)
from pagedkv.sim.bounds import access_sequence, infinite_cache_hits
from pagedkv.sim.scheduler import request_blocks_needed

SMALL = {
    "system-prompts": lambda: system_prompts(
        num_groups=3, questions_per_group=5, system_tokens=100, question_tokens=21,
        output_tokens=7),
    "multi-turn": lambda: multi_turn(
        num_conversations=4, num_turns=4, system_tokens=50, user_tokens=13, output_tokens=9,
        think_s=0.5),
    "agent": lambda: agent_loops(
        num_agents=3, num_steps=5, tool_prefix_tokens=200, task_tokens=30,
        observation_tokens=17, action_tokens=11),
}


def enough_blocks(wl: Workload, block_size: int) -> int:
    """Every block any request ever holds, plus the null block: nothing is ever evicted."""
    return sum(request_blocks_needed(r, block_size) for r in wl.requests) + 2


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_pure_cache_hits_ideal(name: str, block_size: int) -> None:
    wl: Workload = SMALL[name]()
    res = run_pure_cache(wl, block_size=block_size, num_blocks=enough_blocks(wl, block_size),
                         check_invariants=True)
    hit, query = res.totals()
    ideal = wl.ideal_hit_rate(block_size, "pure-cache")
    assert ideal is not None and 0 < ideal < 1
    assert Fraction(hit, query) == Fraction(ideal).limit_denominator(10**9)
    assert infinite_cache_hits(access_sequence(wl, block_size)).hit_rate() == pytest.approx(
        ideal, abs=1e-12)


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("block_size", [4, 16])
def test_engine_hits_ideal(name: str, block_size: int) -> None:
    wl = SMALL[name]()
    cfg = SchedulerConfig(check_invariants_every_step=True)
    blocks = enough_blocks(wl, block_size)
    res = EngineSimulator(wl, block_size=block_size, num_blocks=blocks, config=cfg).run()
    assert res.evicted_blocks == 0
    assert res.preemptions == 0
    assert all(t is not None for t in res.finish_s)
    assert res.hit_rate() == pytest.approx(wl.ideal_hit_rate(block_size, "engine"), abs=1e-12)


def test_engine_ideal_counts_cached_replies() -> None:
    # Multi-turn: the reply's blocks, cached while decoding, reappear in the next prompt.
    wl = SMALL["multi-turn"]()
    engine, pure = wl.ideal_hit_rate(4, "engine"), wl.ideal_hit_rate(4, "pure-cache")
    assert engine is not None and pure is not None and engine > pure


def test_worked_ideal_figure() -> None:
    # The docstring's example: 4*63*1536 / (4*64*1736).
    assert system_prompts().ideal_hit_rate(16, "engine") == pytest.approx(0.870967, abs=1e-6)


def test_small_cache_falls_below_ideal_and_preempts() -> None:
    # 4 conversations start at once: turn 0 is 63 prompt + 9 output tokens = 5 blocks of
    # 16, the first 3 shared (the 50-token system prompt). 11 usable blocks cannot hold
    # the four turn-0s growing into their 5th block together.
    wl = SMALL["multi-turn"]()
    cfg = SchedulerConfig(arrivals="at-once", check_invariants_every_step=True)
    res = EngineSimulator(wl, block_size=16, num_blocks=12, config=cfg).run()
    assert res.preemptions > 0
    assert res.evicted_blocks > 0
    assert all(t is not None for t in res.finish_s)  # everything still completes
    ideal = wl.ideal_hit_rate(16, "engine")
    assert ideal is not None and res.hit_rate() < ideal
