"""The host tier on hybrid layouts: every group kind by its own host hit rule.

Layout (as the component matrix): full attention + sliding window 8 + Mamba, block 4; a
second layout swaps the window for chunked-local attention (chunk 8). A host hit of E
blocks needs: full attention every position before E, the window the two positions
before E, chunked local the positions of E's chunk, Mamba the state at E.
"""

from __future__ import annotations

from typing import Any

import pytest
from host_support import Checked, finish_step

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    MambaSpec,
    SlidingWindowSpec,
)
from pagedkv.host import HostTierConfig, LookupState, WriteThrough
from pagedkv.host.rules import ContinuationQuery, find_continuation

BS = 4
HEADS = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}


def groups(middle: str = "window") -> tuple[Any, ...]:
    mid = (SlidingWindowSpec(block_size=BS, sliding_window=8, **HEADS) if middle == "window"
           else ChunkedLocalAttentionSpec(block_size=BS, attention_chunk_size=8, **HEADS))
    return (FullAttentionSpec(block_size=BS, **HEADS), mid,
            MambaSpec(block_size=BS, state_bytes=64))


def make(middle: str = "window", num_blocks: int = 16, **host: Any) -> Any:
    return Checked(KVCacheManager(CacheConfig(
        groups=groups(middle), num_blocks=num_blocks, max_model_len=128,
        host_tier=HostTierConfig(num_blocks=64, **host))))


def compute(m: Any, rid: str, tokens: list[int], chunks: list[int] | None = None) -> Any:
    """Admit ``tokens`` (lookup across tiers), compute them chunk by chunk (one step
    each, every plan confirmed), free the request."""
    req = m.new_request(rid, tokens)
    hit: Any = m.host.lookup(req)
    done = hit.num_computed_tokens
    for n in chunks or [len(tokens) - done]:
        assert m.allocate_slots(req, n, new_computed_blocks=hit) is not None
        hit = None
        finish_step(m)
        req.num_computed_tokens = done = done + n
        m.new_step_starts()
    m.free(req)
    finish_step(m)
    return req


def storm(m: Any, n: int = 4) -> None:
    for k in range(n):
        compute(m, f"storm{k}", [10_000 * (k + 1) + i for i in range(12)])


A = list(range(12))


def test_an_evicted_hybrid_prompt_comes_back_from_the_host_tier() -> None:
    m = make()
    compute(m, "a", A)                      # registers full 0..2, window 0..2, state at 12
    storm(m)                                # evicts all of them: stored in the host tier
    probe = m.new_request("probe", [*A, 99])
    hit = m.host.lookup(probe)
    assert (hit.num_device_tokens, hit.num_host_tokens) == (0, 12)
    # full attention: every block; window 8: the two before token 12; Mamba: one state
    assert [len(ids) for ids in hit.host.host_block_ids] == [3, 2, 1]
    assert [[h for h, _ in keys] for keys in hit.host.keys] == [
        probe.block_hashes[:3], probe.block_hashes[1:3], probe.block_hashes[2:3]]
    new = m.allocate_slots(probe, 1, new_computed_blocks=hit)
    (plan,) = m.host.take_load_plans()
    tables = [mm.req_to_blocks["probe"] for mm in m.mgr.managers]
    full, window, mamba = plan.groups
    assert (full.first_block, full.device_block_ids) == (0, tuple(tables[0][:3]))
    assert (window.first_block, window.device_block_ids) == (1, tuple(tables[1][1:3]))
    assert tables[1][0] == 0                # outside the window: null, nothing loaded
    # as vLLM, the loaded state gets its own block, position 2 (the state after 48
    # tokens), before the live block the next step computes into (position 3)
    assert (mamba.first_block, mamba.device_block_ids) == (2, (tables[2][2],))
    assert tables[2][:2] == [0, 0] and all(tables[2][2:]) and new[2] == [tables[2][3]]
    assert plan.resumable and plan.num_blocks == 6
    m.host.complete_load(plan, True)
    # the loaded blocks are registered on the device, the state too: it keeps its own
    # block (the live block is another), as vLLM's
    index = m.mgr.pool.index
    assert all(h in index[0] for h in probe.block_hashes[:3])
    assert all(h in index[1] for h in probe.block_hashes[1:3])
    assert index[2][probe.block_hashes[2]] == tables[2][2]


def test_a_mamba_state_bounds_the_host_hit() -> None:
    """Mamba states are cached where a step ended on a block boundary only: a prompt
    computed in chunks 8 + 5 has a state at 8 but none at 12."""
    m = make()
    compute(m, "a", A + [50], chunks=[8, 5])
    storm(m)
    probe = m.new_request("probe", [*A, 99])
    hit = m.host.lookup(probe)
    assert (hit.num_device_tokens, hit.num_host_tokens) == (0, 8)
    assert [len(ids) for ids in hit.host.host_block_ids] == [2, 2, 1]


