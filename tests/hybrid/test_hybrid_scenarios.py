"""Hybrid models through the façade: worked examples, end to end."""

from __future__ import annotations

import copy

import pytest
from hybrid_support import (
    admit,
    chunked,
    cross,
    decode,
    full,
    hit_is_valid,
    make_mgr,
    mamba,
    mla,
    real_blocks,
    sink,
    sliding,
    tokens,
)

from pagedkv.core.managers import FullAttentionManager, SinkFullAttentionManager, manager_class_for
from pagedkv.errors import InvalidArgumentError


def test_full32_sliding16_eviction_clamps_hit_to_lcm() -> None:
    """Full attention block 32 + sliding window 32 at block 16 (hashes at 16, lcm 32).
    With sliding-window blocks 5 and 6 evicted, the window run below them ends at 80
    tokens, which full attention cannot match at its 32-token granularity: the hit is
    4 x 16 = 64 tokens, not 5 x 16."""
    mgr = make_mgr([full(32), sliding(16, 32)], num_blocks=64)
    assert mgr.pool.hash_block_size == 16
    prompt = tokens(129)
    a = admit(mgr, "A", prompt)
    sw_table = mgr.get_block_ids("A")[1]
    mgr.free(a.req)
    mgr.check_invariants()

    # Baseline: everything cached -> 128 tokens.
    probe = mgr.new_request("probe", prompt)
    assert mgr.get_computed_blocks(probe).num_computed_tokens == 128

    mgr.evict_blocks(sw_table[5:7])
    mgr.check_invariants()
    b = mgr.new_request("B", prompt)
    hit = mgr.get_computed_blocks(b)
    assert hit.num_computed_tokens == 64
    full_hit, sw_hit = hit.block_ids
    assert len(full_hit) == 2
    assert sw_hit == [0, 0, sw_table[2], sw_table[3]]
    assert hit_is_valid(mgr, b.block_hashes, hit.block_ids, 64) is None
    assert mgr.allocate_slots(b, 129 - 64, new_computed_blocks=hit) is not None
    mgr.check_invariants()
    assert mgr.get_block_ids("B")[1][:4] == [0, 0, sw_table[2], sw_table[3]]


def test_sliding_hit_shape_through_the_facade() -> None:
    """Window 8, block 4: a repeated 17-token prompt hits 16 tokens as [0, 0, b2, b3]."""
    mgr = make_mgr([sliding(4, 8)])
    prompt = tokens(17)
    admit(mgr, "A", prompt)
    table = mgr.get_block_ids("A")[0]
    b = mgr.new_request("B", prompt)
    hit = mgr.get_computed_blocks(b)
    assert hit.block_ids == ([0, 0, table[2], table[3]],)
    assert hit.num_computed_tokens == 16


def _walk(spec_groups: list, prompt_len: int, num_decode: int, step_tokens: int,
          max_model_len: int) -> list[tuple[int, list[int]]]:
    """Prefill in ``step_tokens`` chunks, then decode; return (computed tokens before the
    step, table after it) for the last group at every step."""
    mgr = make_mgr(spec_groups, num_blocks=64, max_model_len=max_model_len)
    req = mgr.new_request("R", tokens(prompt_len))
    steps: list[tuple[int, list[int]]] = []
    while req.num_computed_tokens < prompt_len:
        n = min(step_tokens, prompt_len - req.num_computed_tokens)
        before = req.num_computed_tokens
        assert mgr.allocate_slots(req, n) is not None
        mgr.check_invariants()
        req.num_computed_tokens += n
        steps.append((before, mgr.get_block_ids("R")[-1]))
    for i in range(num_decode):
        before = req.num_computed_tokens
        req.append_output_tokens(7 + i)
        assert mgr.allocate_slots(req, 1) is not None
        mgr.check_invariants()
        req.num_computed_tokens += 1
        steps.append((before, mgr.get_block_ids("R")[-1]))
    return steps


def _shape(table: list[int]) -> str:
    return "".join("0" if not b else "X" for b in table)


