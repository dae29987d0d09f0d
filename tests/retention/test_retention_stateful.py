"""Hypothesis stateful test: the manager with retention (priorities, durations, pins with
leases on a fake clock, tenant quotas) against a plain reference model.

The reference restates docs/retention.md with dicts and sorting: every free block has an
eviction key ``(class, level, sequence)`` (class: unhashed, over quota, level, pinned) and
eviction takes the smallest keys; expiries are processed eagerly, in time order, before
each step. After every step the manager must agree with it on hits, new block ids, the
eviction order, the parked blocks and every ref count, and ``check_invariants()`` must
pass. Times are chosen so no two expiries coincide (durations end in .5 / .25, lease TTLs
in .75, the clock moves by whole seconds).

Without quotas a retention pool starts in *uniform mode* (vLLM's single queue, a block
losing its hash stays in place) until the first request carrying retention is freed or
the first pin succeeds; ``UniformFirstVsReference`` runs that path (mostly plain
requests, some with retention) and the reference converts at the same moment.
"""

from __future__ import annotations

from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from retention_support import FakeClock

from pagedkv import CacheConfig, FullAttentionSpec, HashExtras, KVCacheManager, Request
from pagedkv.errors import PinBudgetError
from pagedkv.retention import RequestRetention, RetentionConfig, TokenRangeRetention

BS = 4
NUM_BLOCKS = 12
DEFAULT = 35
PREFIXES = [[1000 + i for i in range(12)], [2000 + i for i in range(8)], []]
SALTS = [None, "a"]
QUOTAS: dict[str | None, int] = {"a": 2}
RETENTIONS = [
    None,
    RequestRetention(ranges=(TokenRangeRetention(token_end=8, priority=80, duration_s=1.5),),
                     decode_priority=10),
    RequestRetention(ranges=(TokenRangeRetention(priority=20),), decode_priority=60,
                     decode_duration_s=2.25),
]
UNHASHED, OVER, LEVEL, PINNED = 0, 1, 2, 3


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plain_block_retention(r: RequestRetention, i: int, num_prompt: int) -> tuple[int, Any]:
    """Token by token: a token's (priority, duration) is its best range (or the default,
    or the decode setting); the block takes the best of its tokens."""
    def rank(pd: tuple[int, Any]) -> tuple[int, float]:
        return pd[0], float("inf") if pd[1] is None else pd[1]

    best: tuple[int, Any] | None = None
    for t in range(i * BS, (i + 1) * BS):
        if t >= num_prompt:
            cand = (r.decode_priority, r.decode_duration_s)
        else:
            covering = [(x.priority, x.duration_s) for x in r.ranges
                        if x.token_start <= t < (num_prompt if x.token_end is None
                                                 else min(x.token_end, num_prompt))]
            cand = max(covering, key=rank) if covering else (r.default_priority, None)
        if best is None or rank(cand) > rank(best):
            best = cand
    assert best is not None
    return best


class Lease:
    def __init__(self, lid: int, keys: list[bytes], ttl: float, expires: float,
                 refresh: bool) -> None:
        self.lid, self.keys, self.ttl, self.expires, self.refresh = lid, keys, ttl, expires, refresh


