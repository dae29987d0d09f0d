"""Hypothesis stateful test: random operation sequences against a simple reference model.

The reference model below restates the SPEC's rules (3.2, 3.4, 3.5, 3.7) with plain lists
and dicts, as slowly and obviously as possible. After every step the manager must agree
with it on hit blocks, new block ids, the free-queue order and every ref count, and
``check_invariants()`` must pass.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedkv import FullAttentionSpec, KVCacheManager, Request

BS = 4
NUM_BLOCKS = 12
PREFIXES = [[1000 + i for i in range(12)], [2000 + i for i in range(8)], []]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class ReferenceCache:
    """The SPEC's block rules, written plainly."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(1, num_blocks))  # front = evicted first
        self.ref = dict.fromkeys(range(1, num_blocks), 0)
        self.hash_of: dict[int, bytes] = {}
        self.index: dict[bytes, list[int]] = {}
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}

    def lookup(self, hashes: list[bytes], num_tokens: int) -> list[int]:
        out = []
        for h in hashes[: (num_tokens - 1) // BS]:
            if not self.index.get(h):
                break
            out.append(self.index[h][0])
        return out

    def _uncache(self, b: int) -> None:
        h = self.hash_of.pop(b)
        self.index[h].remove(b)
        if not self.index[h]:
            del self.index[h]

    def allocate(
        self, rid: str, hit: list[int], num_tokens: int, num_to_cache: int, hashes: list[bytes]
    ) -> list[int] | None:
        table = self.tables.get(rid, [])
        need = cdiv(num_tokens, BS) - len(table) - len(hit)
        need += sum(1 for b in hit if self.ref[b] == 0)
        if need > len(self.free):
            return None
        for b in hit:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        if rid not in self.tables:
            self.tables[rid] = list(hit)
            self.num_cached[rid] = len(hit)
        table = self.tables[rid]
        n_new = max(0, cdiv(num_tokens, BS) - len(table))
        new, self.free = self.free[:n_new], self.free[n_new:]
        for b in new:
            if b in self.hash_of:
                self._uncache(b)
            self.ref[b] = 1
        table.extend(new)
        num_full = num_to_cache // BS
        for i in range(self.num_cached[rid], num_full):
            b = table[i]
            self.hash_of[b] = hashes[i]
            self.index.setdefault(hashes[i], []).append(b)
        self.num_cached[rid] = max(self.num_cached[rid], num_full)
        return new

    def release(self, rid: str) -> None:
        front, back = [], []
        for b in reversed(self.tables.pop(rid, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (back if b in self.hash_of else front).append(b)
        self.num_cached.pop(rid, None)
        self.free = front + self.free + back

    def evict(self, ids: list[int]) -> None:
        for b in ids:
            if b in self.hash_of:
                self._uncache(b)

    def reset(self) -> bool:
        if any(self.ref.values()):
            return False
        self.hash_of.clear()
        self.index.clear()
        return True


class ManagerVsReference(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=4, dtype_bytes=2)
        self.mgr = KVCacheManager.from_spec(spec, num_blocks=NUM_BLOCKS, max_model_len=64)
        self.ref = ReferenceCache(NUM_BLOCKS)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.counter = 0

    @rule(prefix=st.sampled_from(range(len(PREFIXES))),
          suffix=st.lists(st.integers(0, 3), min_size=1, max_size=9))
    def new_request(self, prefix: int, suffix: list[int]) -> None:
        self.counter += 1
        req = self.mgr.new_request(f"r{self.counter}", PREFIXES[prefix] + suffix)
        self.waiting.append(req)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100))
    def admit(self, i: int) -> None:
        req = self.waiting[i % len(self.waiting)]
        hit = self.mgr.get_computed_blocks(req)
        expected_hit = self.ref.lookup(req.block_hashes, req.num_tokens)
        assert hit.block_ids == (expected_hit,)
        assert hit.num_computed_tokens == len(expected_hit) * BS
        n_new = req.num_tokens - hit.num_computed_tokens
        new = self.mgr.allocate_slots(req, n_new, new_computed_blocks=hit)
        expected = self.ref.allocate(
            req.request_id, expected_hit, req.num_tokens, req.num_tokens, req.block_hashes
        )
        assert (None if new is None else new[0]) == expected
        if new is not None:
            req.num_computed_tokens = req.num_tokens
            self.waiting.remove(req)
            self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), token=st.integers(0, 3))
    def decode(self, i: int, token: int) -> None:
        req = self.running[i % len(self.running)]
        if req.num_tokens >= 60:
            return
        req.append_output_tokens(token)
        new = self.mgr.allocate_slots(req, 1)
        expected = self.ref.allocate(
            req.request_id, [], req.num_tokens, req.num_tokens, req.block_hashes
        )
        assert (None if new is None else new[0]) == expected
        if new is not None:
            req.num_computed_tokens += 1
        else:
            self.preempt_request(req)

    def preempt_request(self, req: Request) -> None:
        self.mgr.free(req)
        self.ref.release(req.request_id)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.running.remove(req)
        self.waiting.append(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def finish(self, i: int) -> None:
        req = self.running.pop(i % len(self.running))
        self.mgr.free(req)
        self.ref.release(req.request_id)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def preempt(self, i: int) -> None:
        self.preempt_request(self.running[i % len(self.running)])

    @rule()
    def reset(self) -> None:
        assert self.mgr.reset_prefix_cache() == self.ref.reset()

    @rule(ids=st.lists(st.integers(0, NUM_BLOCKS - 1), max_size=3))
    def evict(self, ids: list[int]) -> None:
        self.mgr.evict_blocks(ids)
        self.ref.evict([b for b in ids if b])

    @invariant()
    def agrees_with_reference(self) -> None:
        self.mgr.check_invariants()
        state: dict[str, Any] = self.mgr.debug_state()
        assert state["pool"]["free_queue"] == self.ref.free
        assert state["pool"]["ref_cnt"][1:] == [self.ref.ref[b] for b in range(1, NUM_BLOCKS)]
        assert state["block_tables"][0] == self.ref.tables
        cached = {b: h for b, h in enumerate(state["pool"]["block_hash"]) if h is not None}
        assert cached == self.ref.hash_of


TestManagerVsReference = ManagerVsReference.TestCase
TestManagerVsReference.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