def test_sliding_window_walkthrough() -> None:
    """Window 8, block 4, prefill 16 tokens in steps of 8, then decode. Before each step
    the blocks wholly before token ``computed - 7`` are nulled; real blocks never exceed
    ``max_admission_blocks(64, max_num_batched_tokens=8)`` = ceil(15 / 4) + 1 = 5."""
    spec = sliding(4, 8)
    cap = spec.max_admission_blocks(64, max_num_batched_tokens=8)
    assert cap == 5
    steps = _walk([spec], prompt_len=16, num_decode=14, step_tokens=8, max_model_len=64)
    expected = [
        (0, "XX"),        # tokens 0..7
        (8, "XXXX"),      # skip max(0, 8 - 7) = 1 token: no whole block
        (16, "00XXX"),    # skip 9 tokens -> blocks 0, 1; token 16 opens block 4
        (17, "00XXX"),
        (18, "00XXX"),
        (19, "000XX"),    # skip 12 -> blocks 0..2
        (20, "000XXX"),   # token 20 opens block 5
        (21, "000XXX"),
        (22, "000XXX"),
        (23, "0000XX"),   # skip 16 -> blocks 0..3
        (24, "0000XXX"),
        (25, "0000XXX"),
        (26, "0000XXX"),
        (27, "00000XX"),
        (28, "00000XXX"),
        (29, "00000XXX"),
    ]
    assert [(c, _shape(t)) for c, t in steps] == expected
    assert max(real_blocks(t) for _, t in steps) <= cap


def test_chunked_local_walkthrough() -> None:
    """Chunk 8, block 4, prefill 16 in steps of 8, then decode: blocks of earlier chunks
    are nulled when the computed count enters a new chunk; real blocks never exceed
    ``max_admission_blocks(64, max_num_batched_tokens=8)`` = ceil(16 / 4) + 1 = 5."""
    spec = chunked(4, 8)
    cap = spec.max_admission_blocks(64, max_num_batched_tokens=8)
    assert cap == 5
    steps = _walk([spec], prompt_len=16, num_decode=10, step_tokens=8, max_model_len=64)
    expected = [
        (0, "XX"),
        (8, "00XX"),      # 8 computed: chunk 1 starts at 8, chunk 0 (blocks 0, 1) freed
        (16, "0000X"),    # chunk 2 starts at 16
        (17, "0000X"),
        (18, "0000X"),
        (19, "0000X"),
        (20, "0000XX"),
        (21, "0000XX"),
        (22, "0000XX"),
        (23, "0000XX"),
        (24, "000000X"),  # chunk 3
        (25, "000000X"),
    ]
    assert [(c, _shape(t)) for c, t in steps] == expected
    assert max(real_blocks(t) for _, t in steps) <= cap


def test_mamba_checkpoint_walkthrough() -> None:
    """Checkpoint interval 8, prefill 20 in steps of 8, then decode: only the live state
    block (and the blocks of the current step) are held; finished checkpoints are freed
    and stay cached. Real blocks never exceed ``max_admission_blocks(64)`` = 8."""
    spec = mamba(8)
    cap = spec.max_admission_blocks(64, max_num_batched_tokens=8)
    steps = _walk([spec], prompt_len=20, num_decode=8, step_tokens=8, max_model_len=64)
    expected = [
        (0, "X"),        # writes the state after 8 tokens into block 0
        (8, "XX"),       # reads block 0 (state at 8), writes block 1 (state at 16)
        (16, "0XX"),     # block 0 is a finished checkpoint: freed (it stays cached)
        (20, "00X"),     # the live state (at 20) is in block 2; block 1 is finished
        (21, "00X"),
        (22, "00X"),
        (23, "00X"),
        (24, "00XX"),    # reads block 2 (state at 24), token 24 opens block 3
        (25, "000X"),
        (26, "000X"),
        (27, "000X"),
    ]
    assert [(c, _shape(t)) for c, t in steps] == expected
    assert max(real_blocks(t) for _, t in steps) == 2 <= cap


