"""Sliding-window MLA with bounded prefix replay (DeepSeek-V4's SWA layers), through the
façade: the replayed group never joins a lookup and never registers a block; a hit decided
by the other groups is adopted with null blocks below the window and fresh ones from there;
a chunk ending inside the replayed range adopts the hit without new tokens. Invariants are
checked after every call. Figures as vLLM 0.33's ``test_prefix_replay.py`` (block 16,
window 32, a 100-token prompt: a 96-token hit, replay start 64)."""

from __future__ import annotations

import random

import pytest
from hybrid_support import admit, full, make_mgr, mla, tokens

from pagedkv import KVCacheManager, Request
from pagedkv.core.managers import (
    ReplayedWindowManager,
    SlidingWindowManager,
    WindowMLAManager,
    manager_class_for,
)
from pagedkv.core.specs_window_mla import SlidingWindowMLASpec
from pagedkv.errors import InvalidArgumentError
from pagedkv.observe import ObserveConfig, Observer, Reason

BS, WINDOW, PROMPT = 16, 32, 100
HIT = PROMPT // BS * BS  # 96
FULL, SWA = 0, 1


def swa_mla(bs: int = BS, window: int = WINDOW, *, replay: bool = True) -> SlidingWindowMLASpec:
    return SlidingWindowMLASpec(block_size=bs, num_kv_heads=1, head_size=64, dtype_bytes=2,
                                sliding_window=window, bounded_replay=replay)


def replay_mgr(num_blocks: int = 64) -> KVCacheManager:
    return make_mgr([full(BS), swa_mla()], num_blocks=num_blocks)


def test_the_spec_and_its_managers() -> None:
    spec = swa_mla()
    assert spec.page_size_bytes == BS * 64 * 2  # one latent per token: no factor 2
    assert spec.prefix_replay_tokens == WINDOW and spec.kind == "sliding_window_mla"
    assert swa_mla(replay=False).prefix_replay_tokens == 0
    assert manager_class_for(spec) is ReplayedWindowManager
    plain = manager_class_for(swa_mla(replay=False))
    assert plain is WindowMLAManager and issubclass(plain, SlidingWindowManager)
    assert not ReplayedWindowManager.cacheable and not ReplayedWindowManager.joins_lookup
    with pytest.raises(InvalidArgumentError, match="bounded_replay"):
        SlidingWindowMLASpec(block_size=BS, num_kv_heads=1, head_size=64, dtype_bytes=2,
                             sliding_window=WINDOW, bounded_replay=1)  # type: ignore[arg-type]


