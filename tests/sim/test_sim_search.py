"""--find-capacity: the KV memory and replica counts it reports meet the target; the
round-robin split keeps sessions together; durations parse."""

from __future__ import annotations

import pytest

from pagedkv import InvalidArgumentError
from pagedkv.sim import SimConfig, agent_loops, run
from pagedkv.sim.search import find_capacity, parse_seconds, split_round_robin


def test_search_answers_meet_the_target() -> None:
    wl = agent_loops(num_agents=16, num_steps=6, interval_s=0.1)
    cfg = SimConfig(num_blocks=700, bounds=False, jobs=1)
    base = run(wl, cfg)
    assert base.verdict is not None and base.verdict.state == "saturated"
    assert base.engine is not None and base.engine.ttft.p99 is not None
    target = 0.5
    assert base.engine.ttft.p99 > target
    found = find_capacity(wl, cfg, ttft_p99_s=target, baseline_ttft_p99_s=base.engine.ttft.p99)
    assert found.memory_scale is not None and found.memory_scale > 1
    assert found.num_blocks is not None and found.replicas is not None and found.replicas > 1
    again = run(wl, SimConfig(num_blocks=found.num_blocks, bounds=False, jobs=1))
    assert again.engine is not None and again.engine.ttft.p99 is not None
    assert again.engine.ttft.p99 <= target
    assert "x" in found.summary() and f"{found.replicas} replicas" in found.summary()
    met = find_capacity(wl, cfg, ttft_p99_s=1e6, baseline_ttft_p99_s=base.engine.ttft.p99)
    assert (met.memory_scale, met.replicas) == (1.0, 1) and "already met" in met.summary()


def test_split_keeps_sessions_together() -> None:
    wl = agent_loops(num_agents=5, num_steps=3)
    parts = split_round_robin(wl, 2)
    assert sum(len(p.requests) for p in parts) == len(wl.requests)
    for p in parts:
        for r in p.requests:
            if r.parent is not None:
                parent = p.requests[r.parent]
                assert parent.request_id.split("t")[0] == r.request_id.split("t")[0]


@pytest.mark.parametrize(("text", "seconds"), [("2s", 2.0), ("500ms", 0.5), ("1.5", 1.5)])
def test_parse_seconds(text: str, seconds: float) -> None:
    assert parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0s", "-1", "soon", "inf"])
def test_parse_seconds_rejects(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="positive duration"):
        parse_seconds(text)