def test_mamba_hybrid_hits_in_checkpoint_mode() -> None:
    """Full attention (block 16) + Mamba checkpoints every 64 tokens: a repeated 200-token
    prompt hits 192 tokens (the deepest checkpoint within 199), for every group."""
    mgr = make_mgr([full(16), mamba(64)], num_blocks=64)
    prompt = tokens(200)
    admit(mgr, "A", prompt)
    b = mgr.new_request("B", prompt)
    hit = mgr.get_computed_blocks(b)
    assert hit.num_computed_tokens == 192
    assert len(hit.block_ids[0]) == 12
    assert hit.block_ids[1][:2] == [0, 0] and hit.block_ids[1][2] != 0
    assert hit_is_valid(mgr, b.block_hashes, hit.block_ids, 192) is None
    assert mgr.allocate_slots(b, 8, new_computed_blocks=hit) is not None
    mgr.check_invariants()


@pytest.mark.parametrize(("prompt_len", "expected_hit"), [
    (40, 0), (64, 0),   # at most 63 tokens may hit: no checkpoint fits
    (65, 64), (128, 64), (129, 128),
])
def test_mamba_hybrid_needs_one_interval_plus_one_token(prompt_len: int,
                                                        expected_hit: int) -> None:
    mgr = make_mgr([full(16), mamba(64)], num_blocks=64)
    admit(mgr, "A", tokens(prompt_len))
    b = mgr.new_request("B", tokens(prompt_len))
    assert mgr.get_computed_blocks(b).num_computed_tokens == expected_hit


def test_mamba_align_is_the_default_with_caching() -> None:
    """vLLM 0.33's align mode (the default with prefix caching on): one live state block
    at position ceil(t / 64) - 1, nulls before it; a state is registered once its block is
    full. A 200-token prompt leaves nothing to hit (its state is inside block 3); a
    128-token prompt does, from the next scheduler step on."""
    mgr = make_mgr([full(16), mamba(64, checkpoints=False)], num_blocks=64)
    admit(mgr, "A", tokens(200))
    table = mgr.get_block_ids("A")[1]
    assert table[:3] == [0, 0, 0] and len(table) == 4 and table[3]
    b = mgr.new_request("B", tokens(200))
    assert mgr.get_computed_blocks(b).num_computed_tokens == 0
    admit(mgr, "C", tokens(128))
    assert mgr.get_block_ids("C")[1][0] == 0
    full_c, mamba_c = mgr.get_block_ids("C")
    # Clipped to computed tokens: attention tables only; the Mamba table stays whole.
    assert mgr.get_block_ids_for_computed_tokens("C", 40) == (full_c[:3], mamba_c)
    d = mgr.new_request("D", tokens(130))
    hit = mgr.get_computed_blocks(d)
    assert hit.num_computed_tokens == 128
    assert hit.block_ids[1] == [0, mgr.get_block_ids("C")[1][1]]
    # The state was registered in this step: adopting it now is refused (as vLLM).
    assert mgr.allocate_slots(d, 2, new_computed_blocks=hit) is None
    mgr.new_step_starts()
    assert mgr.allocate_slots(d, 2, new_computed_blocks=hit) is not None
    mgr.check_invariants()


def test_finished_checkpoints_still_hit_after_the_owner_moves_on() -> None:
    """A decoding request frees its finished checkpoints; they stay in the prefix index."""
    mgr = make_mgr([full(8), mamba(8)], num_blocks=64)
    a = admit(mgr, "A", tokens(17))
    for i in range(10):
        assert decode(mgr, a, 5 + i) is not None
    assert mgr.get_block_ids("A")[1][:2] == [0, 0]
    b = mgr.new_request("B", tokens(17))
    assert mgr.get_computed_blocks(b).num_computed_tokens == 16