def test_a_hit_is_decided_by_full_attention_and_adopted_with_a_fresh_window() -> None:
    mgr = replay_mgr()
    prompt = tokens(PROMPT)
    first = admit(mgr, "first", prompt)
    assert first.hit_tokens == 0
    # Nothing of the window group is ever registered; full attention's 6 blocks are.
    hashes = first.req.block_hashes
    assert all(mgr.get_cached_block(h, (SWA,)) is None for h in hashes)
    assert all(mgr.get_cached_block(h, (FULL,)) is not None for h in hashes)

    second = mgr.new_request("second", prompt)
    hit = mgr.get_computed_blocks(second)
    assert hit.num_computed_tokens == HIT
    assert hit.block_ids[SWA] == [] and len(hit.block_ids[FULL]) == HIT // BS
    new = mgr.allocate_slots(second, PROMPT - HIT, new_computed_blocks=hit)
    mgr.check_invariants()
    assert new is not None
    tables = mgr.get_block_ids("second")
    first_full = mgr.get_block_ids("first")[FULL]
    assert tables[FULL][: HIT // BS] == first_full[: HIT // BS]
    assert len(tables[FULL]) == HIT // BS + 1 and new[FULL] == tables[FULL][-1:]
    skipped = (HIT - WINDOW + 1) // BS  # 4 blocks wholly below the window of token 96
    assert tables[SWA][:skipped] == [0] * skipped
    assert len(tables[SWA]) == -(-PROMPT // BS) and all(tables[SWA][skipped:])
    assert new[SWA] == tables[SWA][skipped:]
    # The hit's blocks are shared; the window's are the request's own.
    assert not (set(tables[SWA]) - {0}) & set(mgr.get_block_ids("first")[SWA])
    assert mgr.estimate_cached_tokens(second) == HIT  # the window group is not counted


def test_replay_only_chunks_adopt_the_hit_without_new_slots() -> None:
    """A chunk cap of 16 under a 32-token replay: two chunks end inside the replayed range
    (64..80, 80..96), the third computes the 4 new tokens."""
    mgr = replay_mgr()
    prompt = tokens(PROMPT)
    admit(mgr, "first", prompt, chunk_tokens=BS)
    req = mgr.new_request("second", prompt)
    hit = mgr.get_computed_blocks(req)
    replay_start = HIT - WINDOW
    new = mgr.allocate_slots(req, 0, new_computed_blocks=hit)  # chunk 64..80: no slot past 96
    mgr.check_invariants()
    assert new is not None and new[FULL] == []
    tables = mgr.get_block_ids("second")
    assert len(tables[FULL]) == HIT // BS
    assert tables[SWA][:4] == [0] * 4 and len(tables[SWA]) == HIT // BS
    req.num_computed_tokens = replay_start + BS
    assert mgr.allocate_slots(req, BS) == ([], [])  # chunk 80..96: inside the held slots
    mgr.check_invariants()
    req.num_computed_tokens += BS
    new = mgr.allocate_slots(req, PROMPT - HIT)  # 96..100
    mgr.check_invariants()
    assert new is not None and len(new[FULL]) == 1 and len(new[SWA]) == 1
    req.num_computed_tokens = PROMPT
    assert len(mgr.get_block_ids("second")[FULL]) == -(-PROMPT // BS)


def test_a_hit_alone_still_needs_something_to_adopt() -> None:
    mgr = replay_mgr()
    req = mgr.new_request("lonely", tokens(PROMPT))
    with pytest.raises(InvalidArgumentError, match="nothing to allocate"):
        mgr.allocate_slots(req, 0, new_computed_blocks=mgr.get_computed_blocks(req))
    mgr.check_invariants()
    assert not mgr.has_request("lonely")


def test_a_model_of_replayed_groups_only_never_hits() -> None:
    for groups in ([swa_mla()], [swa_mla(), swa_mla()]):
        mgr = make_mgr(groups, num_blocks=32)
        admit(mgr, "a", tokens(PROMPT))
        b = mgr.new_request("b", tokens(PROMPT))
        assert mgr.get_computed_blocks(b).num_computed_tokens == 0
        mgr.check_invariants()


def test_a_host_tier_refuses_the_replayed_group() -> None:
    from pagedkv import CacheConfig
    from pagedkv.errors import ConfigError
    from pagedkv.host import HostTierConfig

    config = CacheConfig(groups=(full(BS), swa_mla()), num_blocks=32, max_model_len=512,
                         host_tier=HostTierConfig(num_blocks=16))
    with pytest.raises(ConfigError, match=r"never cached .*ReplayedWindowManager"):
        KVCacheManager(config)


def test_external_tokens_get_window_blocks_as_a_hit_does() -> None:
    """A 64-token remote load (no local hit): the window group nulls the 2 blocks below the
    window of token 64 and allocates the rest; full attention allocates all 7."""
    mgr = replay_mgr()
    req = mgr.new_request("remote", tokens(PROMPT))
    new = mgr.allocate_slots(req, PROMPT - 64, num_external_computed_tokens=64)
    mgr.check_invariants()
    assert new is not None
    tables = mgr.get_block_ids("remote")
    assert len(tables[FULL]) == 7 and tables[SWA][:2] == [0, 0] and all(tables[SWA][2:])


def _random_run(mgr: KVCacheManager, seed: int, num_ops: int, *, explain: bool = False) -> int:
    """Admissions that replay their hit (as vLLM's scheduler: a hit no longer than the
    window is dropped, a longer one rewound by the window), chunks, decodes, frees;
    invariants after every call. ``explain``: the observer's miss attribution must agree
    with every lookup's hit. Returns the number of replayed admissions."""
    rng = random.Random(seed)
    prefixes = [tokens(rng.randint(50, 120), base=5000 * k) for k in range(3)]
    running: dict[str, Request] = {}
    replayed = 0
    for i in range(num_ops):
        if running and rng.random() < 0.6:
            rid = rng.choice(sorted(running))
            req = running[rid]
            if req.num_computed_tokens >= req.num_tokens:
                req.append_output_tokens(rng.randint(1, 30000))
            n = min(req.num_tokens - req.num_computed_tokens, rng.randint(1, 24))
            if mgr.allocate_slots(req, n) is None or rng.random() < 0.1:
                mgr.free(req)
                del running[rid]
            else:
                req.num_computed_tokens += n
        else:
            prompt = rng.choice(prefixes) + tokens(rng.randint(1, 40), base=100 + i)
            req = mgr.new_request(f"r{i}", prompt)
            hit = mgr.get_computed_blocks(req)
            h = hit.num_computed_tokens
            if explain:
                why = mgr.component(Observer).explain_lookup(req)
                assert why.num_hit_tokens == h, why
                assert sum(x.end - x.start for x in why.segments if x.reason is Reason.HIT) == h
            use_hit = h > WINDOW
            start = h - WINDOW if use_hit else 0
            scheduled = rng.randint(1, len(prompt) - start)
            past_hit = max(start + scheduled - h, 0) if use_hit else scheduled
            out = mgr.allocate_slots(req, past_hit, new_computed_blocks=hit if use_hit else None)
            if out is not None:
                replayed += use_hit
                req.num_computed_tokens = start + scheduled
                running[req.request_id] = req
        mgr.check_invariants()
    return replayed


@pytest.mark.parametrize("seed", range(4))
def test_random_replays_keep_the_invariants(seed: int) -> None:
    layouts = ([full(BS), swa_mla()], [mla(BS), swa_mla(), full(BS)])
    mgr = make_mgr(layouts[seed % 2], num_blocks=120)
    assert _random_run(mgr, seed, 400) > 40


@pytest.mark.parametrize("seed", range(2))
def test_miss_attribution_leaves_the_replayed_group_out(seed: int) -> None:
    """The observer replays the coordinator's lookup to say who shortened a hit: the
    replayed group never does (it takes no part in lookups), so its explanation of every
    lookup carries exactly the hit."""
    mgr = make_mgr([full(BS), swa_mla()], num_blocks=48, observe=ObserveConfig())
    assert _random_run(mgr, seed, 300, explain=True) > 10


def test_the_cluster_router_mirrors_the_replayed_group() -> None:
    """The router's rules: full attention decides, the replayed group (which the index
    never holds a block of) never lowers the hit; a model of replayed groups only is not
    one the router can route."""
    from pagedkv import UnsupportedModelError
    from pagedkv.cluster.hit_rules import ReplayRule, hybrid_hit_blocks, rules_for

    rules = rules_for([full(BS), swa_mla()])
    assert isinstance(rules[1], ReplayRule)
    assert hybrid_hit_blocks(rules, [set(range(6)), set()], max_blocks=6) == 6
    assert hybrid_hit_blocks(rules, [{0, 1, 3}, set()], max_blocks=6) == 2
    with pytest.raises(UnsupportedModelError, match="every group replays"):
        rules_for([swa_mla()])
