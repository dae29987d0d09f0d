"""A KV connector on a Mamba hybrid (vLLM 0.33): each group's own hit
(``lookup_prefix_per_group``), adopted only when no group ran deeper, and the Mamba
states handed to the connector (``take_boundary_state_offloads``,
``finalize_partial_tail_offloads``). Both cores; ``check_invariants`` after each call."""

from __future__ import annotations

import pytest

import pagedkv
from pagedkv import InvalidArgumentError, InvalidHitError

BS = 16


def _manager(*, hash_block_size: int | None = None, record: bool = True,
             num_blocks: int = 40) -> pagedkv.KVCacheManager:
    full = pagedkv.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype_bytes=2)
    mamba = pagedkv.MambaSpec(block_size=BS, state_bytes=64)
    return pagedkv.KVCacheManager(pagedkv.CacheConfig(
        groups=(full, mamba), num_blocks=num_blocks, max_model_len=512,
        hash_block_size=hash_block_size, record_boundary_states=record))


def _seed(mgr: pagedkv.KVCacheManager, num_blocks: int, *, free: bool = True
          ) -> tuple[list[int], list[int]]:
    """Compute a ``num_blocks``-block prompt one block per step (so that every Mamba
    boundary is registered), then free it unless ``free`` is False; returns the
    full-attention and Mamba block of each block."""
    req = mgr.new_request("fill", list(range(1, num_blocks * BS + 1)))
    mamba: list[int] = []
    for i in range(num_blocks):
        assert mgr.allocate_slots(req, BS) is not None
        req.num_computed_tokens += BS
        mgr.check_invariants()
        mamba.append(mgr.get_block_ids("fill")[1][i])
        mgr.new_step_starts()
    full = list(mgr.get_block_ids("fill")[0])
    if free:
        mgr.free(req)
        mgr.check_invariants()
    return full, mamba


def _replay(mgr: pagedkv.KVCacheManager, num_blocks: int) -> pagedkv.Request:
    return mgr.new_request("replay", list(range(1, num_blocks * BS + 1)))


def test_groups_hit_at_their_own_depth_when_full_attention_tail_is_evicted() -> None:
    mgr = _manager()
    full, mamba = _seed(mgr, 4)
    mgr.evict_blocks([full[2], full[3], mamba[1], mamba[2]])
    mgr.check_invariants()
    req = _replay(mgr, 5)
    hit = mgr.lookup_prefix_per_group(req)
    assert hit.group_tokens == (2 * BS, 4 * BS)
    assert hit.block_ids == ([full[0], full[1]], [0, 0, 0, mamba[3]])
    assert hit.num_computed_tokens == 2 * BS  # the reference group's (group 0)
    # A group deeper than the adopted length: not adoptable, state unchanged.
    before = mgr.debug_state()
    with pytest.raises(InvalidHitError, match="longer than the 32 tokens adopted"):
        mgr.allocate_slots(req, 3 * BS, new_computed_blocks=hit)
    assert mgr.debug_state() == before
    # The hit every group agrees on.
    agreed = mgr.lookup_prefix(req)
    assert agreed.num_computed_tokens == BS
    mgr.check_invariants()


def test_a_lagging_group_is_adopted_at_its_own_length() -> None:
    mgr = _manager()
    full, mamba = _seed(mgr, 4)
    mgr.evict_blocks([mamba[1], mamba[2], mamba[3]])
    req = _replay(mgr, 6)
    hit = mgr.lookup_prefix_per_group(req)
    assert hit.group_tokens == (4 * BS, BS)
    assert mgr.lookup_prefix(req).num_computed_tokens == BS
    # A connector restores the state at 64 and loads one more block (external tokens).
    new = mgr.allocate_slots(req, BS, new_computed_blocks=hit, num_new_computed_tokens=4 * BS,
                             num_external_computed_tokens=BS)
    assert new is not None
    assert mgr.get_block_ids("replay")[0][:4] == full
    mgr.check_invariants()
    mgr.free(req)
    mgr.check_invariants()


def test_a_stale_per_group_hit_is_checked_group_by_group() -> None:
    mgr = _manager()
    full, mamba = _seed(mgr, 4)
    mgr.evict_blocks([mamba[2], mamba[3]])
    req = _replay(mgr, 6)
    hit = mgr.lookup_prefix_per_group(req)
    assert hit.group_tokens == (4 * BS, 2 * BS)
    mgr.evict_blocks([full[3]])  # the hit is stale now: full attention lost a block
    before = mgr.debug_state()
    with pytest.raises(InvalidHitError):
        mgr.allocate_slots(req, BS, new_computed_blocks=hit, num_external_computed_tokens=BS)
    assert mgr.debug_state() == before
    mgr.check_invariants()


def test_per_group_lookup_arguments_are_checked() -> None:
    mgr = _manager()
    req = _replay(mgr, 2)
    with pytest.raises(InvalidArgumentError, match="reference_group"):
        mgr.lookup_prefix_per_group(req, reference_group=2)
    with pytest.raises(InvalidArgumentError, match="max_hit_tokens"):
        mgr.lookup_prefix_per_group(req, 3 * BS)
    hit = mgr.lookup_prefix_per_group(req, 0)
    assert hit.group_tokens == (0, 0) and hit.num_computed_tokens == 0