def test_hit_blocks_of_every_group_are_claimed_before_any_group_allocates() -> None:
    """Full attention + sliding window. Request A's sliding-window blocks are freed while
    it decodes (they leave the window), so they reach the free queue before A's
    full-attention blocks: they are the first blocks a new allocation would take. B's
    full-attention group needs new blocks; if B's sliding-window hit were not claimed
    first, that allocation would evict it."""
    # 15 blocks: exactly the 14 that A uses over its life, so no never-used block is
    # ahead of A's in the free queue.
    mgr = make_mgr([full(4), sliding(4, 8)], num_blocks=15)
    prompt = tokens(16)
    a = admit(mgr, "A", prompt)
    for i in range(12):
        assert decode(mgr, a, 50 + i) is not None
    mgr.free(a.req)
    mgr.check_invariants()

    b = mgr.new_request("B", prompt + tokens(12, base=9000))
    hit = mgr.get_computed_blocks(b)
    assert hit.num_computed_tokens == 16
    sw_hit = [x for x in hit.block_ids[1] if x]
    full_new = mgr.managers[0].get_num_blocks_to_allocate("B", 28, hit.block_ids[0])
    num_new_full = full_new - sum(1 for x in hit.block_ids[0] if mgr.pool.ref_cnt[x] == 0)
    front = mgr.pool.free_queue.to_list()[:num_new_full]
    assert set(sw_hit) & set(front), "premise: the sliding hit is among the first blocks taken"

    # Control: claiming group by group (full attention claims and allocates first)
    # evicts the sliding-window hit.
    wrong = copy.deepcopy(mgr)
    fm = wrong.managers[0]
    wrong.pool.touch(hit.block_ids[0])
    fm.save_new_computed_blocks("B", hit.block_ids[0], 16)
    fm.allocate_new_blocks("B", 28)
    assert any(wrong.pool.block_hash[x] is None for x in sw_hit)

    # The façade claims every group's hit first.
    assert mgr.allocate_slots(b, 12, new_computed_blocks=hit) is not None
    mgr.check_invariants()
    table = mgr.get_block_ids("B")[1]
    assert [x for x in table[:4] if x] == sw_hit
    assert all(mgr.pool.block_hash[x] is not None for x in sw_hit)


def test_drop_last_hit_hybrid_keeps_a_hit() -> None:
    """Speculative decoding on full + sliding window (window 8, block 4), 33-token prompt:
    full attention matches 8 blocks within 32 tokens and drops one (28); the sliding
    window, asked within 28 + 4, needs a run of 3 ending at block 7 and drops its last:
    [0, 0, 0, 0, 0, b5, b6] = 28. Asking within 28 would shrink the hit on every pass."""
    for drop, expected in ((False, 32), (True, 28)):
        mgr = make_mgr([full(4), sliding(4, 8)], num_blocks=64, drop_last_hit=drop)
        prompt = tokens(33)
        admit(mgr, "A", prompt)
        sw_a = mgr.get_block_ids("A")[1]
        b = mgr.new_request("B", prompt)
        hit = mgr.get_computed_blocks(b)
        assert hit.num_computed_tokens == expected
        assert hit_is_valid(mgr, b.block_hashes, hit.block_ids, expected) is None
        if drop:
            assert hit.block_ids[1] == [0] * 5 + sw_a[5:7]


def test_drop_last_hit_hybrid_mixed_block_sizes() -> None:
    """Full (block 32) + sliding window 32 (block 16), 129 tokens, drop_last_hit: full
    attention matches 4 blocks within 128, drops one -> 96; the sliding window within
    96 + 16 needs 3 contiguous ending at block 6 and drops block 6 -> 96."""
    mgr = make_mgr([full(32), sliding(16, 32)], num_blocks=64, drop_last_hit=True)
    prompt = tokens(129)
    admit(mgr, "A", prompt)
    b = mgr.new_request("B", prompt)
    hit = mgr.get_computed_blocks(b)
    assert hit.num_computed_tokens == 96
    assert hit_is_valid(mgr, b.block_hashes, hit.block_ids, 96) is None


def test_chunked_hybrid() -> None:
    """Full (block 4) + chunked local (chunk 8, block 4), repeated 21-token prompt: hit 20
    = full attention's 5 blocks; the chunked group nulls chunks 0 and 1."""
    mgr = make_mgr([full(4), chunked(4, 8)], num_blocks=64)
    admit(mgr, "A", tokens(21))
    ch_a = mgr.get_block_ids("A")[1]
    b = mgr.new_request("B", tokens(21))
    hit = mgr.get_computed_blocks(b)
    assert hit.num_computed_tokens == 20
    assert hit.block_ids[1] == [0, 0, 0, 0, ch_a[4]]


