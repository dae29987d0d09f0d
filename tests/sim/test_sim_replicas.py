"""The multi-replica simulation is N single engines on one clock: one replica behind
round-robin is ``simulate`` to the last bit (plain and hybrid models), and several
replicas serve every request with the cache-aware router keeping prompts together."""

from __future__ import annotations

import pytest

from pagedkv.errors import InvalidArgumentError
from pagedkv.sim import SimConfig, run, system_prompts
from pagedkv.sim.replicas import (
    compare_policies,
    merge_results,
    plot_replica_reports,
    render_replica_report,
    replica_report_json,
    run_replicas,
)


def workload(output_tokens=24):
    # 7 system prompts of 32 blocks: 4 replicas of 120 blocks cannot each hold all of
    # them, and round-robin sends every prompt to every replica (7 and 4 are coprime).
    return system_prompts(num_groups=7, questions_per_group=12, system_tokens=512,
                          question_tokens=40, output_tokens=output_tokens, interval_s=0.01)


def figures_of_run(report):
    e = report.engine
    return (report.hit_rate, report.preemptions, report.rejected_requests, e.ttft, e.tpot,
            e.e2e, e.queue_delay, e.output_tokens_per_s, e.usage_mean, e.usage_max,
            e.steps, e.simulated_s)


def figures_of_replicas(r):
    e = r.report.engine
    return (r.hit_rate, r.num_preemptions, r.num_rejected, r.ttft, r.tpot, r.e2e,
            r.queue_delay, r.output_tokens_per_s, r.usage_mean, r.usage_max, e.steps,
            r.makespan_s)


@pytest.mark.parametrize("config", [
    SimConfig(num_blocks=300, jobs=1, bounds=False, block_size=16),
    SimConfig(model="Gemma-3-27B-it", gpu_memory="64GiB", memory_scale=0.6, jobs=1,
              bounds=False),
], ids=["full-attention", "hybrid"])
def test_one_replica_is_the_single_engine(config):
    wl = workload(output_tokens=200)  # long enough outputs to preempt
    single = run(wl, config)
    one = run_replicas(wl, config, num_replicas=1, policy="round-robin")
    assert figures_of_replicas(one) == figures_of_run(single)
    assert single.preemptions > 0 and single.engine.ttft.mean is not None
    assert one.report.capacity.groups == single.capacity.groups
    if config.model:
        assert len(single.capacity.groups) > 1  # every group of the hybrid plan simulated


def test_chat_turns_follow_their_parent_across_replicas():
    from pagedkv.sim import multi_turn

    wl = multi_turn(num_conversations=6, num_turns=3, think_s=0.5)
    cfg = SimConfig(num_blocks=400, jobs=1, bounds=False)
    single = run(wl, cfg)
    one = run_replicas(wl, cfg, num_replicas=1, policy="round-robin")
    assert figures_of_replicas(one) == figures_of_run(single)
    two = run_replicas(wl, cfg, num_replicas=2, policy="least-loaded")
    res = two.report.result
    assert res.num_finished == len(wl.requests)
    for i, r in enumerate(wl.requests):
        if r.parent is not None:  # a turn arrives after its parent finished
            assert res.arrival_s[i] >= res.finish_s[r.parent]


def test_cache_aware_beats_round_robin_when_the_cache_is_tight(tmp_path):
    wl = workload()
    cfg = SimConfig(num_blocks=120, block_size=16, jobs=1, bounds=False)
    report = compare_policies(wl, cfg, num_replicas=4)
    by = {r.policy: r for r in report.results}
    assert set(by) == {"round-robin", "least-loaded", "cache-aware"}
    for r in report.results:
        assert sum(r.requests_per_replica) == len(wl.requests)
        assert r.report.result.num_finished == len(wl.requests)
        assert r.ttft.p50 is not None and r.ttft.p50 > 0
    assert by["round-robin"].requests_per_replica == (21, 21, 21, 21)
    assert by["cache-aware"].hit_rate > by["round-robin"].hit_rate + 0.2
    assert by["cache-aware"].hit_rate <= wl.ideal_hit_rate(16, "engine") + 1e-9
    text = render_replica_report(report)
    assert "cache-aware" in text and "TTFT mean" in text
    data = replica_report_json(report)
    assert data["num_replicas"] == 4 and data["results"][0]["ttft"]["mean"] > 0
    pytest.importorskip("matplotlib")
    assert plot_replica_reports([report], tmp_path / "r.png").stat().st_size > 1000


