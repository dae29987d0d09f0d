"""Hypothesis stateful test: the host-tiered manager against the plain two-tier reference
model (host_reference.py). After every step both agree on the lookup (the longest hit
across tiers: device blocks, then host blocks), new block ids, load and store plans, the
device free order, and the host entries and LRU order; ``check_invariants()`` covers both
tiers."""

from __future__ import annotations

from typing import Any

from host_reference import BS, TwoTierModel
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedkv import CacheConfig, FullAttentionSpec
from pagedkv.host import (
    AdmitAfterHits,
    AdmitAll,
    HostTierConfig,
    HostTieredKVCacheManager,
    StoreOnEviction,
    WriteThrough,
)

FAMILIES = [[1000 + i for i in range(40)], [2000 + i for i in range(40)],
            [1000 + i for i in range(12)] + [3000 + i for i in range(28)]]
NUM_BLOCKS = 14
HOST_BLOCKS = 9


class TwoTiers(RuleBasedStateMachine):
    write_through = False
    min_hits = 0

    def __init__(self) -> None:
        super().__init__()
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2)
        policy = WriteThrough() if self.write_through else StoreOnEviction()
        admission = (AdmitAfterHits(min_hits=self.min_hits, max_tracked_keys=6)
                     if self.min_hits else AdmitAll())
        self.mgr = HostTieredKVCacheManager(
            CacheConfig(groups=(spec,), num_blocks=NUM_BLOCKS, max_model_len=64),
            HostTierConfig(num_blocks=HOST_BLOCKS, write_policy=policy, admission=admission))
        self.model = TwoTierModel(NUM_BLOCKS, HOST_BLOCKS, self.write_through,
                                  self.min_hits, 6)
        self.reqs: dict[str, Any] = {}
        self.stores: list[Any] = []
        self.n = 0

    def _sync_stores(self) -> None:
        got = self.mgr.host.take_store_plans()
        self.stores.extend(got)
        want = self.model.stores
        assert len(self.stores) == len(want)
        for plan, (timing, dev, host, hashes) in zip(self.stores, want, strict=True):
            (g,) = plan.groups
            assert (plan.timing, list(g.device_block_ids), list(g.host_block_ids),
                    list(g.block_hashes)) == (timing, dev, host, hashes)

    @rule(family=st.integers(0, len(FAMILIES) - 1), length=st.integers(2, 40),
          use_host=st.booleans())
    def admit(self, family: int, length: int, use_host: bool) -> None:
        rid = f"r{self.n}"
        self.n += 1
        tokens = FAMILIES[family][:length]
        req = self.mgr.new_request(rid, tokens)
        hit = self.mgr.host.lookup(req)
        dev, host = self.model.best_hit(req.block_hashes, len(tokens))
        assert hit.device.block_ids == (dev,)
        assert list(hit.host.host_block_ids[0]) == host
        if not use_host:
            host = []
        chosen = hit if use_host else hit.device
        n_new = len(tokens) - len(dev) * BS - len(host) * BS
        new = self.mgr.allocate_slots(req, n_new, new_computed_blocks=chosen)
        want = self.model.allocate(rid, req.block_hashes, len(tokens), dev, host)
        assert new == (None if want is None else (want,))
        loads = self.mgr.host.take_load_plans()
        if new is not None:
            self.reqs[rid] = req
            if host:
                (plan,) = loads
                keys, host_ids, dev_ids, done = self.model.loads[rid]
                (g,) = plan.groups
                assert (list(g.host_block_ids), list(g.device_block_ids), g.first_block) == (
                    host_ids, dev_ids, len(dev))
                assert plan.num_device_tokens == done
            else:
                assert loads == []
                req.num_computed_tokens = len(tokens)
        else:
            assert loads == []
        self._sync_stores()

    @precondition(lambda self: any(r not in self.model.loads for r in self.reqs))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(r for r in self.reqs if r not in self.model.loads)))
        self.mgr.free(self.reqs.pop(rid))
        self.model.free_request(rid)

    @precondition(lambda self: bool(self.model.loads))
    @rule(data=st.data(), success=st.booleans())
    def complete_load(self, data: st.DataObject, success: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.model.loads)))
        req = self.reqs[rid]
        plan = self.mgr.host.load_plan(rid)
        if success:
            req.num_computed_tokens = req.num_tokens
        self.mgr.host.complete_load(plan, success)
        self.model.complete_load(rid, req.block_hashes, req.num_computed_tokens, success)
        self._sync_stores()

    @precondition(lambda self: bool(self.stores))
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        i = data.draw(st.integers(0, len(self.stores) - 1))
        self.mgr.host.complete_store(self.stores.pop(i), success)
        self.model.complete_store(i, success)

    @invariant()
    def agree(self) -> None:
        self.mgr.check_invariants()
        state = self.mgr.debug_state()
        assert state["pool"]["free_queue"] == self.model.free
        host = state["host"]
        assert host["lru"] == [(h, 0) for h in self.model.lru]
        assert host["entries"] == {(h, 0): tuple(e) for h, e in self.model.entries.items()}


class TwoTiersWriteThrough(TwoTiers):
    write_through = True


class TwoTiersAdmitAfterHits(TwoTiers):
    min_hits = 1


_SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestTwoTiers = TwoTiers.TestCase
TestTwoTiers.settings = _SETTINGS
TestTwoTiersWriteThrough = TwoTiersWriteThrough.TestCase
TestTwoTiersWriteThrough.settings = _SETTINGS
TestTwoTiersAdmitAfterHits = TwoTiersAdmitAfterHits.TestCase
TestTwoTiersAdmitAfterHits.settings = _SETTINGS
