"""Features combine: every subset of {retention, host tier, observability, events} on a
full-attention, a hybrid (full + sliding window + Mamba), an MLA layout and DeepSeek-V4's
(MLA + sliding-window MLA with bounded replay; no host tier: it refuses that group).

1. Configured but idle (no priorities, pins or quotas; device lookups only): every call
   returns what the plain manager returns — block ids, hits, refusals — and the pools
   match block for block (ref counts, hashes, free-queue order), checked after every
   operation together with ``check_invariants()``.
2. Active: in every combination each feature still does its own job (a pinned prefix
   survives an eviction storm; evicted blocks come back from the host tier; a miss is
   explained as an eviction; stored and removed events are emitted).

On the hybrid layout the host tier serves each group by its own rule (full attention
every block, the window's blocks, the Mamba state at the hit's end), so an evicted
prompt comes back from host memory there too.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from pagedkv import (
    CacheConfig,
    FullAttentionSpec,
    KVCacheManager,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.core.components import ManagerComponent
from pagedkv.core.specs_window_mla import SlidingWindowMLASpec
from pagedkv.host import HostTierConfig
from pagedkv.observe import ObserveConfig
from pagedkv.retention import RetentionConfig

BS = 4
FEATURES = ("retention", "host", "observe", "events")
SUBSETS = [frozenset(c) for n in range(len(FEATURES) + 1)
           for c in itertools.combinations(FEATURES, n)]


def _layout(name: str) -> tuple[object, ...]:
    if name == "full":
        return (FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2),)
    if name == "mla":
        return (MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2),)
    if name == "replay":  # DeepSeek-V4: MLA + sliding-window MLA with bounded replay
        return (MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2),
                SlidingWindowMLASpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2,
                                     sliding_window=8, bounded_replay=True))
    return (FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2),
            SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2,
                              sliding_window=8),
            MambaSpec(block_size=BS, state_bytes=64))


LAYOUTS = ("full", "hybrid", "mla", "replay")


def _config(layout: str, features: frozenset[str], num_blocks: int = 40,
            clock: list[float] | None = None) -> CacheConfig:
    now = clock if clock is not None else [0.0]
    config = CacheConfig(groups=_layout(layout), num_blocks=num_blocks,  # type: ignore[arg-type]
                         max_model_len=256)
    return replace(
        config,
        retention=(RetentionConfig(clock=lambda: now[0], pin_budget_fraction=1.0)
                   if "retention" in features else None),
        host_tier=HostTierConfig(num_blocks=64) if "host" in features else None,
        observe=ObserveConfig(clock=lambda: now[0]) if "observe" in features else None,
        enable_events="events" in features,
    )


def _skip_refused(layout: str, features: frozenset[str]) -> None:
    if layout == "replay" and "host" in features:  # (tests/hybrid/test_hybrid_replay.py)
        pytest.skip("a host tier refuses a never-cached group (ConfigError at construction)")


def _build(layout: str, features: frozenset[str], **kw: object) -> KVCacheManager:
    return KVCacheManager(_config(layout, features, **kw))  # type: ignore[arg-type]


def _pool_view(mgr: KVCacheManager) -> tuple[object, ...]:
    state = mgr.pool.debug_state()
    return state["ref_cnt"], state["block_hash"], state["free_queue"], state["index"]


def _drive(mgrs: list[KVCacheManager], seed: int, num_ops: int = 120) -> None:
    """The same random operations on every manager; every answer must be equal."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(4, 24))] for _ in range(4)]
    live: dict[str, list[object]] = {}
    for op in range(num_ops):
        kind = rng.random()
        if kind < 0.45 or not live:
            rid = f"r{op}"
            tokens = rng.choice(prefixes) + [rng.randrange(1000)
                                             for _ in range(rng.randrange(1, 12))]
            reqs = [m.new_request(rid, tokens) for m in mgrs]
            hits = [m.get_computed_blocks(r) for m, r in zip(mgrs, reqs, strict=True)]
            assert len({(h.num_computed_tokens, tuple(map(tuple, h.block_ids)))
                        for h in hits}) == 1, f"op {op}: hits differ"
            news = [m.allocate_slots(r, r.num_tokens - h.num_computed_tokens,
                                     new_computed_blocks=h)
                    for m, r, h in zip(mgrs, reqs, hits, strict=True)]
            assert all(n == news[0] for n in news), f"op {op}: allocations differ {news}"
            if news[0] is not None:
                for r in reqs:
                    r.num_computed_tokens = r.num_tokens
                live[rid] = reqs
        elif kind < 0.8:
            rid = rng.choice(sorted(live))
            token = rng.randrange(1000)
            news = []
            for m, r in zip(mgrs, live[rid], strict=True):
                r.append_output_tokens(token)  # type: ignore[attr-defined]
                news.append(m.allocate_slots(r, 1))  # type: ignore[arg-type]
            assert all(n == news[0] for n in news), f"op {op}: decode differs {news}"
            if news[0] is None:
                for m in mgrs:
                    m.free(rid)
                del live[rid]
            else:
                for r in live[rid]:
                    r.num_computed_tokens += 1  # type: ignore[attr-defined]
        else:
            rid = rng.choice(sorted(live))
            for m in mgrs:
                m.free(rid)
            del live[rid]
        for m in mgrs:
            m.new_step_starts()
            m.check_invariants()
        views = [_pool_view(m) for m in mgrs]
        assert all(v == views[0] for v in views), f"op {op}: pools differ"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("features", SUBSETS, ids=lambda f: "+".join(sorted(f)) or "none")
