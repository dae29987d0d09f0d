"""Align-mode Mamba under an engine's counting (``num_in_flight_tokens``,
``lenient_counts``): release follows the processed tokens, so a table may hold more than
the live state and the last one, as vLLM 0.33's manager does.

Settled against vLLM 0.33 (``vllm/v1/core/kv_cache_manager.py`` ``allocate_slots`` and
``single_type_kv_cache_manager.py`` ``MambaManager``): ``allocate_slots`` calls
``remove_skipped_blocks(request_id, max(0, total_computed - num_in_flight_tokens))``;
Mamba's base release frees positions below ``(processed - 1) // block_size`` and its last
state only once it sits below ``cdiv(processed, block_size) - 1``; ``allocate_new_blocks``
then makes the previous end the last state and appends the new live block. In sequence
(1) below, processed = 12 keeps position 2 (2 < cdiv(12, 4) - 1 is false), position 3
becomes the last state and position 4 the live block: three real states, in vLLM as here.
The group's invariant said "at most 2" (wrong under in-flight counting); it now checks
that no real block sits below the released positions.
"""

from __future__ import annotations

import pytest
from hybrid_support import full, make_mgr, mamba, real_blocks, tokens

from pagedkv import KVCacheManager, Request


def _decoded(prompt_tokens: int) -> tuple[KVCacheManager, Request]:
    """Full attention 4 + Mamba 4: a prompt allocated at once, then 2 decode tokens
    allocated one by one, all counted computed."""
    mgr = make_mgr([full(4), mamba(4, checkpoints=False)], max_model_len=64)
    req = mgr.new_request("a", tokens(prompt_tokens))
    assert mgr.allocate_slots(req, prompt_tokens) is not None
    req.num_computed_tokens = prompt_tokens
    for t in range(2):
        req.append_output_tokens(7000 + t)
        assert mgr.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
    return mgr, req


def test_in_flight_token_keeps_a_third_state_as_vllm_does() -> None:
    mgr, req = _decoded(11)
    assert mgr.get_block_ids("a")[1] == [0, 0, 4, 6]
    assert mgr.allocate_slots(req, 4, num_in_flight_tokens=1, lenient_counts=True) is not None
    table = mgr.get_block_ids("a")[1]
    assert table == [0, 0, 4, 6, 8]  # positions 2 (not passed yet), 3 (last), 4 (live)
    assert real_blocks(table) == 3
    mgr.check_invariants()
    # Once processed tokens pass position 2 it goes; the last state (position 3) stays
    # until they pass it too: 15 processed keep it (3 < cdiv(15, 4) - 1 is false).
    req.num_computed_tokens = 15
    assert mgr.allocate_slots(req, 1, lenient_counts=True) is not None
    assert mgr.get_block_ids("a")[1] == [0, 0, 0, 6, 8]
    mgr.check_invariants()


def test_lenient_step_then_plain_decodes_keep_the_invariant() -> None:
    mgr, req = _decoded(18)
    assert mgr.allocate_slots(req, 1, lenient_counts=True) is not None
    mgr.check_invariants()
    for t in range(5):
        req.append_output_tokens(8000 + t)
        assert mgr.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
        mgr.check_invariants()
        assert real_blocks(mgr.get_block_ids("a")[1]) <= 2  # no in-flight tokens: 2 at most
    assert mgr.get_block_ids("a")[1] == [0, 0, 0, 0, 0, 8, 10]


def test_a_state_below_the_released_positions_fails_the_invariant() -> None:
    mgr, req = _decoded(11)
    assert mgr.allocate_slots(req, 4, num_in_flight_tokens=1, lenient_counts=True) is not None
    table = mgr.coordinator.managers[1].req_to_blocks["a"]
    table[1], table[2] = table[2], table[1]  # a real state at a released position
    with pytest.raises(AssertionError, match="a state below"):
        mgr.coordinator.managers[1].check_invariants()
