"""The simulator's host tier (``SimConfig(host=...)``): per-tier figures add up, transfers
are charged by bytes and bandwidth, load versus recompute follows the cost, both tiers'
invariants hold every step, and with the host tier off the engine replays exactly as
before the tier existed."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from pagedkv.errors import InvalidArgumentError
from pagedkv.sim import SimConfig, bundled_trace_path, load_trace, multi_turn, run
from pagedkv.sim.host_engine import HostEngineSimulator
from pagedkv.sim.host_sweep import block_bytes_for
from pagedkv.sim.host_tier import (
    NO_MODEL_BYTES_PER_TOKEN,
    AlwaysLoad,
    CostBasedLoad,
    HostMemoryConfig,
    TransferCost,
    parse_host_sizes,
)
from pagedkv.sim.summary import SimReport

BASE = SimConfig(num_blocks=400, bounds=False, jobs=1)


def _fingerprint(rep: SimReport) -> tuple[object, ...]:
    r = rep.result
    assert r is not None and rep.engine is not None
    ttft = [None if f is None else round(f - a, 9)
            for a, f in zip(r.arrival_s, r.first_token_s, strict=True)]
    digest = hashlib.sha256(repr((r.hit_tokens, ttft)).encode()).hexdigest()[:16]
    return (rep.hit_tokens, rep.evicted_blocks, rep.preemptions, rep.engine.steps,
            round(rep.engine.simulated_s, 9), digest)


def test_host_off_replays_exactly_as_before_the_tier() -> None:
    """Figures recorded with the engine before the host tier's hooks were added
    (commit d491c5e): every hit, TTFT, step and eviction is unchanged (on the linear
    step model those figures were timed with; the roofline clock is the default now)."""
    assert _fingerprint(run(multi_turn(), BASE)) == (
        113872, 16751, 35, 15208, 70.17156, "06846b9d9fcf289e")
    head = load_trace(bundled_trace_path(), limit=300)
    assert _fingerprint(run(head, SimConfig(bounds=False, jobs=1, step_model="linear"))) == (
        153088, 236325, 89, 7142, 122.5266, "986111ec5b7335d7")


@pytest.fixture(scope="module")
def hosted() -> SimReport:
    return run(multi_turn(), replace(BASE, host=HostMemoryConfig(memory_bytes=4 << 30)))


def test_per_tier_hits_add_up_and_the_host_adds_hits(hosted: SimReport) -> None:
    tier = hosted.host_tier
    assert tier is not None
    assert tier.device_hit_tokens + tier.host_hit_tokens == hosted.hit_tokens
    assert tier.host_hit_tokens > 0 and tier.declined_host_tokens == 0
    assert tier.num_blocks == (4 << 30) // (NO_MODEL_BYTES_PER_TOKEN * 16) == 2048
    device_only = run(multi_turn(), BASE)
    assert hosted.hit_tokens > device_only.hit_tokens
    # the device part of the hits is what the device alone finds on this workload
    assert tier.device_hit_tokens == device_only.hit_tokens
    # the table: the device-only replay, then this run
    base_row, row = hosted.host_sweep
    assert base_row.host_memory_bytes is None and row.host_memory_bytes == 4 << 30
    assert base_row.hit_rate == pytest.approx(device_only.hit_rate or 0.0)
    assert device_only.engine is not None
    assert base_row.ttft_p50_s == device_only.engine.ttft.p50
    assert row.host_hit_rate == pytest.approx(tier.host_hit_tokens / hosted.prompt_tokens)
    d = hosted.to_dict()
    assert d["host_tier"]["host_hit_tokens"] == tier.host_hit_tokens


def test_transfers_are_charged_by_bytes_over_bandwidth(hosted: SimReport) -> None:
    tier = hosted.host_tier
    assert tier is not None and tier.loaded_blocks > 0 and tier.stored_blocks > 0
    per_block_s = tier.block_bytes / (tier.bandwidth_gbps * 1e9)
    assert tier.load_s == pytest.approx(tier.loaded_blocks * per_block_s)
    # eviction stores sit on the critical path: steps waited for some of them
    assert 0 < tier.store_stall_s <= tier.stored_blocks * per_block_s
    slower = run(multi_turn(), replace(BASE, host=HostMemoryConfig(
        memory_bytes=4 << 30, bandwidth_gbps=5.0, device_only_baseline=False)))
    assert slower.host_tier is not None and slower.host_tier.store_stall_s > tier.store_stall_s
    assert slower.engine is not None and hosted.engine is not None
    assert slower.engine.simulated_s > hosted.engine.simulated_s


def test_write_through_overlaps_its_stores() -> None:
    rep = run(multi_turn(), replace(BASE, host=HostMemoryConfig(
        memory_bytes=4 << 30, write_policy="write-through", device_only_baseline=False)))
    tier = rep.host_tier
    assert tier is not None and tier.stored_blocks > 0 and tier.host_hit_tokens > 0
    assert tier.store_stall_s == 0.0


def test_a_slow_link_recomputes_instead_of_loading() -> None:
    """At 0.05 GB/s a 2 MiB block takes 42 ms to load, 16 tokens 0.32 ms to prefill."""
    rep = run(multi_turn(), replace(BASE, host=HostMemoryConfig(
        memory_bytes=4 << 30, bandwidth_gbps=0.05, device_only_baseline=False)))
    tier = rep.host_tier
    assert tier is not None
    assert tier.declined_host_tokens > 0 and tier.host_hit_tokens == 0 and tier.loads == 0
    assert tier.device_hit_tokens == rep.hit_tokens


def test_load_policies() -> None:
    cost = TransferCost(block_bytes=2 << 20, bandwidth_gbps=25.0)
    assert cost.seconds(10) == pytest.approx(10 * 2**21 / 25e9)
    # 16 tokens recompute in 320 µs at 20 µs per token; the block loads in 84 µs
    assert CostBasedLoad().worth_loading(num_tokens=16, num_blocks=1, cost=cost,
                                         prefill_token_s=20e-6)
    assert not CostBasedLoad().worth_loading(num_tokens=16, num_blocks=1, cost=cost,
                                             prefill_token_s=5e-6)
    assert AlwaysLoad().worth_loading(num_tokens=16, num_blocks=1, cost=cost,
                                      prefill_token_s=0.0)


def test_always_load_moves_every_host_hit() -> None:
    wl = multi_turn()
    host = HostMemoryConfig(memory_bytes=4 << 30, bandwidth_gbps=0.05)
    sim = HostEngineSimulator(wl, block_size=16, num_blocks=400, host=host,
                              block_bytes=NO_MODEL_BYTES_PER_TOKEN * 16, policy=AlwaysLoad())
    sim.run()
    assert sim.host_stats.declined_host_tokens == 0 and sim.host_stats.host_hit_tokens > 0


def test_invariants_of_both_tiers_hold_every_step() -> None:
    wl = multi_turn(num_conversations=8, num_turns=4)
    rep = run(wl, replace(BASE, num_blocks=120, check_invariants=True,
                          host=HostMemoryConfig(memory_bytes=256 << 20,
                                                          device_only_baseline=False)))
    assert rep.host_tier is not None and rep.host_tier.stored_blocks > 0


def test_sweep_rows_device_only_first() -> None:
    wl = multi_turn(num_conversations=8, num_turns=4)
    rep = run(wl, replace(BASE, num_blocks=120, host=HostMemoryConfig(
        memory_bytes=64 << 20, sweep_memory_bytes=(1 << 30,))))
    rows = rep.host_sweep
    assert [r.host_memory_bytes for r in rows] == [None, 64 << 20, 1 << 30]
    assert rows[0].host_hit_rate == 0.0 and rows[0].host_blocks == 0
    for r in rows:
        assert r.device_hit_rate + r.host_hit_rate == pytest.approx(r.hit_rate)
    assert rows[1].hit_rate == pytest.approx(rep.hit_rate)
    assert rows[2].hit_rate >= rows[1].hit_rate


def test_block_bytes_come_from_the_plan() -> None:
    from pagedkv.sim import capacity_for

    wl = load_trace(bundled_trace_path(), limit=5)
    cap = capacity_for(wl, SimConfig())
    assert block_bytes_for(cap) == 32 * 65536  # Llama-3.1-8B: 32 layers x 64 KiB pages
    assert block_bytes_for(capacity_for(wl, BASE)) == NO_MODEL_BYTES_PER_TOKEN * 16


def test_bad_settings() -> None:
    with pytest.raises(InvalidArgumentError, match="positive size"):
        HostMemoryConfig(memory_bytes=0)
    with pytest.raises(InvalidArgumentError, match="bandwidth"):
        HostMemoryConfig(memory_bytes=1 << 30, bandwidth_gbps=0.0)
    with pytest.raises(InvalidArgumentError, match="write-policy"):
        HostMemoryConfig(memory_bytes=1 << 30, write_policy="later")
    with pytest.raises(InvalidArgumentError, match="--mode engine"):
        SimConfig(mode="pure-cache", host=HostMemoryConfig(memory_bytes=1 << 30))
    with pytest.raises(InvalidArgumentError, match="holds no block"):
        run(multi_turn(), replace(BASE, host=HostMemoryConfig(memory_bytes=1024)))
    with pytest.raises(InvalidArgumentError, match="not a size"):
        parse_host_sizes("256GiB,lots")
    assert parse_host_sizes("1GiB, 2GB") == (1 << 30, 2 * 10**9)


def test_a_hybrid_model_replays_with_a_host_tier() -> None:
    """Gemma 3 (full attention + sliding window): the host tier serves each group."""
    wl = load_trace(bundled_trace_path(), limit=5)
    rep = run(wl, SimConfig(model="Gemma-3-27B-it", bounds=False, jobs=1,
                            host=HostMemoryConfig(memory_bytes=1 << 30)))
    assert rep.host_tier is not None


def test_without_baseline_one_size_has_no_table() -> None:
    wl = multi_turn(num_conversations=4, num_turns=3)
    rep = run(wl, replace(BASE, num_blocks=120, host=HostMemoryConfig(
        memory_bytes=1 << 30, device_only_baseline=False)))
    assert rep.host_tier is not None and rep.host_sweep == ()


def test_docstring_examples() -> None:
    import doctest

    import pagedkv.sim.host_tier as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