def test_idle_components_change_no_block(layout: str, features: frozenset[str]) -> None:
    _skip_refused(layout, features)
    plain = KVCacheManager(_config(layout, frozenset()))
    featured = _build(layout, features)
    assert {c.name for c in featured.components} == {
        {"retention": "retention", "host": "host", "observe": "observe"}[f]
        for f in features if f != "events"}
    _drive([plain, featured], seed=hash((layout, tuple(sorted(features)))) % 1000)


def _prompt(tag: int, n: int = 12) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def _run(mgr: KVCacheManager, rid: str, tokens: list[int]) -> object:
    req = mgr.new_request(rid, tokens)
    hit = mgr.host.lookup(req) if mgr.host is not None else mgr.get_computed_blocks(req)
    assert mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                              new_computed_blocks=hit) is not None
    if mgr.host is not None:
        for plan in mgr.host.take_load_plans():
            mgr.host.complete_load(plan, True)
    req.num_computed_tokens = req.num_tokens
    mgr.free(req)
    if mgr.host is not None:
        for plan in mgr.host.take_store_plans():
            mgr.host.complete_store(plan, True)
    mgr.check_invariants()
    return req


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("features", [s for s in SUBSETS if s],
                         ids=lambda f: "+".join(sorted(f)))
def test_active_features_work_in_every_combination(layout: str,
                                                   features: frozenset[str]) -> None:
    _skip_refused(layout, features)
    clock = [0.0]
    mgr = _build(layout, features, num_blocks=16, clock=clock)
    first = _run(mgr, "sys", _prompt(1))
    if "retention" in features:
        mgr.retention.pin_prefix(first, ttl_s=100.0)
    if "events" in features:
        assert any(type(e).__name__ == "BlockStored" for e in mgr.take_events())
    for k in range(2, 8):  # an eviction storm of unrelated prompts
        _run(mgr, f"storm{k}", _prompt(k))
        if "observe" in features:
            mgr.observe.begin_step()
    # the first prompt plus one token: a hit may then cover all 12 tokens, where the
    # hybrid layout's Mamba group cached its state
    probe = mgr.new_request("probe", [*_prompt(1), 7])
    device_hit = mgr.get_computed_blocks(probe).num_computed_tokens
    if "observe" in features and "retention" not in features:
        labels = {s.label for s in mgr.observe.explain_lookup(probe).segments}
        assert "evicted" in labels, labels
    if "retention" in features:
        # the pinned blocks stayed cached in every group that caches them (a hybrid hit
        # also needs the Mamba state, which this layout does not cache)
        pinned = first.block_hashes[:2]  # type: ignore[attr-defined]
        assert all(h in mgr.pool.index[0] for h in pinned), "the pinned prefix was evicted"
        assert layout == "hybrid" or device_hit >= 8
    elif "host" in features:
        assert device_hit == 0
        hit = mgr.host.lookup(probe)
        assert hit.num_host_tokens == 12, "not stored in the host tier"
        assert mgr.allocate_slots(probe, 1, new_computed_blocks=hit) is not None
        (plan,) = mgr.host.take_load_plans()
        assert plan.num_blocks == {"hybrid": 3 + 2 + 1}.get(layout, 3)
        mgr.host.complete_load(plan, True)
    else:
        assert device_hit == 0
    if "events" in features:
        assert any(type(e).__name__ == "BlockRemoved" for e in mgr.take_events())
    mgr.check_invariants()


def test_a_user_component_attaches_through_config() -> None:
    """The worked case of :mod:`pagedkv.core.components`: a listener counting evictions."""
    from pagedkv.core.components import ManagerBuild, PoolListener

    class Count(PoolListener):
        def __init__(self) -> None:
            self.n = 0

        def evicted(self, blocks: list[tuple[int, bytes, int]]) -> None:
            self.n += len(blocks)

    counter = Count()

    class Spec:
        def attach(self, build: ManagerBuild) -> ManagerComponent:
            build.listeners.append(counter)
            return ManagerComponent("evictions")

    mgr = KVCacheManager(replace(_config("full", frozenset(), num_blocks=8),
                                 components=(Spec(),)))
    for k in range(4):
        _run(mgr, f"r{k}", _prompt(k))
    assert counter.n > 0 and mgr.component(ManagerComponent).name == "evictions"
