"""One scenario per miss reason, and explain_lookup changing nothing."""

from __future__ import annotations

import pickle

import pytest
from observe_support import HEADS, Clock, check_partition, compute, full, observed, spans

from pagedkv import HashExtras, LoRA, MambaSpec, SlidingWindowSpec
from pagedkv.observe import ClampCause, ObserveConfig, Reason


def test_never_seen_and_partial_block() -> None:
    mgr = observed([full(16)])
    e = mgr.observe.explain_lookup(mgr.new_request("a", list(range(40))))
    check_partition(e)
    assert spans(e) == [(0, 32, "never_seen"), (32, 40, "partial_block")]
    (g,) = e.groups
    assert [b.reason for b in g.blocks()] == [Reason.NEVER_SEEN, Reason.NEVER_SEEN]


def test_hit_then_new_suffix_never_seen() -> None:
    mgr = observed([full(16)])
    compute(mgr, mgr.new_request("a", list(range(40))))
    e = mgr.observe.explain_lookup(mgr.new_request("b", list(range(32)) + list(range(500, 540))))
    check_partition(e)
    assert spans(e) == [(0, 32, "hit"), (32, 64, "never_seen"), (64, 72, "partial_block")]
    assert e.groups[0].hit_block_ids == tuple(mgr.get_block_ids("a")[0][:2])


def test_hit_cap_recomputes_the_last_block_of_an_aligned_prompt() -> None:
    mgr = observed([full(16)])
    compute(mgr, mgr.new_request("a", list(range(32))))
    e = mgr.observe.explain_lookup(mgr.new_request("b", list(range(32))))
    check_partition(e)
    assert spans(e) == [(0, 16, "hit"), (16, 32, "hit_cap")]
    assert [b.reason for b in e.groups[0].blocks()] == [Reason.HIT, Reason.HIT_CAP]


def test_drop_last_hit_is_a_hit_cap() -> None:
    mgr = observed([full(16)], drop_last_hit=True)
    compute(mgr, mgr.new_request("a", list(range(50))))
    e = mgr.observe.explain_lookup(mgr.new_request("b", list(range(50))))
    check_partition(e)
    assert spans(e) == [(0, 32, "hit"), (32, 48, "hit_cap"), (48, 50, "partial_block")]


def test_eviction_is_reported_with_its_step_time_and_usage() -> None:
    clock = Clock()
    mgr = observed([full(16)], num_blocks=5, observe=ObserveConfig(clock=clock))
    a = mgr.new_request("a", list(range(64)))
    compute(mgr, a)
    mgr.free(a)
    mgr.observe.begin_step(7)
    clock.now = 12.5
    # 3 new blocks: the free queue hands out a's blocks tail first (deepest evicted).
    b = mgr.new_request("b", list(range(1000, 1040)))
    compute(mgr, b)
    e = mgr.observe.explain_lookup(mgr.new_request("a2", list(range(64)) + [1]))
    check_partition(e)
    assert spans(e) == [(0, 16, "hit"), (16, 64, "evicted"), (64, 65, "partial_block")]
    ev = e.segments[1].eviction
    assert ev is not None and ev.step == 7 and ev.time_s == 12.5
    assert ev.usage == pytest.approx(3 / 4)
    blocks = e.groups[0].blocks()
    assert [b.reason for b in blocks] == [Reason.HIT] + [Reason.EVICTED] * 3
    assert all(b.eviction is not None and b.eviction.step == 7 for b in blocks[1:])


def test_without_a_ghost_record_an_eviction_reads_never_seen() -> None:
    mgr = observed([full(16)], num_blocks=5, observe=ObserveConfig(ghost_entries=0))
    a = mgr.new_request("a", list(range(64)))
    compute(mgr, a)
    mgr.free(a)
    compute(mgr, mgr.new_request("b", list(range(1000, 1040))))
    e = mgr.observe.explain_lookup(mgr.new_request("a2", list(range(65))))
    assert spans(e) == [(0, 16, "hit"), (16, 64, "never_seen"), (64, 65, "partial_block")]


def test_salted_request_is_isolated_from_the_same_unsalted_prompt() -> None:
    mgr = observed([full(16)])
    prompt = list(range(48))
    compute(mgr, mgr.new_request("plain", prompt))
    salted = mgr.new_request("salted", prompt, hash_extras=HashExtras(cache_salt="tenant-7"))
    e = mgr.observe.explain_lookup(salted)
    check_partition(e)
    assert spans(e) == [(0, 48, "isolated")]
    assert e.num_hit_tokens == 0
    assert e.segments[0].reason is Reason.ISOLATED