def test_external_tokens_leave_window_positions_null() -> None:
    """A new sliding-window request whose KV for 16 tokens arrives from elsewhere: the
    blocks wholly before the window are null from the start, not allocated."""
    mgr = make_mgr([sliding(4, 8)], num_blocks=64)
    req = mgr.new_request("R", tokens(20))
    out = mgr.allocate_slots(req, 4, num_external_computed_tokens=16)
    assert out is not None
    mgr.check_invariants()
    assert _shape(mgr.get_block_ids("R")[0]) == "00XXX"  # skip 16 - 7 = 9 tokens


def test_cross_attention_allocates_once_and_never_hits() -> None:
    mgr = make_mgr([full(4), cross(4, 20)], num_blocks=64)
    req = mgr.new_request("R", tokens(6))
    state = mgr.debug_state()
    with pytest.raises(InvalidArgumentError, match="max_encoder_len=20"):
        mgr.allocate_slots(req, 6, num_encoder_tokens=21)
    assert mgr.debug_state() == state
    assert mgr.allocate_slots(req, 6, num_encoder_tokens=18) is not None
    req.num_computed_tokens = 6
    assert len(mgr.get_block_ids("R")[1]) == 5
    req.append_output_tokens(1)
    assert mgr.allocate_slots(req, 1) == ([], [])
    assert len(mgr.get_block_ids("R")[1]) == 5
    other = mgr.new_request("S", tokens(6))
    assert mgr.get_computed_blocks(other).num_computed_tokens == 0
    mgr.free(req)
    mgr.check_invariants()
    assert mgr.num_free_blocks == 63


def test_sinks_hold_their_blocks_per_request() -> None:
    spec = sink(4, 6)
    mgr = make_mgr([spec], num_blocks=8, max_model_len=16)
    m = mgr.managers[0]
    assert isinstance(m, SinkFullAttentionManager)
    req = mgr.new_request("R", tokens(16))
    # 2 sink blocks + 4 token blocks = the admission cap.
    assert spec.max_admission_blocks(16) == 6
    assert mgr.allocate_slots(req, 16) is not None
    mgr.check_invariants()
    assert len(m.sink_block_ids("R")) == 2 and mgr.num_free_blocks == 1
    too_big = mgr.new_request("S", tokens(4, base=5))
    state = mgr.debug_state()
    assert mgr.allocate_slots(too_big, 1) is None  # needs 2 sink blocks + 1
    assert mgr.debug_state() == state
    mgr.free(req)
    mgr.check_invariants()
    assert mgr.num_free_blocks == 7 and m.sink_block_ids("R") == []


def test_mla_is_full_attention_with_its_own_page() -> None:
    spec = mla(16)
    assert manager_class_for(spec) is FullAttentionManager
    assert spec.page_size_bytes == 16 * 1 * 16 * 2  # no factor 2 for K and V
    mgr = make_mgr([full(16), spec], num_blocks=64)
    admit(mgr, "A", tokens(40))
    b = mgr.new_request("B", tokens(40))
    assert mgr.get_computed_blocks(b).num_computed_tokens == 32


def test_the_reference_checker_rejects_invalid_hits() -> None:
    """The stateful tests' oracle must be able to say no."""
    mgr = make_mgr([full(4), sliding(4, 8)], num_blocks=64)
    admit(mgr, "A", tokens(17))
    full_a, sw_a = mgr.get_block_ids("A")
    hashes = mgr.new_request("B", tokens(17)).block_hashes
    assert hit_is_valid(mgr, hashes, (full_a[:4], [0, 0, sw_a[2], sw_a[3]]), 16) is None
    assert "needed but null" in str(hit_is_valid(mgr, hashes, (full_a[:4], [0, 0, 0, sw_a[3]]),
                                                  16))
    assert "holds other content" in str(hit_is_valid(mgr, hashes,
                                                     (full_a[:4], [0, 0, sw_a[3], sw_a[2]]), 16))
    assert "blocks of 4" in str(hit_is_valid(mgr, hashes, (full_a[:3], [0, 0, sw_a[2]]), 16))