class Reference:
    """Retention rules, written plainly."""

    def __init__(self, num_blocks: int, preempt: bool, quotas: dict[str | None, int],
                 budget: int) -> None:
        self.preempt, self.quotas, self.budget = preempt, quotas, budget
        #: Uniform mode: no quotas, and no retention or pin used yet.
        self.uniform = not quotas
        self.now = 0.0
        self.ref = dict.fromkeys(range(1, num_blocks), 0)
        self.hash_of: dict[int, bytes] = {}
        self.index: dict[bytes, list[int]] = {}
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}
        self.prio = dict.fromkeys(range(1, num_blocks), DEFAULT)
        self.dur: dict[int, Any] = dict.fromkeys(range(1, num_blocks))
        self.tenant: dict[int, Any] = {}
        self.expires: dict[int, float] = {}
        # free block -> (class, level, seq); parked blocks map to None
        self.free: dict[int, Any] = {b: (UNHASHED, 0, b) for b in range(1, num_blocks)}
        self.seq = num_blocks
        self.front_seq = 0
        self.leases: dict[int, Lease] = {}
        self.next_lid = 0
        self.park_order: dict[int, int] = {}

    # ------------------------------------------------------------ helpers
    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def pinned_keys(self) -> set[bytes]:
        return {k for lease in self.leases.values() for k in lease.keys}

    def is_pinned(self, b: int) -> bool:
        return b in self.hash_of and self.hash_of[b] in self.pinned_keys()

    def order(self) -> list[int]:
        return sorted((b for b, k in self.free.items() if k is not None),
                      key=lambda b: self.free[b])

    def parked(self) -> set[int]:
        return {b for b, k in self.free.items() if k is None}

    def place(self, b: int) -> None:
        """b (hashed) becomes evictable-or-parked now."""
        if self.is_pinned(b):
            self.free[b] = (PINNED, 0, self.next_seq()) if self.preempt else None
            self.park_order[b] = self.next_seq()
            return
        p = self.prio[b]
        self.free[b] = (LEVEL, p, self.next_seq())
        self.expires.pop(b, None)
        if self.dur[b] is not None and p != DEFAULT:
            self.expires[b] = self.now + self.dur[b]
        t = self.tenant.get(b, "-")
        if t in self.quotas:
            mine = [x for x, k in self.free.items()
                    if k is not None and k[0] == LEVEL and self.tenant.get(x, "-") == t]
            while len(mine) > self.quotas[t]:
                victim = min(mine, key=lambda x: self.free[x][1:])
                mine.remove(victim)
                self.free[victim] = (OVER, 0, self.next_seq())
                self.expires.pop(victim, None)

    def convert(self) -> None:
        """Leave uniform mode: free blocks that lost their hash in place join the
        unhashed class, keeping their order."""
        if not self.uniform:
            return
        self.uniform = False
        for b, k in self.free.items():
            if k is not None and k[0] == LEVEL and b not in self.hash_of:
                self.free[b] = (UNHASHED, 0, k[2])

    def unfree(self, b: int) -> None:
        del self.free[b]
        self.expires.pop(b, None)

    def uncache(self, b: int) -> None:
        h = self.hash_of.pop(b)
        self.index[h].remove(b)
        if not self.index[h]:
            del self.index[h]
        self.tenant.pop(b, None)
        self.prio[b], self.dur[b] = DEFAULT, None

    def advance(self, now: float) -> None:
        self.now = now
        while True:
            due: list[tuple[float, int, Any]] = []
            for lease in self.leases.values():
                if lease.expires <= now:
                    due.append((lease.expires, 0, lease))
            for b, t in self.expires.items():
                if t <= now:
                    due.append((t, 1, b))
            if not due:
                return
            t, kind, what = min(due, key=lambda x: (x[0], x[1], getattr(x[2], "lid", 0),
                                                    self.free.get(x[2], (0, 0, 0))
                                                    if x[1] else 0))
            saved, self.now = self.now, t
            if kind == 0:
                self.release(what)
            else:
                b = what
                del self.expires[b]
                self.prio[b], self.dur[b] = DEFAULT, None
                self.place(b)
            self.now = saved

    # ------------------------------------------------------------ operations
    def lookup(self, hashes: list[bytes], num_tokens: int) -> list[int]:
        out = []
        for h in hashes[: (num_tokens - 1) // BS]:
            if not self.index.get(h):
                break
            out.append(self.index[h][0])
        return out

    def allocate(self, rid: str, hit: list[int], num_tokens: int, hashes: list[bytes],
                 salt: Any) -> list[int] | None:
        table = self.tables.get(rid, [])
        need = cdiv(num_tokens, BS) - len(table) - len(hit)
        need += sum(1 for b in hit if self.ref[b] == 0)
        order = self.order()
        if need > len(order):
            return None
        for b in hit:
            if self.ref[b] == 0:
                self.unfree(b)
                if self.is_pinned(b):
                    self.refresh(self.hash_of[b])
            elif self.is_pinned(b):
                self.refresh(self.hash_of[b])
            self.ref[b] += 1
        if rid not in self.tables:
            self.tables[rid] = list(hit)
            self.num_cached[rid] = len(hit)
        table = self.tables[rid]
        n_new = max(0, cdiv(num_tokens, BS) - len(table))
        new = self.order()[:n_new]
        for b in new:
            self.unfree(b)
            if b in self.hash_of:
                self.uncache(b)
            self.prio[b], self.dur[b] = DEFAULT, None
            self.tenant.pop(b, None)
            self.ref[b] = 1
        table.extend(new)
        num_full = num_tokens // BS
        for i in range(self.num_cached[rid], num_full):
            b = table[i]
            self.hash_of[b] = hashes[i]
            self.index.setdefault(hashes[i], []).append(b)
            self.tenant[b] = salt
        self.num_cached[rid] = max(self.num_cached[rid], num_full)
        return new

    def refresh(self, key: bytes) -> None:
        for lease in self.leases.values():
            if lease.refresh and key in lease.keys:
                lease.expires = self.now + lease.ttl

    def release_request(self, rid: str, retention: Any, num_prompt: int) -> None:
        table = self.tables.pop(rid, [])
        if retention is not None:
            self.convert()
            for i, b in enumerate(table):
                self.prio[b], self.dur[b] = plain_block_retention(retention, i, num_prompt)
        front, back = [], []
        for b in reversed(table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (back if b in self.hash_of else front).append(b)
        self.num_cached.pop(rid, None)
        for b in reversed(front):
            self.front_seq -= 1
            self.free[b] = (UNHASHED, 0, self.front_seq)
        for b in back:
            self.place(b)

    def evict(self, ids: list[int]) -> None:
        for b in ids:
            if b in self.hash_of:
                self.uncache(b)
                if b in self.free and not self.uniform:  # uniform: stays in place
                    self.expires.pop(b, None)
                    self.free[b] = (UNHASHED, 0, self.next_seq())

    def reset(self) -> bool:
        if any(self.ref.values()):
            return False
        everything = self.order() + sorted(self.parked(), key=self.park_order.get)
        for b in list(self.hash_of):
            self.uncache(b)
        self.expires.clear()
        for b in everything:
            self.free[b] = (UNHASHED, 0, self.next_seq())
        return True

    def pin(self, keys: list[bytes], ttl: float, refresh: bool) -> bool:
        keys = list(dict.fromkeys(keys))
        if not keys:
            return False
        if len(self.pinned_keys() | set(keys)) > self.budget:
            return False
        self.convert()
        self.next_lid += 1
        before = self.pinned_keys()
        self.leases[self.next_lid] = Lease(self.next_lid, keys, ttl, self.now + ttl, refresh)
        for k in keys:
            if k in before:
                continue
            for b in self.index.get(k, []):
                if b in self.free:
                    self.expires.pop(b, None)
                    self.free[b] = (PINNED, 0, self.next_seq()) if self.preempt else None
                    self.park_order[b] = self.next_seq()
        return True

    def release(self, lease: Lease) -> None:
        if lease.lid not in self.leases:
            return
        del self.leases[lease.lid]
        still = self.pinned_keys()
        for k in lease.keys:
            if k in still:
                continue
            for b in self.index.get(k, []):
                if b in self.free:
                    self.place(b)


class RetentionVsReference(RuleBasedStateMachine):
    PREEMPT = False
    QUOTAS: ClassVar[dict[str | None, int]] = QUOTAS
    #: What new requests carry, picked by index (``i % len``).
    RETENTION_CHOICES: ClassVar[list[RequestRetention | None]] = RETENTIONS
    #: Pins start once this many requests were created.
    PINS_AFTER_REQUESTS = 0

    def __init__(self) -> None:
        super().__init__()
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=4, dtype_bytes=2)
        self.clock = FakeClock()
        cfg = RetentionConfig(clock=self.clock, preempt_pins=self.PREEMPT,
                              tenant_quota_blocks=self.QUOTAS, pin_budget_fraction=0.4)
        self.mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=NUM_BLOCKS,
                                              max_model_len=64, retention=cfg))
        assert self.mgr.retention is not None
        self.ref = Reference(NUM_BLOCKS, self.PREEMPT, self.QUOTAS,
                             self.mgr.retention.pin_budget_blocks)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.leases: list[tuple[Any, Lease]] = []
        self.counter = 0

    def salt(self, req: Request) -> Any:
        return req.hash_extras.cache_salt if req.hash_extras is not None else None

    @rule(dt=st.integers(1, 3))
    def advance(self, dt: int) -> None:
        self.clock.now += dt
        self.ref.advance(self.clock.now)

    @rule(prefix=st.sampled_from(range(len(PREFIXES))), salt=st.sampled_from(SALTS),
          choice=st.integers(0, 5),
          suffix=st.lists(st.integers(0, 3), min_size=1, max_size=9))
    def new_request(self, prefix: int, salt: Any, choice: int, suffix: list[int]) -> None:
        retention = self.RETENTION_CHOICES[choice % len(self.RETENTION_CHOICES)]
        self.counter += 1
        extras = HashExtras(cache_salt=salt) if salt is not None else None
        req = self.mgr.new_request(f"r{self.counter}", PREFIXES[prefix] + suffix,
                                   hash_extras=extras, retention=retention)
        self.waiting.append(req)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100))
    def admit(self, i: int) -> None:
        req = self.waiting[i % len(self.waiting)]
        hit = self.mgr.get_computed_blocks(req)
        expected_hit = self.ref.lookup(req.block_hashes, req.num_tokens)
        assert hit.block_ids == (expected_hit,)
        new = self.mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                                      new_computed_blocks=hit)
        expected = self.ref.allocate(req.request_id, expected_hit, req.num_tokens,
                                     req.block_hashes, self.salt(req))
        assert (None if new is None else new[0]) == expected
        if new is not None:
            req.num_computed_tokens = req.num_tokens
            self.waiting.remove(req)
            self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), token=st.integers(0, 3))
    def decode(self, i: int, token: int) -> None:
        req = self.running[i % len(self.running)]
        if req.num_tokens >= 40:
            return
        req.append_output_tokens(token)
        new = self.mgr.allocate_slots(req, 1)
        expected = self.ref.allocate(req.request_id, [], req.num_tokens, req.block_hashes,
                                     self.salt(req))
        assert (None if new is None else new[0]) == expected
        if new is not None:
            req.num_computed_tokens += 1
        else:
            self.release(req)
            req.num_computed_tokens = 0
            req.num_preemptions += 1
            self.waiting.append(req)

    def release(self, req: Request) -> None:
        self.mgr.free(req)
        self.ref.release_request(req.request_id, req.retention, req.num_prompt_tokens)
        self.running.remove(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def finish(self, i: int) -> None:
        self.release(self.running[i % len(self.running)])

    @rule()
    def reset(self) -> None:
        assert self.mgr.reset_prefix_cache() == self.ref.reset()

    @rule(ids=st.lists(st.integers(0, NUM_BLOCKS - 1), max_size=3))
    def evict(self, ids: list[int]) -> None:
        self.mgr.evict_blocks(ids)
        self.ref.evict([b for b in ids if b])

    @precondition(lambda self: any(b in self.ref.hash_of for b in self.ref.free))
    @rule(i=st.integers(0, 100))
    def evict_cached(self, i: int) -> None:
        """Drop the hash of a free cached block (moves it, except in uniform mode)."""
        cached = sorted(b for b in self.ref.free if b in self.ref.hash_of)
        self.evict([cached[i % len(cached)]])

    @precondition(lambda self: self.counter >= self.PINS_AFTER_REQUESTS)
    @rule(prefix=st.sampled_from([0, 1]), salt=st.sampled_from(SALTS),
          num_blocks=st.integers(1, 3), ttl=st.sampled_from([1.75, 3.75]),
          refresh=st.booleans())
    def pin(self, prefix: int, salt: Any, num_blocks: int, ttl: float, refresh: bool) -> None:
        assert self.mgr.retention is not None
        extras = HashExtras(cache_salt=salt) if salt is not None else None
        hashes = self.mgr.new_request("p", PREFIXES[prefix] + [0],
                                      hash_extras=extras).block_hashes[:num_blocks]
        try:
            lease = self.mgr.retention.pin(hashes, ttl_s=ttl, refresh_on_hit=refresh)
        except PinBudgetError:
            assert not self.ref.pin(hashes, ttl, refresh)
            return
        assert self.ref.pin(hashes, ttl, refresh)
        self.leases.append((lease, self.ref.leases[self.ref.next_lid]))

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 100))
    def unpin(self, i: int) -> None:
        assert self.mgr.retention is not None
        lease, ref_lease = self.leases.pop(i % len(self.leases))
        self.mgr.retention.unpin(lease)
        self.ref.release(ref_lease)

    @invariant()
    def agrees_with_reference(self) -> None:
        self.mgr.num_free_blocks  # noqa: B018 - a read lets due expiries take effect
        self.mgr.check_invariants()
        state: dict[str, Any] = self.mgr.debug_state()
        pool = state["pool"]
        assert pool["free_queue"] == self.ref.order()
        assert set(pool["retention"]["parked"]) == self.ref.parked()
        assert pool["ref_cnt"][1:] == [self.ref.ref[b] for b in range(1, NUM_BLOCKS)]
        assert state["block_tables"][0] == self.ref.tables
        cached = {b: h for b, h in enumerate(pool["block_hash"]) if h is not None}
        assert cached == self.ref.hash_of
        assert set(pool["retention"]["pinned_keys"]) == {
            (0, k) for k in self.ref.pinned_keys()}
        assert pool["retention"]["uniform"] == self.ref.uniform


class PreemptPinsVsReference(RetentionVsReference):
    PREEMPT = True


class UniformFirstVsReference(RetentionVsReference):
    """No quotas: the pool starts in uniform mode; most requests carry no retention."""

    QUOTAS: ClassVar[dict[str | None, int]] = {}
    RETENTION_CHOICES: ClassVar[list[RequestRetention | None]] = [None, None, None, None,
                                                                  *RETENTIONS[1:]]
    PINS_AFTER_REQUESTS = 8


SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestRetentionVsReference = RetentionVsReference.TestCase
TestRetentionVsReference.settings = SETTINGS
TestPreemptPinsVsReference = PreemptPinsVsReference.TestCase
TestPreemptPinsVsReference.settings = SETTINGS
TestUniformFirstVsReference = UniformFirstVsReference.TestCase
TestUniformFirstVsReference.settings = SETTINGS
