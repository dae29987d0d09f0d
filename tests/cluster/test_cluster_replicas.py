"""The multi-replica simulation: every request served, managers consistent, and the
cache-aware router keeping each system prompt on few replicas."""

from __future__ import annotations

import pytest

from pagedkv.cluster.replica_engine import EngineConfig, ReplicaEngine, Tracked
from pagedkv.cluster.replica_report import (
    plot_replica_reports,
    render_replica_report,
    replica_report_json,
)
from pagedkv.cluster.replicas import compare_policies, run_replicas
from pagedkv.errors import InvalidArgumentError
from pagedkv.sim import system_prompts


def workload():
    # 7 system prompts of 32 blocks: 4 replicas of 120 blocks cannot each hold all of
    # them, and round-robin sends every prompt to every replica (7 and 4 are coprime).
    return system_prompts(num_groups=7, questions_per_group=12, system_tokens=512,
                          question_tokens=40, output_tokens=24, interval_s=0.01)


def test_cache_aware_beats_round_robin_when_the_cache_is_tight(tmp_path):
    wl = workload()
    engine = EngineConfig(num_blocks=120, block_size=16, token_budget=2048)
    report = compare_policies(wl, num_replicas=4, engine=engine)
    by = {r.policy: r for r in report.results}
    assert set(by) == {"round-robin", "least-loaded", "cache-aware"}
    for r in report.results:
        assert sum(r.requests_per_replica) == len(wl.requests)
        assert r.ttft_p50_s is not None and r.ttft_p50_s > 0
    assert by["round-robin"].requests_per_replica == (21, 21, 21, 21)
    assert by["cache-aware"].hit_rate > by["round-robin"].hit_rate + 0.2
    assert by["cache-aware"].hit_rate <= wl.ideal_hit_rate(16, "engine") + 1e-9
    text = render_replica_report(report)
    assert "cache-aware" in text and "step time = 4 ms" in text
    assert replica_report_json(report)["num_replicas"] == 4
    pytest.importorskip("matplotlib")
    assert plot_replica_reports([report], tmp_path / "r.png").stat().st_size > 1000


def test_one_replica_serves_everything_and_stays_consistent():
    wl = workload()
    result = run_replicas(wl, num_replicas=1, policy="cache-aware",
                          engine=EngineConfig(num_blocks=400, block_size=16))
    assert result.requests_per_replica == (len(wl.requests),)
    assert 0 < result.hit_rate <= wl.ideal_hit_rate(16, "engine") + 1e-9


def test_engine_steps_and_fast_forward_keep_the_manager_consistent():
    engine = ReplicaEngine(EngineConfig(num_blocks=64, block_size=4, token_budget=32))
    for i in range(6):
        req = engine.manager.new_request(f"r{i}", list(range(i, i + 10)))
        engine.submit(Tracked(i, req, 0.0, num_output=30))
    now = 0.0
    while engine.has_work:
        now += engine.step(now)
        engine.manager.check_invariants()
    assert len(engine.finished) == 6
    assert all(t.generated == 30 and t.first_token_s is not None for t in engine.finished)
    assert engine.num_steps >= 30  # fast-forwarded steps still count


def test_bad_arguments():
    with pytest.raises(InvalidArgumentError):
        run_replicas(workload(), num_replicas=0, policy="cache-aware",
                     engine=EngineConfig(num_blocks=100))
    with pytest.raises(InvalidArgumentError):
        run_replicas(workload(), num_replicas=2, policy="random",
                     engine=EngineConfig(num_blocks=100))
