"""A connector's external tokens and the EAGLE drop on layouts of several groups: the
worked cases of ``pagedkv/core/external_blocks.py`` and ``pagedkv/core/eagle_hits.py``,
the refusal where vLLM's own allocation raises, and the layouts pagedkv still refuses
inside vLLM. (Block for block against vLLM: the ``/ext`` and ``/eagle`` transcripts.)"""

from __future__ import annotations

import pagedkv
from pagedkv.core.specs import FullAttentionSpec, MambaSpec, SlidingWindowSpec


def _full_mamba(num_blocks: int) -> pagedkv.KVCacheManager:
    return pagedkv.KVCacheManager(pagedkv.CacheConfig(
        groups=(FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype_bytes=2),
                MambaSpec(block_size=16, state_bytes=64)),
        num_blocks=num_blocks, max_model_len=256))


def test_external_blocks_come_first_in_every_group_and_are_not_returned() -> None:
    mgr = _full_mamba(16)
    req = mgr.new_request("a", list(range(60)))
    # 40 external tokens, 8 new: 48 tokens end in block 2 in both groups.
    assert mgr.allocate_slots(req, 8, num_external_computed_tokens=40) == ([], [])
    assert mgr.get_block_ids("a") == ([1, 2, 3], [0, 0, 4])
    # 40 external, 12 new: full attention's 4th block and Mamba's live block come after
    # every group's external blocks; the loaded state keeps its own block.
    other = mgr.new_request("b", list(range(100, 160)))
    assert mgr.allocate_slots(other, 12, num_external_computed_tokens=40) == ([9], [10])
    assert mgr.get_block_ids("b") == ([5, 6, 7, 9], [0, 0, 8, 10])
    mgr.check_invariants()


def test_a_load_vllm_cannot_fit_is_refused_with_nothing_changed() -> None:
    """vLLM counts one block for the Mamba group (its live one) but also takes one for
    the loaded state; with the pool one block short vLLM raises, pagedkv refuses."""
    mgr = _full_mamba(7)  # 6 usable blocks: counted 4 + 1, taken 4 + 2
    req = mgr.new_request("a", list(range(60)))
    assert mgr.allocate_slots(req, 12, num_external_computed_tokens=40) is not None
    assert mgr.num_free_blocks == 0
    tight = _full_mamba(6)  # 5 usable: the count fits, the loaded state's block does not
    r = tight.new_request("a", list(range(60)))
    before = (tight.num_free_blocks, list(tight.pool.debug_state()["free_queue"]))
    assert tight.allocate_slots(r, 12, num_external_computed_tokens=40) is None
    assert (tight.num_free_blocks, list(tight.pool.debug_state()["free_queue"])) == before
    assert not tight.has_request("a")
    tight.check_invariants()


def test_the_eagle_drop_on_two_groups_looks_one_block_past_the_bound() -> None:
    """eagle_hits.py's worked case: full attention 8 + a 24-token window at block 8, a
    32-token prompt cached whole in both groups, looked up within 31 tokens: 24 tokens
    (a plain bound of 31 would give 16)."""
    mgr = pagedkv.KVCacheManager(pagedkv.CacheConfig(
        groups=(FullAttentionSpec(block_size=8, num_kv_heads=1, head_size=8, dtype_bytes=2),
                SlidingWindowSpec(block_size=8, num_kv_heads=1, head_size=8, dtype_bytes=2,
                                  sliding_window=24)),
        num_blocks=40, max_model_len=256, drop_last_hit=True))
    prompt = list(range(32))
    first = mgr.new_request("a", prompt + [99])
    assert mgr.allocate_slots(first, 33) is not None
    req = mgr.new_request("b", prompt)
    hit = mgr.get_computed_blocks(req)
    assert hit.num_computed_tokens == 24
    full, window = hit.block_ids
    # the window group needs a run of 3 + 1 blocks (the dropped one): blocks 0..3
    assert len(full) == 3 and len(window) == 3 and all(window)


def test_inside_vllm_only_three_eagle_layouts_stay_refused() -> None:
    from types import SimpleNamespace as NS

    from pagedkv.vllm.layout import eagle_layout_problem

    def spec(kind: str, block: int) -> object:
        return type(kind, (), {"block_size": block, "__eq__": lambda a, b: a is b,
                               "__hash__": object.__hash__})()

    full, swa, mamba = spec("FullAttentionSpec", 16), spec("SlidingWindowSpec", 16), \
        spec("MambaSpec", 16)
    groups = [NS(kv_cache_spec=full), NS(kv_cache_spec=swa), NS(kv_cache_spec=mamba)]
    assert eagle_layout_problem(groups) is None
    assert eagle_layout_problem(groups[:1]) is None
    flagged = [NS(kv_cache_spec=full, is_eagle_group=True), NS(kv_cache_spec=swa)]
    assert "some of its KV-cache groups" in str(eagle_layout_problem(flagged))
    assert "two KV-cache groups of one spec" in str(
        eagle_layout_problem([NS(kv_cache_spec=full), NS(kv_cache_spec=full)]))
    mixed = [NS(kv_cache_spec=spec("FullAttentionSpec", 32)), NS(kv_cache_spec=swa)]
    assert "different block sizes" in str(eagle_layout_problem(mixed))