def test_unsalted_request_is_isolated_from_a_salted_and_a_lora_copy() -> None:
    mgr = observed([full(16)])
    prompt = list(range(40))
    compute(mgr, mgr.new_request("s", prompt, hash_extras=HashExtras(cache_salt="x")))
    e = mgr.observe.explain_lookup(mgr.new_request("plain", prompt))
    assert spans(e) == [(0, 32, "isolated"), (32, 40, "partial_block")]
    lora = mgr.new_request("lora", prompt, hash_extras=HashExtras(lora=LoRA("sql", 1)))
    assert spans(mgr.observe.explain_lookup(lora))[0] == (0, 32, "isolated")
    # Once the salted copy is evicted, nothing is cached under any key: not isolated.
    mgr.free("s")
    assert mgr.reset_prefix_cache()
    assert spans(mgr.observe.explain_lookup(mgr.new_request("p2", prompt)))[0][2] == "never_seen"


def test_hybrid_clamped_by_a_sliding_window_group_and_lcm_alignment() -> None:
    """Full attention block 32 + sliding window 32 at block 16: with window blocks 5 and 6
    evicted the window run ends at 80 tokens; 80 is not a multiple of 32, so 64 hit."""
    mgr = observed([full(32), SlidingWindowSpec(block_size=16, sliding_window=32, **HEADS)])
    prompt = list(range(129))
    a = mgr.new_request("a", prompt)
    compute(mgr, a)
    sw_table = mgr.get_block_ids("a")[1]
    mgr.free(a)
    mgr.evict_blocks(sw_table[5:7])
    b = mgr.new_request("b", prompt)
    e = mgr.observe.explain_lookup(b)
    check_partition(e)
    assert e.num_hit_tokens == mgr.get_computed_blocks(b).num_computed_tokens == 64
    assert spans(e) == [(0, 64, "hit"), (64, 80, "clamped_lcm_alignment"),
                        (80, 128, "clamped_window_run_not_found"), (128, 129, "partial_block")]
    assert e.segments[1].group == 0 and e.segments[2].group == 1
    full_g, sw_g = e.groups
    assert [r.reason for r in sw_g.blocks()[4:]] == (
        [Reason.CLAMPED] + [Reason.EVICTED] * 2 + [Reason.CLAMPED])
    assert full_g.blocks()[2].cause is ClampCause.LCM_ALIGNMENT


def test_group_detail_read_later_is_what_the_lookup_saw() -> None:
    """The per-group detail is built on first read, from what explain_lookup read: the
    manager changing in between (blocks cached again, others evicted) changes nothing."""
    groups = [full(32), SlidingWindowSpec(block_size=16, sliding_window=32, **HEADS)]
    seen = []
    for read_now in (True, False):
        mgr = observed(groups, num_blocks=24, observe=ObserveConfig(clock=Clock()))
        prompt = list(range(129))
        a = mgr.new_request("a", prompt)
        compute(mgr, a)
        sw_table = mgr.get_block_ids("a")[1]
        mgr.free(a)
        mgr.evict_blocks(sw_table[5:7])
        e = mgr.observe.explain_lookup(mgr.new_request("b", prompt))
        if read_now:
            seen.append([g.blocks() for g in e.groups])
            continue
        compute(mgr, mgr.new_request("c", prompt))          # window blocks 5, 6 cached again
        compute(mgr, mgr.new_request("d", list(range(1000, 1100))))   # evicts others
        assert [r.reason for r in mgr.observe.explain_lookup(
            mgr.new_request("b2", prompt)).groups[1].blocks()[4:7]] != (
            [Reason.CLAMPED] + [Reason.EVICTED] * 2)
        seen.append([g.blocks() for g in e.groups])
    assert seen[0] == seen[1]
    assert [r.reason for r in seen[1][1][4:]] == (
        [Reason.CLAMPED] + [Reason.EVICTED] * 2 + [Reason.CLAMPED])


def test_hybrid_lcm_alignment_makes_a_short_prompt_miss() -> None:
    mgr = observed([full(16), MambaSpec(block_size=64, state_bytes=4096,
                                        cache_checkpoints=True)])
    # "a" registers full-attention blocks up to the lcm (64 tokens); "b", 60 tokens long,
    # finds 3 of them but no boundary both groups share.
    compute(mgr, mgr.new_request("a", list(range(100))))
    e = mgr.observe.explain_lookup(mgr.new_request("b", list(range(60))))
    check_partition(e)
    assert e.num_hit_tokens == 0
    assert spans(e) == [(0, 48, "clamped_lcm_alignment"), (48, 60, "partial_block")]
    assert e.segments[0].group == 1