def test_chunked_local_needs_nothing_at_a_chunk_boundary() -> None:
    m = make("chunked")
    compute(m, "a", A + [50], chunks=[8, 5])    # Mamba states at 8 only
    storm(m)
    probe = m.new_request("probe", [*A, 99])
    hit = m.host.lookup(probe)
    # a hit of 8 tokens ends a chunk of 8: the next token reads no earlier block
    assert hit.num_host_tokens == 8
    assert [len(ids) for ids in hit.host.host_block_ids] == [2, 0, 1]
    assert m.allocate_slots(probe, 5, new_computed_blocks=hit) is not None
    (plan,) = m.host.take_load_plans()
    assert [g.device_block_ids == () for g in plan.groups] == [False, True, False]
    m.host.complete_load(plan, True)


def test_a_host_hit_continuing_a_device_hit_and_a_failed_load() -> None:
    """Write-through: the host holds a's blocks; x leaves 8 tokens (state at 8) on the
    device; the probe hits 8 on the device and 8 more in the host. Its window and Mamba
    groups drop the device hit's blocks the longer hit does not need, so a failed load
    cannot be recomputed from the device hit: the plan says so and the request is freed."""
    m = make(num_blocks=24, write_policy=WriteThrough())
    p = list(range(16))
    compute(m, "a", [*p, 50], chunks=[16, 1])   # states at 16 (and the host gets all)
    storm(m, 6)
    compute(m, "x", p[:9], chunks=[8, 1])        # state at 8, full/window blocks 0..1
    probe = m.new_request("probe", [*p, 99])
    hit = m.host.lookup(probe)
    assert (hit.num_device_tokens, hit.num_host_tokens) == (8, 8)
    assert [len(ids) for ids in hit.host.host_block_ids] == [2, 2, 1]
    assert m.allocate_slots(probe, 1, new_computed_blocks=hit) is not None
    (plan,) = m.host.take_load_plans()
    assert [g.first_block for g in plan.groups] == [2, 2, 3]  # Mamba: the loaded state's
    assert not plan.resumable
    m.host.complete_load(plan, False)
    m.free(probe)
    key = (probe.block_hashes[3], 2)
    assert m.host.tier.pool.state(key) is LookupState.HIT       # the host copy stays


# ------------------------------------------------------------------ the rule itself


def _spans(middle: str) -> list[Any]:
    mgr = KVCacheManager(CacheConfig(groups=groups(middle), num_blocks=8, max_model_len=64))
    return [m.hit_span for m in mgr.managers]


def _continue(middle: str, ready: set[tuple[int, int]], *, device: int = 0,
              pending: frozenset[tuple[int, int]] = frozenset(), end: int = 6) -> Any:
    hashes = [bytes([i]) for i in range(8)]
    tables = ([9] * device, [0] * max(0, device - 2) + [9] * min(device, 2),
              [0] * (device - 1) + [9] if device else [])

    def state(key: tuple[bytes, int]) -> LookupState:
        k = (key[0][0], key[1])
        return (LookupState.HIT if k in ready else
                LookupState.HIT_PENDING if k in pending else LookupState.MISS)

    return find_continuation(ContinuationQuery(
        block_hashes=hashes, spans=_spans(middle), device_tables=tables,
        first_block=device, block_size=BS, end_block=end), state)


@pytest.mark.parametrize("middle", ["window", "chunked"])
def test_rule_ignores_blocks_outside_the_window(middle: str) -> None:
    # host: full 0..5, the middle group only 3..5, Mamba states after 4 and 6 blocks
    ready = {(p, 0) for p in range(6)} | {(p, 1) for p in range(3, 6)} | {(3, 2), (5, 2)}
    cont = _continue(middle, ready)
    # window 8 at E = 6 needs positions 4, 5; chunk 8 at E = 6 (24 tokens) none
    assert (cont.end_block, cont.starts) == (6, (0, 4 if middle == "window" else 6, 5))


def test_rule_falls_back_to_an_earlier_state() -> None:
    ready = {(p, g) for p in range(6) for g in (0, 1)} | {(3, 2)}
    assert _continue("window", ready).end_block == 4      # the state after 4 blocks


def test_rule_window_gap_shortens_the_hit() -> None:
    ready = {(p, 0) for p in range(6)} | {(p, 1) for p in (0, 1, 2, 4, 5)} | {
        (p, 2) for p in range(6)}
    # E = 6 needs window 4, 5 (ready); E = 5 would need 3, 4: the longest is 6
    assert _continue("window", ready).end_block == 6
    ready.discard((5, 1))
    # E = 4..6 need window block 3 or 5; E = 3 needs 1, 2: ready
    assert _continue("window", ready).end_block == 3


def test_rule_uses_the_device_hit_and_counts_pending_blocks() -> None:
    ready = {(p, g) for p in (2, 3) for g in (0, 1)} | {(3, 2)}
    pending = frozenset({(4, 0), (4, 1), (4, 2), (5, 0)})
    cont = _continue("window", ready, device=2, pending=pending)
    assert (cont.first_block, cont.end_block, cont.starts) == (2, 4, (2, 2, 3))
    assert cont.num_pending_blocks == 1     # E = 5 once block 4 is stored everywhere
    # a miss in full attention stops everything after it
    assert _continue("window", ready - {(2, 0)}, device=2).end_block == 2
