"""Randomized: the host tier on hybrid layouts against a plainly written reference.

Random admissions (loading the host part or not), decode steps, frees, store and load
completions (either outcome) on full attention + sliding window 8 (or chunked local 8) +
Mamba. The reference, written from the attention kinds' definitions and not from the
managers' rules, keeps the set of host keys (a store plan's keys are ready once it
completes successfully; the host is large enough never to evict) and, at every lookup,
tries every hit length from the device hit upwards: a length of E blocks is valid when
each group is served at the positions it reads (full attention: 0 .. E-1; window w: from
``(4E - w + 1) // 4``; chunk c: from the chunk start of token 4E; Mamba: E - 1), by the
device hit before its end and by a ready host key after it. Checked at every step: the
lookup (length and every group's host blocks), each load's device targets (the table
positions, Mamba's live block), the host tier's key set, and ``check_invariants()``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    MambaSpec,
    SlidingWindowSpec,
)
from pagedkv.host import HostTierConfig, StoreOnEviction, WriteThrough

BS = 4
W = 8  # window and chunk, in tokens
HEADS = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}


def needed(kind: str, e: int) -> range:
    """Table positions a hit of ``e`` blocks reads in a group of ``kind``."""
    if kind == "full":
        return range(0, e)
    if kind == "window":
        return range(max(0, e * BS - W + 1) // BS, e)
    if kind == "chunked":
        return range(e * BS // W * W // BS, e)
    return range(e - 1, e)  # mamba: the state after e blocks


class Reference:
    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        self.ready: set[tuple[bytes, int]] = set()

    def longest(self, hashes: list[bytes], device: tuple[list[int], ...], d: int,
                num_tokens: int) -> int:
        best = d
        for e in range(d + 1, min((num_tokens - 1) // BS, len(hashes)) + 1):
            if all(all((device[g][p] if p < d else (hashes[p], g) in self.ready)
                       for p in needed(kind, e))
                   for g, kind in enumerate(self.kinds)):
                best = e
        return best

    def host_part(self, hashes: list[bytes], d: int, e: int) -> list[list[bytes]]:
        return [[hashes[p] for p in needed(kind, e) if p >= d] for kind in self.kinds]


def _manager(middle: str, write_through: bool) -> KVCacheManager:
    mid = (SlidingWindowSpec(block_size=BS, sliding_window=W, **HEADS) if middle == "window"
           else ChunkedLocalAttentionSpec(block_size=BS, attention_chunk_size=W, **HEADS))
    policy = WriteThrough() if write_through else StoreOnEviction()
    return KVCacheManager(CacheConfig(
        groups=(FullAttentionSpec(block_size=BS, **HEADS), mid,
                MambaSpec(block_size=BS, state_bytes=64)),
        num_blocks=22, max_model_len=96,
        host_tier=HostTierConfig(num_blocks=4000, write_policy=policy)))


class Driver:
    def __init__(self, seed: int, middle: str, write_through: bool) -> None:
        self.rng = random.Random(seed)
        self.mgr = _manager(middle, write_through)
        self.ref = Reference(["full", middle, "mamba"])
        self.live: dict[str, Any] = {}
        self.loading: dict[str, Any] = {}
        self.stores: list[Any] = []
        rng = self.rng
        self.families = [[rng.randrange(500) for _ in range(40)] for _ in range(3)]
        self.n = 0
        self.loads = 0
        self.loads_after_device_hit = 0

    def admit(self) -> None:
        rng = self.rng
        mgr = self.mgr
        rid = f"r{self.n}"
        self.n += 1
        tokens = rng.choice(self.families)[:rng.randrange(5, 40)] + [rng.randrange(500)]
        req = mgr.new_request(rid, tokens)
        hit = mgr.host.lookup(req)
        d = hit.num_device_tokens // BS
        e = self.ref.longest(req.block_hashes, hit.device.block_ids, d, req.num_tokens)
        assert hit.num_computed_tokens == e * BS
        want = self.ref.host_part(req.block_hashes, d, e)
        assert [[h for h, _ in keys] for keys in hit.host.keys] == want
        use_host = rng.random() < 0.8
        chosen = hit if use_host else hit.device
        # the whole rest of the prompt, or a first chunk of whole blocks (a Mamba state is
        # cached where a step ends on a block boundary)
        todo = req.num_tokens - chosen.num_computed_tokens
        n = todo if todo <= BS or rng.random() < 0.3 else rng.randrange(1, todo // BS + 1) * BS
        if mgr.allocate_slots(req, n, new_computed_blocks=chosen) is None:
            return
        self.live[rid] = req
        loads = mgr.host.take_load_plans()
        if use_host and hit.num_host_tokens:
            (plan,) = loads
            self._check_targets(rid, plan, e)
            self.loading[rid] = (req, plan, n)
            self.loads += 1
            self.loads_after_device_hit += plan.num_device_tokens > 0
        else:
            assert loads == []
            req.num_computed_tokens = chosen.num_computed_tokens + n

    def _check_targets(self, rid: str, plan: Any, e: int) -> None:
        for gl, m in zip(plan.groups, self.mgr.managers, strict=True):
            table = m.req_to_blocks[rid]
            n = len(gl.host_block_ids)
            if gl.group == 2:  # Mamba: the loaded state's own block, as vLLM's
                assert (gl.first_block, gl.device_block_ids) == (e - 1, (table[e - 1],))
            else:
                assert gl.first_block == e - n
                assert gl.device_block_ids == tuple(table[e - n:e])
            assert all(gl.device_block_ids)

    def step(self) -> None:
        rng = self.rng
        mgr = self.mgr
        idle = sorted(r for r in self.live if r not in self.loading)
        x = rng.random()
        if x < 0.4 or not self.live:
            self.admit()
        elif x < 0.6 and idle:
            rid = rng.choice(idle)
            req = self.live[rid]
            if req.num_computed_tokens < req.num_tokens:
                n = req.num_tokens - req.num_computed_tokens
            else:
                req.append_output_tokens(rng.randrange(500))
                n = 1
            if mgr.allocate_slots(req, n) is not None:
                req.num_computed_tokens += n
        elif x < 0.75 and idle:
            mgr.free(self.live.pop(rng.choice(idle)))
        elif self.loading and x < 0.9:
            rid = rng.choice(sorted(self.loading))
            req, plan, n = self.loading.pop(rid)
            ok = rng.random() < 0.8
            if ok:
                req.num_computed_tokens = plan.num_computed_tokens + n
            mgr.host.complete_load(plan, ok)
            if not ok:
                # the Mamba group dropped the device hit's state for the host one
                assert plan.resumable == (plan.num_device_tokens == 0)
                mgr.free(self.live.pop(rid))
        self.stores.extend(mgr.host.take_store_plans())
        if self.stores and rng.random() < 0.7:
            plan = self.stores.pop(rng.randrange(len(self.stores)))
            ok = rng.random() < 0.85
            mgr.host.complete_store(plan, ok)
            if ok:
                self.ref.ready |= {(h, gs.group) for gs in plan.groups for h in gs.block_hashes}
        mgr.new_step_starts()
        mgr.check_invariants()
        entries = mgr.host.tier.pool.entries
        assert {k for k, v in entries.items() if v.ready} == self.ref.ready


MIDDLES = ("window", "chunked")
SEEDS = range(8)
STEPS = 200


def _run(seed: int, middle: str, write_through: bool) -> Driver:
    driver = Driver(seed, middle, write_through)
    for _ in range(STEPS):
        driver.step()
    return driver


@pytest.mark.parametrize("middle", MIDDLES)
@pytest.mark.parametrize("write_through", [False, True], ids=["on_eviction", "write_through"])
@pytest.mark.parametrize("seed", SEEDS)
def test_hybrid_host_tier_matches_the_reference(middle: str, write_through: bool,
                                                seed: int) -> None:
    driver = _run(seed, middle, write_through)
    assert driver.loads > 0, "no host load happened: the test exercises nothing"


if __name__ == "__main__":  # the counts docs/host_tier.md quotes
    runs = [_run(s, m, w) for m in MIDDLES for w in (False, True) for s in SEEDS]
    print(f"{len(runs)} runs of {STEPS} steps: {sum(d.loads for d in runs)} loads, "
          f"{sum(d.loads_after_device_hit for d in runs)} continuing a device hit")