def test_hybrid_without_mamba_state_is_clamped_by_the_mamba_group() -> None:
    mgr = observed([full(16), MambaSpec(block_size=16, state_bytes=4096)])
    prompt = list(range(70))
    compute(mgr, mgr.new_request("a", prompt))
    e = mgr.observe.explain_lookup(mgr.new_request("b", prompt))
    check_partition(e)
    assert spans(e) == [(0, 64, "clamped_no_mamba_state"), (64, 70, "partial_block")]
    assert e.segments[0].group == 1
    # Per group: the Mamba group (align mode) never registered a state of this prefix.
    assert {b.reason for b in e.groups[1].blocks()} == {Reason.NEVER_SEEN}
    assert {b.cause for b in e.groups[0].blocks()} == {ClampCause.NO_MAMBA_STATE}


def test_a_pure_mamba_model_whose_step_ended_mid_block_has_no_state_to_serve() -> None:
    # Align mode caches a state only where a step ends on a block boundary; "a" ran its
    # 40 tokens in one step (ending mid-block), so no state of its prefix was registered.
    mgr = observed([MambaSpec(block_size=16, state_bytes=4096)])
    compute(mgr, mgr.new_request("a", list(range(40))))
    mgr.new_step_starts()
    e = mgr.observe.explain_lookup(mgr.new_request("b", list(range(40))))
    assert spans(e) == [(0, 32, "never_seen"), (32, 40, "partial_block")]


def test_caching_off() -> None:
    mgr = observed([full(16)], enable_caching=False)
    e = mgr.observe.explain_lookup(mgr.new_request("a", list(range(20))))
    assert spans(e) == [(0, 20, "caching_off")]


@pytest.mark.parametrize("events", [False, True])
def test_explain_lookup_leaves_debug_state_byte_identical(events: bool) -> None:
    mgr = observed([full(16), SlidingWindowSpec(block_size=16, sliding_window=32, **HEADS)],
                   num_blocks=12, enable_events=events)
    for i, salt in enumerate([None, "x", None]):
        r = mgr.new_request(f"r{i}", list(range(i * 7, i * 7 + 70)),
                            hash_extras=HashExtras(cache_salt=salt) if salt else None)
        compute(mgr, r)
        mgr.free(r)
    before = pickle.dumps(mgr.debug_state())
    ghost_before = pickle.dumps((dict(mgr.observe.ghost.ghost), mgr.observe.ghost.shadow_index,
                                 list(mgr.observe.ghost._shadow_cache)))
    for probe in (list(range(70)), list(range(7, 77)), list(range(500, 600))):
        for extras in (None, HashExtras(cache_salt="x")):
            e = mgr.observe.explain_lookup(mgr.new_request("p", probe, hash_extras=extras))
            assert [g.blocks() for g in e.groups]  # the group detail, built on first read
    assert pickle.dumps(mgr.debug_state()) == before
    assert pickle.dumps((dict(mgr.observe.ghost.ghost), mgr.observe.ghost.shadow_index,
                         list(mgr.observe.ghost._shadow_cache))) == ghost_before


def test_miss_stats_per_interval_with_preempted_lookups_apart() -> None:
    mgr = observed([full(16)])
    a = mgr.new_request("a", list(range(40)))
    compute(mgr, a)
    s = mgr.observe.make_miss_stats()
    assert (s.requests, s.queries, s.hits) == (1, 40, 0)
    assert s.missed_tokens == {"never_seen": 32, "partial_block": 8}
    assert s.queries == s.hits + sum(s.missed_tokens.values())
    mgr.free(a)
    a.num_preemptions = 1
    mgr.get_computed_blocks(a)
    s = mgr.observe.make_miss_stats()
    assert (s.requests, s.preempted_requests, s.preempted_hits) == (0, 1, 32)
    assert s.preempted_missed_tokens == {"partial_block": 8}
    assert mgr.observe.make_miss_stats().queries == 0


def test_residency_reuse_gaps_and_idle_time_of_a_hot_block() -> None:
    clock = Clock()
    mgr = observed([full(16)], num_blocks=4,
                   observe=ObserveConfig(clock=clock, residency_sample_every=1))
    for t in (0.0, 1.0, 1.5, 4.0):   # the same 1-block prompt looked up 4 times
        clock.now = t
        r = mgr.new_request(f"r{t}", list(range(17)))
        compute(mgr, r)
        mgr.free(r)
    clock.now = 10.0
    compute(mgr, mgr.new_request("big", list(range(100, 148))))  # takes every block
    samples = {round(s.lifetime_s, 3): s for s in mgr.observe.drain_residency()}
    hot = samples[10.0]   # block born at 0, hit at 1.0, 1.5 and 4.0
    assert hot.idle_before_evict_s == pytest.approx(6.0)
    assert hot.reuse_gaps_s == pytest.approx((0.5, 2.5))
    assert mgr.observe.drain_residency() == []