def test_registered_states_are_offered_once_with_their_boundaries() -> None:
    mgr = _manager()
    _full, mamba = _seed(mgr, 3, free=False)
    offers = mgr.take_boundary_state_offloads()
    assert offers == {"fill": [(1, mamba[i], (i + 1) * BS) for i in range(3)]}
    assert mgr.take_boundary_state_offloads() == {}
    mgr.free("fill")
    mgr.check_invariants()


def test_a_freed_request_loses_its_offers_and_no_records_without_the_option() -> None:
    mgr = _manager()
    req = mgr.new_request("r", list(range(1, 3 * BS + 1)))
    assert mgr.allocate_slots(req, 2 * BS) is not None
    mgr.free(req)
    assert mgr.take_boundary_state_offloads() == {}
    plain = _manager(record=False)
    _seed(plain, 2, free=False)
    assert plain.take_boundary_state_offloads() == {}
    assert plain.finalize_partial_tail_offloads("fill", 2 * BS) == []


def test_a_producer_tail_is_offered_as_its_copy_or_finalized_in_place() -> None:
    # Hash block 4: the prompt's last hash boundary (40 of 42 tokens) is inside block 2.
    mgr = _manager(hash_block_size=4)
    req = mgr.new_request("p", list(range(1, 43)))
    assert mgr.allocate_slots(req, 40) is not None
    req.num_computed_tokens = 40
    mgr.check_invariants()
    assert mgr.take_boundary_state_offloads() == {}  # nothing full, the tail kept aside
    state = mgr.get_block_ids("p")[1][2]
    # Finishing right at the boundary: the state is still in its own block.
    assert mgr.finalize_partial_tail_offloads("p", 40, 0) == [(1, state, 40)]
    assert mgr.finalize_partial_tail_offloads("p", 40, 0) == []  # consumed
    mgr.free(req)
    mgr.check_invariants()

    mgr = _manager(hash_block_size=4)
    req = mgr.new_request("p", list(range(1, 43)))
    assert mgr.allocate_slots(req, 40) is not None
    req.num_computed_tokens = 40
    state = mgr.get_block_ids("p")[1][2]
    mgr.new_step_starts()
    assert mgr.allocate_slots(req, 2) is not None  # the next step moves the entry
    mgr.check_invariants()
    copies = mgr.take_block_copies()
    [copy] = [c.dst_block_id for c in copies.copies if c.src_block_id == state]
    assert mgr.take_boundary_state_offloads() == {"p": [(1, copy, 40)]}
    mgr.release_blocks(copies.retained)
    req.num_computed_tokens = 42
    assert mgr.finalize_partial_tail_offloads("p", 42, 0) == []
    mgr.free(req)
    mgr.check_invariants()


@pytest.mark.parametrize("seed", range(4))
def test_random_connector_traffic_keeps_the_invariants(seed: int) -> None:
    """Per-group lookups (adopted when the groups agree), chunks, evictions, frees and
    offer drains, with ``check_invariants`` after each; every offer names a block of a
    live request's registration at a positive boundary."""
    import random

    rng = random.Random(seed)
    mgr = _manager(hash_block_size=4, num_blocks=24)
    prefix = [rng.randrange(1, 500) for _ in range(40)]
    live: dict[str, pagedkv.Request] = {}
    for step in range(150):
        op = rng.random()
        if op < 0.3 and len(live) < 4:
            rid = f"r{step}"
            req = mgr.new_request(rid, prefix[: rng.randint(4, 40)] + [step, 7])
            hit = mgr.lookup_prefix_per_group(req)
            assert hit.group_tokens is not None
            if len(set(hit.group_tokens)) != 1:
                hit = mgr.lookup_prefix(req)
            n = min(req.num_tokens - hit.num_computed_tokens, rng.randint(1, 24))
            if mgr.allocate_slots(req, n, new_computed_blocks=hit) is not None:
                req.num_computed_tokens = hit.num_computed_tokens + n
                live[rid] = req
        elif op < 0.6 and live:
            req = live[rng.choice(sorted(live))]
            n = max(1, min(req.num_tokens - req.num_computed_tokens, rng.randint(1, 16)))
            if req.num_computed_tokens >= req.num_tokens:
                req.append_output_tokens(rng.randrange(1, 500))
            if mgr.allocate_slots(req, n) is not None:
                req.num_computed_tokens += n
        elif op < 0.75 and live:
            rid = rng.choice(sorted(live))
            mgr.finalize_partial_tail_offloads(rid, live[rid].num_computed_tokens, 0)
            mgr.free(live.pop(rid))
        elif op < 0.85:
            mgr.evict_blocks([rng.randrange(1, 24)])
        else:
            copies = mgr.take_block_copies()
            mgr.release_blocks(copies.retained)
            mgr.new_step_starts()
        mgr.check_invariants()
        for rid, offers in mgr.take_boundary_state_offloads().items():
            assert rid in live
            assert all(g == 1 and b > 0 and n > 0 for g, b, n in offers)
        mgr.check_invariants()
