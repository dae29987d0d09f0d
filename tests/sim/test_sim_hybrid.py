"""Hybrid models are simulated with every planned group. A sliding-window + full model
differs from the one-group approximation (a full-attention group holding the plan's token
slots) in the direction the rules predict; the report names the groups."""

from __future__ import annotations

from pagedkv import FullAttentionSpec, SlidingWindowSpec
from pagedkv.planner import plan_kv_cache
from pagedkv.sim import EngineSimulator, SchedulerConfig, SimConfig, agent_loops, run
from pagedkv.sim.models import CapacityPlan, plan_capacity, plan_factory
from pagedkv.sim.pure_cache import run_pure_cache
from pagedkv.sim.report import render_text

FULL = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
SWA = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2,
                        sliding_window=128)


def _plan() -> tuple[CapacityPlan, int]:
    """A SWA + full plan of 1,201 blocks, and the approximation's block count."""
    plan = plan_kv_cache({"l0": SWA, "l1": FULL}, available_bytes=1201 * FULL.page_size_bytes,
                         max_model_len=8000)
    groups = tuple(g.spec for g in plan.groups)
    cap = CapacityPlan(num_blocks=plan.num_blocks, block_size=16, groups=groups,
                       source="test", factory=plan_factory(plan))
    return cap, plan.kv_tokens // 16 + 1


def test_swa_full_beats_one_group_approximation_under_pressure() -> None:
    # Rules: a running request holds only its window (+ the chunk being computed) in the
    # sliding-window group, while the approximation holds every token of it in full
    # attention; cached prefixes cost a block per token in both groups either way. So with
    # long agent contexts under memory pressure the hybrid keeps more running and more
    # cached -> hit rate >= the approximation's, strictly here. Without concurrency
    # (pure-cache mode) the same holds: a request adopting a long hit claims only the
    # window's blocks of the sliding-window group (the rest become null blocks), so it
    # needs fewer free blocks and evicts less.
    cap, approx_blocks = _plan()
    assert cap.num_blocks == 1201 and approx_blocks == 601
    wl = agent_loops(num_agents=8, num_steps=6)
    cfg = SchedulerConfig(token_budget=512, check_invariants_every_step=True)
    hybrid = EngineSimulator(wl, block_size=16, num_blocks=cap.num_blocks, config=cfg,
                             manager_factory=cap.factory).run()
    one = EngineSimulator(wl, block_size=16, num_blocks=approx_blocks, config=cfg).run()
    assert hybrid.hit_rate() > one.hit_rate() + 0.05
    assert hybrid.preemptions < one.preemptions
    pure_hybrid = run_pure_cache(wl, block_size=16, num_blocks=cap.num_blocks,
                                 manager_factory=cap.factory, check_invariants=True)
    pure_one = run_pure_cache(wl, block_size=16, num_blocks=approx_blocks)
    assert pure_hybrid.hit_rate() > pure_one.hit_rate()


def test_planned_hybrid_report_names_its_groups() -> None:
    wl = agent_loops(num_agents=2, num_steps=3)
    cap = plan_capacity(wl, model="Gemma-3-27B-it", gpu_memory="80GiB")
    kinds = {g.kind for g in cap.groups}
    assert kinds == {"sliding_window", "full_attention"} and cap.is_hybrid
    report = run(wl, SimConfig(model="Gemma-3-27B-it", bounds=False, jobs=1))
    assert any("sliding window 1024" in g for g in report.capacity.groups)
    text = render_text(report)
    assert "blocks shared by 7 KV-cache groups" in text and "sliding_window" in text
    assert report.verdict is not None and report.hit_rate is not None and report.hit_rate > 0