def test_docstring_examples_of_the_observe_package() -> None:
    import doctest

    from pagedkv.observe import attribution_scan, observer, reasons, residency
    from pagedkv.sim import observe_engine, observe_support

    for module in (attribution_scan, observer, reasons, residency, observe_engine,
                   observe_support):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_observe_config_rejects_bad_values() -> None:
    from pagedkv import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="ghost_entries"):
        ObserveConfig(ghost_entries=-1)
    with pytest.raises(InvalidArgumentError, match="residency_sample_every"):
        ObserveConfig(residency_sample_every=0)


def test_residency_follows_exactly_one_in_n_allocations_across_calls() -> None:
    from pagedkv.observe.residency import ResidencySampler

    s = ResidencySampler(3, clock=lambda: 0.0)
    ids = list(range(1, 30))
    followed: list[int] = []
    for chunk in (ids[:1], ids[1:5], ids[5:6], ids[6:20], ids[20:]):
        before = set(s._followed)
        s.allocated(chunk)
        followed.extend(sorted(set(s._followed) - before))
    assert followed == ids[::3]          # allocations 1, 4, 7, ...: every third
    s.allocated([1, 4])                  # both die: two samples
    assert len(s.drain()) == 2


def test_explain_lookup_refuses_what_a_lookup_refuses() -> None:
    from pagedkv import InvalidArgumentError

    mgr = observed([full(16)], max_model_len=64)
    with pytest.raises(InvalidArgumentError):
        mgr.observe.explain_lookup("not a request")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        mgr.observe.explain_lookup(mgr.new_request("long", list(range(100))))


def test_attribution_keeps_the_retention_pool() -> None:
    from pagedkv.retention import RetentionConfig, RetentionPolicy

    mgr = observed([full(16)], retention=RetentionConfig(),
                   observe=ObserveConfig(residency_sample_every=None))
    assert isinstance(mgr.pool.policy, RetentionPolicy) and mgr.retention is not None
    compute(mgr, mgr.new_request("a", list(range(40))))
    assert spans(mgr.observe.explain_lookup(mgr.new_request("b", list(range(40))))) == [
        (0, 32, "hit"), (32, 40, "partial_block")]


def test_residency_sampling_combines_with_retention() -> None:
    """Once refused (two pool subclasses); now a pool listener beside the retention
    policy: a pinned prefix is not evicted, the other blocks' lives are sampled."""
    from pagedkv.retention import RetentionConfig

    now = [0.0]
    mgr = observed([full(16)], retention=RetentionConfig(clock=lambda: now[0],
                                                         pin_budget_fraction=1.0),
                   observe=ObserveConfig(residency_sample_every=1, clock=lambda: now[0]),
                   num_blocks=7)
    sys_req = mgr.new_request("sys", list(range(32)))
    compute(mgr, sys_req)
    mgr.free(sys_req)
    mgr.retention.pin_prefix(sys_req, ttl_s=100.0)
    for k in range(1, 4):  # evicts every unpinned block, more than once
        now[0] = float(k)
        r = mgr.new_request(f"r{k}", [1000 * k + i for i in range(64)])
        compute(mgr, r)
        mgr.free(r)
        mgr.check_invariants()
    samples = mgr.observe.drain_residency()
    assert samples and all(s.lifetime_s > 0 for s in samples)
    hit = mgr.get_computed_blocks(mgr.new_request("again", list(range(33))))
    assert hit.num_computed_tokens == 32  # the pinned prefix survived


def test_sub_block_hit_is_explained_as_the_coordinator_finds_it() -> None:
    """Full attention 16 + align-mode Mamba 16 hashed at 4: a hit ending inside a block
    (40 tokens, vLLM 0.33's partial hits) is the explanation's hit; the rest of the
    prompt (46 tokens: block 2 is not full) reads partial_block."""
    mgr = observed([full(16), MambaSpec(block_size=16, state_bytes=64)], num_blocks=40,
                   max_model_len=256, hash_block_size=4)
    a = mgr.new_request("a", list(range(1, 42)))
    assert mgr.allocate_slots(a, 40) is not None
    a.num_computed_tokens = 40
    mgr.new_step_starts()
    assert mgr.allocate_slots(a, 1) is not None
    a.num_computed_tokens = 41
    mgr.release_blocks(mgr.take_block_copies().retained)
    mgr.new_step_starts()
    b = mgr.new_request("b", list(range(1, 41)) + [900, 901, 902, 903, 904, 905])
    e = mgr.observe.explain_lookup(b)
    check_partition(e)
    hit = mgr.get_computed_blocks(b)
    assert e.num_hit_tokens == hit.num_computed_tokens == 40
    assert [list(g.hit_block_ids) for g in e.groups] == [list(t) for t in hit.block_ids]
    assert spans(e) == [(0, 40, "hit"), (40, 46, "partial_block")]
    mgr.check_invariants()