def test_merging_keeps_each_request_from_its_replica():
    wl = workload()
    cfg = SimConfig(num_blocks=400, jobs=1, bounds=False)
    two = run_replicas(wl, cfg, num_replicas=2, policy="round-robin")
    res = two.report.result
    assert sum(1 for t in res.first_token_s if t is not None) == len(wl.requests)
    assert res.sample_time_s == sorted(res.sample_time_s)
    assert merge_results([res], [0] * len(wl.requests)) is res


def test_bad_arguments():
    cfg = SimConfig(num_blocks=100, jobs=1, bounds=False)
    with pytest.raises(InvalidArgumentError, match="num_replicas"):
        run_replicas(workload(), cfg, num_replicas=0, policy="cache-aware")
    with pytest.raises(InvalidArgumentError, match="router policy"):
        run_replicas(workload(), cfg, num_replicas=2, policy="random")
    with pytest.raises(InvalidArgumentError, match="--mode engine"):
        run_replicas(workload(), SimConfig(num_blocks=100, mode="pure-cache"),
                     num_replicas=2, policy="round-robin")


def test_progress_is_a_line_every_few_seconds_when_not_a_terminal():
    import io

    from pagedkv.sim.progress import PLAIN_EVERY_S, PROGRESS_AFTER_S, ProgressReporter

    out = io.StringIO()
    progress = ProgressReporter(stream=out)
    progress.phase("replaying 10 requests over 2 replicas (round-robin)")
    progress(1, 10)
    assert out.getvalue() == ""  # a short phase shows nothing
    progress.t0 -= PROGRESS_AFTER_S + 1
    progress(2, 10)
    progress(3, 10)  # within PLAIN_EVERY_S of the last line: nothing
    progress._last_plain -= PLAIN_EVERY_S
    progress(4, 10)
    progress(10, 10)
    lines = out.getvalue().splitlines()
    assert [line.split(": ")[1].split(" ")[0] for line in lines] == ["2/10", "4/10", "10/10"]
    assert "\r" not in out.getvalue()


class _ProductionIndex:
    """The production path the simulation's live index stands for: a MemoryIndex fed by
    an IndexIngest, with no delay."""

    def __init__(self):
        from pagedkv.cluster.index import MemoryIndex
        from pagedkv.cluster.ingest import IndexIngest

        self.index = MemoryIndex(model="m")
        self.ingest = IndexIngest(self.index)
        self.longest_prefix = self.index.longest_prefix
        self.held_positions = self.index.held_positions

    def apply(self, replica, events):
        self.ingest.apply(replica.pod, events)


@pytest.mark.parametrize("config", [
    SimConfig(num_blocks=120, jobs=1, bounds=False, block_size=16),
    SimConfig(model="Gemma-3-27B-it", gpu_memory="64GiB", memory_scale=0.3, jobs=1,
              bounds=False),
], ids=["full-attention", "hybrid"])
def test_the_live_index_routes_as_the_production_index(config, monkeypatch):
    from pagedkv.sim.replicas import driver

    wl = workload()
    live = run_replicas(wl, config, num_replicas=3, policy="cache-aware")
    monkeypatch.setattr(driver, "LiveIndex", _ProductionIndex)
    production = run_replicas(wl, config, num_replicas=3, policy="cache-aware")
    assert live.requests_per_replica == production.requests_per_replica
    assert figures_of_replicas(live) == figures_of_replicas(production)
    assert live.hit_rate > 0 and live.num_preemptions + live.report.evicted_blocks > 0
