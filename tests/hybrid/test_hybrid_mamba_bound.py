"""Align-mode Mamba holds up to 2 state blocks between steps; its admission bound says so
and agrees with the planner's ``mamba_cache_mode="align"`` figure."""

from __future__ import annotations

from hybrid_support import full, make_mgr, mamba, real_blocks, tokens

from pagedkv.planner.plan_types import group_blocks_per_request


def test_two_state_blocks_between_steps_and_the_bound_covers_them() -> None:
    spec = mamba(4, checkpoints=False)
    mgr = make_mgr([full(4), spec])
    req = mgr.new_request("a", tokens(6))
    assert mgr.allocate_slots(req, 6) is not None
    req.num_computed_tokens = 6
    most = 0
    for t in range(6):
        req.append_output_tokens(5000 + t)
        assert mgr.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
        mgr.check_invariants()
        most = max(most, real_blocks(mgr.get_block_ids("a")[1]))
    assert most == 2  # crossing a block boundary: the old state and the new block
    assert spec.max_admission_blocks(64) == 2


def test_bound_matches_the_planner_align_figure() -> None:
    spec = mamba(16, checkpoints=False)
    planned = group_blocks_per_request(spec, 4096, max_in_flight_tokens=None,
                                       mamba_cache_mode="align", mamba_checkpoint_blocks=0)
    assert planned == spec.max_admission_blocks(4096) == 2
    assert spec.max_memory_usage_bytes(4096) == 2 * spec.page_size_bytes
