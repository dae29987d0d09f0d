"""Hypothesis stateful test: random invalid calls (wrong ids, foreign or stale hits, bad
counts, bad computed-token counts) thrown between the valid operations of the reference
model test. Every invalid call must raise a :class:`pagedkv.PagedKVError`, leave
``debug_state()`` byte-identical, and the manager must go on agreeing with the reference
model (``agrees_with_reference`` runs after every step)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from test_core_stateful import BS, NUM_BLOCKS, PREFIXES, ManagerVsReference

from pagedkv import ComputedBlocks, FullAttentionSpec, KVCacheManager, PagedKVError, Request

BAD_COUNTS: list[Any] = [-1, 3.5, "2", None, True, 10**9, [1]]
MISUSES = ["duplicate_id_allocate", "duplicate_id_new", "duplicate_id_free", "foreign_hit",
           "other_requests_hit", "hit_for_running", "bad_num_new", "bad_lookahead",
           "bad_external", "bad_computed", "freed_with_computed", "id_not_request",
           "forged_hit"]


class MisuseBetweenValidOps(ManagerVsReference):
    def __init__(self) -> None:
        super().__init__()
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=4, dtype_bytes=2)
        # A second manager that has cached every prefix: its hits are foreign here.
        self.other = KVCacheManager.from_spec(spec, num_blocks=NUM_BLOCKS, max_model_len=64)
        for k, prefix in enumerate(PREFIXES[:2]):
            r = self.other.new_request(f"seed{k}", [*prefix, 9])
            assert self.other.allocate_slots(r, r.num_tokens) is not None
            self.other.free(r)
        self.issued: list[tuple[Request, ComputedBlocks]] = []

    @initialize()
    def start_busy(self) -> None:
        """One running and one waiting request, so every misuse has a target at once."""
        self.new_request(0, [1, 2, 3])
        self.admit(0)
        self.new_request(0, [3, 2])  # shares r1's prefix: its lookup hits
        self.new_request(1, [3, 2])
        self.look_up_only(0)

    def _misuse(self, kind: str, i: int, bad: Any) -> Callable[[], Any] | None:
        mgr = self.mgr
        running = self.running[i % len(self.running)] if self.running else None
        waiting = self.waiting[i % len(self.waiting)] if self.waiting else None
        if kind == "duplicate_id_allocate" and running is not None:
            return lambda: mgr.allocate_slots(Request(running.request_id, [1, 2, 3]), 3)
        if kind == "duplicate_id_new" and running is not None:
            return lambda: mgr.new_request(running.request_id, [1, 2, 3])
        if kind == "duplicate_id_free" and running is not None:
            return lambda: mgr.free(Request(running.request_id, [1, 2, 3]))
        if kind == "foreign_hit" and waiting is not None:
            hit = self.other.get_computed_blocks(
                Request(waiting.request_id, list(waiting.all_token_ids),
                        hasher=self.other.hasher))
            if hit.num_computed_tokens:
                return lambda: mgr.allocate_slots(waiting, 1, new_computed_blocks=hit)
        if kind == "other_requests_hit" and waiting is not None and self.issued:
            owner, hit = self.issued[i % len(self.issued)]
            if owner is not waiting and hit.num_computed_tokens:
                return lambda: mgr.allocate_slots(waiting, 1, new_computed_blocks=hit)
        if kind == "hit_for_running" and running is not None and self.issued:
            _, hit = self.issued[i % len(self.issued)]
            if hit.num_computed_tokens:
                return lambda: mgr.allocate_slots(running, 1, new_computed_blocks=hit)
        if kind == "forged_hit" and waiting is not None:
            blocks = [(i + k) % NUM_BLOCKS for k in range(1, 3)]
            hit = ComputedBlocks((blocks,), 2 * BS, mgr.issuer_token, waiting.request_id)
            if waiting.num_tokens > 2 * BS and [mgr.pool.block_hash[b] for b in blocks] != (
                    waiting.block_hashes[:2]):
                return lambda: mgr.allocate_slots(waiting, 1, new_computed_blocks=hit)
        if kind == "bad_num_new" and running is not None:
            return lambda: mgr.allocate_slots(running, bad)
        if kind == "bad_lookahead" and running is not None and bad is not None:
            return lambda: mgr.allocate_slots(running, 1, num_lookahead_tokens=bad)
        if kind == "bad_external" and waiting is not None and bad is not None:
            return lambda: mgr.allocate_slots(waiting, 1, num_external_computed_tokens=bad)
        if kind == "bad_computed" and running is not None and bad is not None:
            def call() -> Any:
                saved = running.num_computed_tokens
                running.num_computed_tokens = bad if bad != 3.5 else running.num_tokens + 5
                try:
                    return mgr.allocate_slots(running, 1)
                finally:
                    running.num_computed_tokens = saved
            return call
        if kind == "freed_with_computed" and waiting is not None:
            def call2() -> Any:
                waiting.num_computed_tokens = 1
                try:
                    return mgr.allocate_slots(waiting, 1)
                finally:
                    waiting.num_computed_tokens = 0
            return call2
        if kind == "id_not_request" and running is not None:
            return lambda: mgr.allocate_slots(running.request_id, 1)  # type: ignore[arg-type]
        return None

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100))
    def look_up_only(self, i: int) -> None:
        """A lookup whose hit is kept for later misuse (lookups change only statistics)."""
        req = self.waiting[i % len(self.waiting)]
        self.issued.append((req, self.mgr.get_computed_blocks(req)))

    @rule(kind=st.sampled_from(MISUSES), i=st.integers(0, 100), bad=st.sampled_from(BAD_COUNTS))
    def misuse(self, kind: str, i: int, bad: Any) -> None:
        self._try(kind, i, bad)

    @precondition(lambda self: self.running)
    @rule(kind=st.sampled_from(MISUSES), i=st.integers(0, 100), bad=st.sampled_from(BAD_COUNTS))
    def misuse_while_running(self, kind: str, i: int, bad: Any) -> None:
        self._try(kind, i, bad)

    def _try(self, kind: str, i: int, bad: Any) -> None:
        call = self._misuse(kind, i, bad)
        if call is None:
            return
        before = repr(self.mgr.debug_state())
        with pytest.raises(PagedKVError):
            call()
        event(f"misuse: {kind}")
        assert repr(self.mgr.debug_state()) == before, kind


TestMisuseBetweenValidOps = MisuseBetweenValidOps.TestCase
TestMisuseBetweenValidOps.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
